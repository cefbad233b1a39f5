"""Corpus files: reading Search-R1 corpus JSONL, and converting the Wikipedia summaries.

Search-R1's corpus format (its ``wiki-18.jsonl``) is one JSON object per line,
``{"id": "...", "contents": "\\"Title\\"\\ntext"}``: the title in double quotes on the first
line, the passage text after it. We also accept ``{"title", "text"}`` rows (the other common
layout) and turn them into the same ``contents`` string, so every index stores one form.
Files may be gzip-compressed (``.gz``). :func:`iter_corpus` reads a corpus once, in order;
:class:`MmapCorpus` reads any row of an uncompressed one through its memory map and an offset table
kept beside it (what the BM25 retriever's ``docs.jsonl`` and Search-R1's ``wiki-18.jsonl`` are read by).

Converter (our addition, for the embedded corpus)::

    python -m sorl_verl.retrieval.corpus summaries_en.json wiki_vital.jsonl.gz

reads the ``{title: {title, extract, description, topic}}`` JSON of Wikipedia "vital article"
lead summaries and writes Search-R1 rows plus an optional ``description`` field (the Wikidata
short description) that the index builder ignores and :mod:`sorl_verl.retrieval.quality`
uses to build questions.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import mmap
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sorl_verl.fileio import atomic_dir, atomic_file, default_cache_dir
from sorl_verl.progress import progress

try:  # installed with verl (through tensordict); json is the fallback
    import orjson
except ImportError:  # pragma: no cover - depends on the environment
    orjson = None


EMBEDDED_CORPUS = Path(__file__).resolve().parent.parent / "data" / "wiki_vital" / "wiki_vital.jsonl.gz"


class CorpusFormatError(ValueError):
    """A corpus line that is not a valid document; the message names file, line and field."""


@dataclass(frozen=True)
class Document:
    id: str
    contents: str


def format_contents(title: str, text: str) -> str:
    """Search-R1's ``contents`` string: ``"Title"`` on the first line, the text after it."""
    return f'"{title}"\n{text}'


def split_contents(contents: str) -> tuple[str, str]:
    """Inverse of :func:`format_contents`: ``(title, text)``; the title loses its quotes."""
    title, _, text = contents.partition("\n")
    return title.strip().strip('"'), text


def open_text(path: str | Path, mode: str = "rt"):
    """Open a text file, transparently gunzipping ``*.gz``."""
    path = Path(path)
    if path.suffix == ".gz":
        return gzip.open(path, mode, encoding="utf-8")
    return open(path, mode, encoding="utf-8")


def _row_to_document(row: object, where: str, row_index: int) -> Document:
    if not isinstance(row, dict):
        raise CorpusFormatError(f"{where}: expected a JSON object, got {type(row).__name__}")
    raw_id = row.get("id", row_index)
    if isinstance(raw_id, bool) or not isinstance(raw_id, (str, int)):
        raise CorpusFormatError(f"{where}: field 'id' must be a string or an integer, got {type(raw_id).__name__}")
    if "contents" in row:
        contents = row["contents"]
        if not isinstance(contents, str):
            raise CorpusFormatError(f"{where}: field 'contents' must be a string, got {type(contents).__name__}")
    elif "title" in row or "text" in row:
        for field in ("title", "text"):
            if field not in row:
                raise CorpusFormatError(
                    f"{where}: missing field {field!r} (rows need 'contents' or 'title' and 'text')"
                )
            if not isinstance(row[field], str):
                raise CorpusFormatError(f"{where}: field {field!r} must be a string, got {type(row[field]).__name__}")
        contents = format_contents(row["title"], row["text"])
    else:
        raise CorpusFormatError(f"{where}: missing field 'contents' (or both 'title' and 'text')")
    return Document(id=str(raw_id), contents=contents)


def embedded_corpus_path() -> Path:
    """The shipped corpus: ~10k English Wikipedia vital-article summaries (CC BY-SA 4.0),
    Search-R1 JSONL, gzip-compressed. See ``sorl_verl/data/wiki_vital/ATTRIBUTION.md``."""
    if not EMBEDDED_CORPUS.is_file():
        raise FileNotFoundError(f"embedded corpus missing: {EMBEDDED_CORPUS} (reinstall sorl-verl)")
    return EMBEDDED_CORPUS


