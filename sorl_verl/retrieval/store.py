"""Index folder layout shared by the BM25 and dense retrievers (our design).

An index folder holds::

    meta.json          {"format": "sorl_verl.retrieval", "format_version": 1, "method": "bm25"|"dense"|"pyserini",
                        "num_docs": N, "corpus": <source path>, ...method options}
    docs.jsonl         one {"id", "contents"} per line, in index order (row i = index position i)
    docs.jsonl.offsets/  the byte span of each line of docs.jsonl (``corpus.MmapCorpus``'s table:
                       ``offsets.npy`` (N, 2) int64 and its ``meta.json``), written with docs.jsonl
    ...                the method's own files (bm25s arrays and vocabulary, or a FAISS index)

``meta.json`` is written last, so a folder without it is not an index. The BM25 retriever reads
documents through the memory-mapped ``docs.jsonl`` and the offset table (:func:`open_docs`); an
index written before the table existed gets it on first load (beside ``docs.jsonl``, or in the
cache when the folder is read-only). The dense retriever still reads ``docs.jsonl`` into lists.
"""

from __future__ import annotations

import json
import shutil
from array import array
from pathlib import Path

import numpy as np

from sorl_verl.progress import progress

META_NAME = "meta.json"
DOCS_NAME = "docs.jsonl"
FORMAT_NAME = "sorl_verl.retrieval"
FORMAT_VERSION = 1
METHODS = ("bm25", "dense", "pyserini")  # pyserini: sorl_verl.retrieval.lucene


class IndexFormatError(ValueError):
    """An index folder that is missing files or was written by an incompatible version."""


def write_meta(index_dir: Path, meta: dict) -> None:
    full = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, **meta}
    (index_dir / META_NAME).write_text(json.dumps(full, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def read_meta(index_dir: str | Path) -> dict:
    index_dir = Path(index_dir)
    meta_path = index_dir / META_NAME
    if not meta_path.is_file():
        raise IndexFormatError(
            f"{index_dir} is not an index folder: {META_NAME} is missing (build one with sorl-index)"
        )
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if meta.get("format") != FORMAT_NAME or meta.get("format_version") != FORMAT_VERSION:
        raise IndexFormatError(
            f"{meta_path}: format {meta.get('format')!r} version {meta.get('format_version')!r}, "
            f"expected {FORMAT_NAME!r} version {FORMAT_VERSION}; rebuild the index"
        )
    if meta.get("method") not in METHODS:
        raise IndexFormatError(f"{meta_path}: field 'method' must be one of {METHODS}, got {meta.get('method')!r}")
    return meta


class DocsWriter:
    """Writes ``docs.jsonl`` one document at a time, and on :meth:`close` its offset table in
    :class:`~sorl_verl.retrieval.corpus.MmapCorpus`'s layout (``docs.jsonl.offsets/``), so that
    opening the index needs no scan. Memory: a 16 MiB span buffer; the spans go to a scratch file
    as they are made. Use as a context manager; on an exception the files are left for the
    caller's temporary folder to remove."""

    _FLUSH_VALUES = 1 << 21  # int64 values (start, end pairs) buffered before a write

    def __init__(self, index_dir: Path):
        self.path = Path(index_dir) / DOCS_NAME
        self._scratch = Path(index_dir) / f".{DOCS_NAME}.spans"
        self._docs = open(self.path, "wb")
        self._spans_file = open(self._scratch, "wb")
        self._spans = array("q")
        self._position = 0
        self.count = 0

    def write(self, doc_id: str, contents: str) -> None:
        line = json.dumps({"id": doc_id, "contents": contents}, ensure_ascii=False).encode("utf-8")
        self._docs.write(line + b"\n")
        self._spans.append(self._position)
        self._spans.append(self._position + len(line))
        self._position += len(line) + 1
        self.count += 1
        if len(self._spans) >= self._FLUSH_VALUES:
            self._spans.tofile(self._spans_file)
            del self._spans[:]

    def close(self) -> None:
        """Finish ``docs.jsonl`` and write ``docs.jsonl.offsets/`` (``offsets.npy`` + ``meta.json``)."""
        # Imported here, not at the top: the package imports this module, and
        # ``python -m sorl_verl.retrieval.corpus`` must not find corpus imported already.
        from sorl_verl.retrieval.corpus import OFFSETS_SUFFIX, corpus_fingerprint, write_offsets_meta

        self._spans.tofile(self._spans_file)
        self._spans_file.close()
        self._docs.close()
        table = self.path.with_name(self.path.name + OFFSETS_SUFFIX)
        table.mkdir()
        with open(table / "offsets.npy", "wb") as out, open(self._scratch, "rb") as spans:
            np.lib.format.write_array_header_1_0(
                out, {"descr": "<i8", "fortran_order": False, "shape": (self.count, 2)}
            )
            shutil.copyfileobj(spans, out, 1 << 22)
        self._scratch.unlink()
        write_offsets_meta(table, DOCS_NAME, self.count, corpus_fingerprint(self.path))

    def __enter__(self) -> DocsWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self._spans_file.close()
            self._docs.close()


def write_docs(index_dir: Path, ids: list[str], contents: list[str]) -> None:
    with DocsWriter(index_dir) as writer:
        for doc_id, text in zip(ids, contents, strict=True):
            writer.write(doc_id, text)


def open_docs(index_dir: Path, num_docs: int, show_progress: bool = True):
    """``docs.jsonl`` memory-mapped (:class:`~sorl_verl.retrieval.corpus.MmapCorpus`): ``docs[i]`` is a
    fresh ``{"id", "contents"}``; nothing is loaded. Raises :class:`IndexFormatError` when the file is
    missing or its row count is not ``num_docs``."""
    from sorl_verl.retrieval.corpus import CorpusFormatError, MmapCorpus  # here: see DocsWriter.close

    path = Path(index_dir) / DOCS_NAME
    if not path.is_file():
        raise IndexFormatError(f"{path} is missing; rebuild the index with sorl-index")
    try:
        return MmapCorpus(path, expected_rows=num_docs, show_progress=show_progress and num_docs >= 200_000)
    except CorpusFormatError as e:
        raise IndexFormatError(f"{e}; meta.json says {num_docs} documents: rebuild the index") from None


def read_docs(index_dir: Path, num_docs: int) -> tuple[list[str], list[str]]:
    """Return ``(ids, contents)`` lists, each of length ``num_docs``."""
    ids: list[str] = []
    contents: list[str] = []
    with open(index_dir / DOCS_NAME, encoding="utf-8") as f:
        for line in progress(f, total=num_docs, desc="load docs", unit=" docs", disable=num_docs < 200_000):
            row = json.loads(line)
            ids.append(row["id"])
            contents.append(row["contents"])
    if len(ids) != num_docs:
        raise IndexFormatError(f"{index_dir / DOCS_NAME}: {len(ids)} documents, meta.json says {num_docs}")
    return ids, contents


def make_hits(ids: list[str], contents: list[str], rows, scores) -> list[dict]:
    """Search-R1 hits ``[{"document": {"id", "contents"}, "score"}]`` for index rows (fresh dicts)."""
    return [
        {"document": {"id": ids[row], "contents": contents[row]}, "score": float(score)}
        for row, score in zip(rows, scores, strict=True)
    ]
