"""Index folder layout shared by the BM25 and dense retrievers (our design).

An index folder holds::

    meta.json     {"format": "sorl_verl.retrieval", "format_version": 1, "method": "bm25"|"dense",
                   "num_docs": N, "corpus": <source path>, ...method options}
    docs.jsonl    one {"id", "contents"} per line, in index order (row i = index position i)
    ...           the method's own files (bm25s arrays and vocabulary, or a FAISS index)

``meta.json`` is written last, so a folder without it is not an index.
"""

from __future__ import annotations

import json
from pathlib import Path

from tqdm.auto import tqdm

META_NAME = "meta.json"
DOCS_NAME = "docs.jsonl"
FORMAT_NAME = "sorl_verl.retrieval"
FORMAT_VERSION = 1


class IndexFormatError(ValueError):
    """An index folder that is missing files or was written by an incompatible version."""


def write_meta(index_dir: Path, meta: dict) -> None:
    full = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, **meta}
    (index_dir / META_NAME).write_text(json.dumps(full, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def read_meta(index_dir: str | Path) -> dict:
    index_dir = Path(index_dir)
    meta_path = index_dir / META_NAME
    if not meta_path.is_file():
        raise IndexFormatError(f"{index_dir} is not an index folder: {META_NAME} is missing (build one with sorl-index)")
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if meta.get("format") != FORMAT_NAME or meta.get("format_version") != FORMAT_VERSION:
        raise IndexFormatError(
            f"{meta_path}: format {meta.get('format')!r} version {meta.get('format_version')!r}, "
            f"expected {FORMAT_NAME!r} version {FORMAT_VERSION}; rebuild the index"
        )
    if meta.get("method") not in ("bm25", "dense"):
        raise IndexFormatError(f"{meta_path}: field 'method' must be 'bm25' or 'dense', got {meta.get('method')!r}")
    return meta


def write_docs(index_dir: Path, ids: list[str], contents: list[str]) -> None:
    with open(index_dir / DOCS_NAME, "w", encoding="utf-8") as f:
        for doc_id, text in zip(ids, contents, strict=True):
            f.write(json.dumps({"id": doc_id, "contents": text}, ensure_ascii=False) + "\n")


def read_docs(index_dir: Path, num_docs: int) -> tuple[list[str], list[str]]:
    """Return ``(ids, contents)`` lists, each of length ``num_docs``."""
    ids: list[str] = []
    contents: list[str] = []
    with open(index_dir / DOCS_NAME, encoding="utf-8") as f:
        for line in tqdm(f, total=num_docs, desc="load docs", unit=" docs", disable=num_docs < 200_000):
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