def iter_corpus(path: str | Path, show_progress: bool = False) -> Iterator[Document]:
    """Yield the documents of a corpus JSONL file (``.jsonl`` or ``.jsonl.gz``), validated.

    A row without ``id`` gets its 0-based row number as id. Blank lines are skipped.
    Raises :class:`CorpusFormatError` (naming the file, the 1-based line and the field) for
    invalid JSON, a missing or mistyped field, or a duplicate id.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file not found: {path}")
    seen: dict[str, int] = {}
    row_index = 0
    with open_text(path) as f:
        for line_number, line in enumerate(
            progress(f, desc=f"read {path.name}", unit=" docs", disable=not show_progress), 1
        ):
            if not line.strip():
                continue
            where = f"{path}:{line_number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise CorpusFormatError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
            doc = _row_to_document(row, where, row_index)
            if doc.id in seen:
                raise CorpusFormatError(f"{where}: field 'id' = {doc.id!r} duplicates line {seen[doc.id]}")
            seen[doc.id] = line_number
            row_index += 1
            yield doc
    if row_index == 0:
        raise CorpusFormatError(f"{path}: the corpus has no documents")


OFFSETS_FORMAT = "sorl_verl.corpus_offsets"
OFFSETS_VERSION = 1
OFFSETS_SUFFIX = ".offsets"  # the table of wiki-18.jsonl is the folder wiki-18.jsonl.offsets/
_DIGEST_BYTES = 1 << 20  # the table records digests of the corpus's first and last MiB
_SCAN_BYTES = 1 << 26  # newline scan window (64 MiB)
_SHORT_LINE = 16  # lines this short are checked for being whitespace only (skipped, like blank lines)


def corpus_fingerprint(path: Path) -> dict:
    """Size and digests of the first and last MiB: what identifies a corpus file cheaply."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = hashlib.sha256(f.read(_DIGEST_BYTES)).hexdigest()
        f.seek(max(0, size - _DIGEST_BYTES))
        tail = hashlib.sha256(f.read(_DIGEST_BYTES)).hexdigest()
    return {"corpus_size": size, "head_sha256": head, "tail_sha256": tail}


def write_offsets_meta(table: Path, corpus: str, num_rows: int, fingerprint: dict) -> None:
    """Write ``table/meta.json``, what an offset table was built from: ``corpus`` as recorded (a path,
    or a name relative to the table's folder), its ``num_rows`` rows and its :func:`corpus_fingerprint`,
    which :class:`MmapCorpus` compares before it uses the table."""
    meta = {
        "format": OFFSETS_FORMAT,
        "format_version": OFFSETS_VERSION,
        "corpus": corpus,
        "num_rows": int(num_rows),
        **fingerprint,
    }
    (table / "meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")


def _offsets_dir_candidates(corpus: Path) -> list[Path]:
    """Beside the corpus, then the cache (keyed by the corpus's path): a table is looked for in both,
    and built in the first whose folder is writable."""
    key = hashlib.sha256(str(corpus.resolve()).encode()).hexdigest()[:12]
    return [
        corpus.with_name(corpus.name + OFFSETS_SUFFIX),
        default_cache_dir() / "corpus_offsets" / f"{corpus.name}-{key}{OFFSETS_SUFFIX}",
    ]


def scan_rows(path: Path, show_progress: bool = True) -> np.ndarray:
    """``(num_rows, 2)`` int64 ``[start, end)`` byte spans of the non-blank lines of ``path``
    (``end`` excludes the newline and a ``\\r`` before it). Vectorised over 64 MiB windows."""
    data = np.memmap(path, dtype=np.uint8, mode="r") if path.stat().st_size else np.zeros(0, np.uint8)
    size = len(data)
    newlines = []
    with progress(
        total=size, unit="B", unit_scale=True, desc=f"index rows of {path.name}", disable=not show_progress
    ) as bar:
        for start in range(0, size, _SCAN_BYTES):
            window = data[start : start + _SCAN_BYTES]
            newlines.append(np.flatnonzero(window == 10).astype(np.int64) + start)
            bar.update(len(window))
    nl = np.concatenate(newlines) if newlines else np.zeros(0, np.int64)
    starts = np.concatenate([[0], nl + 1]).astype(np.int64)
    ends = np.concatenate([nl, [size]]).astype(np.int64)
    crlf = ends > starts
    crlf[crlf] = data[ends[crlf] - 1] == 13
    ends -= crlf
    keep = ends > starts
    short = np.flatnonzero(keep & (ends - starts < _SHORT_LINE))
    for i in short:  # a handful at most: drop whitespace-only lines
        if not bytes(data[starts[i] : ends[i]]).strip():
            keep[i] = False
    del data
    return np.stack([starts[keep], ends[keep]], axis=1)


class MmapCorpus:
    """Read-only random access to the rows of a corpus JSONL file, without loading it.

    ``corpus[i]`` is row ``i`` (0-based, blank lines not counted) as ``{"id", "contents"}``; rows
    ``{"title", "text"}`` become Search-R1's ``contents`` (see :mod:`sorl_verl.retrieval.corpus`).
    The file is memory-mapped; the offset table (``(num_rows, 2)`` int64 byte spans,
    ``offsets.npy``, also memory-mapped) lives in ``offsets_dir`` (default: ``<corpus>.offsets``
    beside the corpus, or the cache when the table is not beside it and that folder is read-only),
    is written atomically with a
    ``meta.json`` recording the corpus's size and the digests of its first and last MiB, and is
    rebuilt when they no longer match. The first and last rows are checked on opening (a last
    row cut short means a truncated file); any other row is checked when read.

    Raises :class:`CorpusFormatError` naming the file: gzip input (cannot be mapped), an empty
    corpus, an unparseable first/last row, or a row count other than ``expected_rows``.
    Safe to read from several threads.
    """

    def __init__(
        self,
        path: str | Path,
        offsets_dir: str | Path | None = None,
        expected_rows: int | None = None,
        show_progress: bool = True,
    ):
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"corpus file not found: {path}")
        if path.suffix == ".gz":
            raise CorpusFormatError(f"{path}: a gzip-compressed corpus cannot be memory-mapped; gunzip it first")
        self.path = path
        candidates = [Path(offsets_dir)] if offsets_dir is not None else _offsets_dir_candidates(path)
        self.rebuilt = False  # whether this open (re)built the offset table
        fingerprint = corpus_fingerprint(path)
        found = [c for c in candidates if self._table_matches(c, fingerprint)]
        if found:
            self.offsets_dir = found[0]
        else:
            writable = [c for c in candidates if c == candidates[-1] or os.access(c.parent, os.W_OK)]
            self.offsets_dir = writable[0]
            self._build_table(fingerprint, show_progress)
            self.rebuilt = True
        # (num_rows, 2) int64, as a plain ndarray view of the map: np.memmap's per-index Python
        # overhead was ~7 us of the ~10 us a document fetch cost.
        self._spans = np.load(self.offsets_dir / "offsets.npy", mmap_mode="r").view(np.ndarray)
        self._num_rows = len(self._spans)
        if self._num_rows == 0:
            raise CorpusFormatError(f"{path}: the corpus has no documents")
        with open(path, "rb") as f:
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        for row, which in ((0, "first"), (len(self._spans) - 1, "last")):
            try:
                self[row]
            except CorpusFormatError as e:
                hint = " (the file looks truncated)" if which == "last" else ""
                raise CorpusFormatError(f"{e}{hint}") from None
        if expected_rows is not None and expected_rows != len(self._spans):
            raise CorpusFormatError(
                f"{path}: {len(self._spans)} rows, but {expected_rows} were expected; the corpus is truncated "
                f"or is not the one the index was built from"
            )

    @staticmethod
    def _table_matches(offsets_dir: Path, fingerprint: dict) -> bool:
        meta_path = offsets_dir / "meta.json"
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return False
        expected = {"format": OFFSETS_FORMAT, "format_version": OFFSETS_VERSION, **fingerprint}
        return all(meta.get(k) == v for k, v in expected.items()) and (offsets_dir / "offsets.npy").is_file()

    def _build_table(self, fingerprint: dict, show_progress: bool) -> None:
        if self.offsets_dir.exists():
            print(
                f"{self.path} changed since its offset table {self.offsets_dir} was built; rebuilding it",
                file=sys.stderr,
            )
        spans = scan_rows(self.path, show_progress=show_progress)
        with atomic_dir(self.offsets_dir, overwrite=True) as tmp:
            np.save(tmp / "offsets.npy", spans)
            write_offsets_meta(tmp, str(self.path.resolve()), len(spans), fingerprint)

    def __len__(self) -> int:
        return len(self._spans)

    def __getitem__(self, row: int) -> dict:
        """Row ``row`` as a fresh ``{"id": str, "contents": str}``."""
        row = int(row)
        if not 0 <= row < self._num_rows:
            raise IndexError(f"{self.path}: row {row} out of range 0..{self._num_rows - 1}")
        start, end = self._spans[row].tolist()
        if end > len(self._mm):
            raise CorpusFormatError(
                f"{self.path}: row {row} (byte {start}): past the end of the file ({len(self._mm)} bytes): "
                "the file was truncated"
            )
        line = self._mm[start:end]
        try:
            # orjson: 1.2 us a 600-byte row, json.loads 3-6 us (measured). It accepts a subset of what json
            # accepts (no NaN, lone surrogate escapes, integers beyond 64 bits, BOM), with the same values.
            record = orjson.loads(line) if orjson is not None else json.loads(line)
        except ValueError:  # JSONDecodeError and UnicodeDecodeError both are: json decides, as before
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise CorpusFormatError(
                    f"{self.path}: row {row} (byte {start}): invalid JSON ({str(e)[:120]})"
                ) from None
        if type(record) is dict:  # the common row (DocsWriter's): a string id and contents, taken as they are
            doc_id, contents = record.get("id"), record.get("contents")
            if type(doc_id) is str and type(contents) is str:
                return {"id": doc_id, "contents": contents}
        doc = _row_to_document(record, f"{self.path}: row {row} (byte {start})", row)
        return {"id": doc.id, "contents": doc.contents}

    def close(self) -> None:
        self._mm.close()


def write_jsonl_atomic(rows, out_path: str | Path) -> int:
    """Write dict rows as JSONL (gzip when the name ends in ``.gz``, with a fixed mtime so the
    bytes are reproducible) through a temp file renamed into place. Returns the row count."""
    out_path = Path(out_path)
    count = 0
    with atomic_file(out_path) as tmp, open(tmp, "wb") as raw:
        if out_path.suffix == ".gz":
            binary = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9)
        else:
            binary = raw
        with io.TextIOWrapper(binary, encoding="utf-8", newline="\n") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
                count += 1
        if binary is not raw:
            binary.close()
    return count


def wiki_summaries_to_rows(summaries: dict) -> list[dict]:
    """Convert ``{title: {"title", "extract", "description", ...}}`` to corpus rows.

    Row ids are the 0-based positions in the file's order, as strings (Search-R1's ids are
    strings too). Entries without an extract are skipped.
    """
    rows = []
    for key, entry in summaries.items():
        if not isinstance(entry, dict):
            raise CorpusFormatError(f"entry {key!r}: expected an object, got {type(entry).__name__}")
        title = entry.get("title", key)
        extract = entry.get("extract")
        if not isinstance(title, str) or not isinstance(extract, str):
            raise CorpusFormatError(f"entry {key!r}: fields 'title' and 'extract' must be strings")
        if not extract.strip():
            continue
        row = {"id": str(len(rows)), "contents": format_contents(title, extract.strip())}
        description = entry.get("description")
        if isinstance(description, str) and description.strip():
            row["description"] = description.strip()
        rows.append(row)
    return rows


def convert_wiki_summaries(summaries_json: str | Path, out_path: str | Path) -> int:
    """Read the summaries JSON file and write Search-R1 corpus JSONL; returns the row count."""
    with open(summaries_json, encoding="utf-8") as f:
        try:
            summaries = json.load(f)
        except json.JSONDecodeError as e:
            raise CorpusFormatError(f"{summaries_json}: invalid JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(summaries, dict):
        raise CorpusFormatError(f"{summaries_json}: expected a JSON object {{title: summary}}")
    return write_jsonl_atomic(progress(wiki_summaries_to_rows(summaries), desc="write corpus"), out_path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m sorl_verl.retrieval.corpus",
        description="Convert Wikipedia summaries JSON ({title: {title, extract, description}}) to Search-R1 corpus JSONL.",
    )
    parser.add_argument("summaries_json", help="input JSON, e.g. summaries_en.json")
    parser.add_argument("out", help="output corpus (.jsonl or .jsonl.gz)")
    args = parser.parse_args(argv)
    try:
        count = convert_wiki_summaries(args.summaries_json, args.out)
    except (CorpusFormatError, OSError) as e:
        parser.exit(2, f"error: {e}\n")
    print(f"wrote {count} documents to {args.out}")


if __name__ == "__main__":
    main()
