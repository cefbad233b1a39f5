"""Corpus files: reading Search-R1 corpus JSONL, and converting the Wikipedia summaries.

Search-R1's corpus format (its ``wiki-18.jsonl``) is one JSON object per line,
``{"id": "...", "contents": "\\"Title\\"\\ntext"}``: the title in double quotes on the first
line, the passage text after it. We also accept ``{"title", "text"}`` rows (the other common
layout) and turn them into the same ``contents`` string, so every index stores one form.
Files may be gzip-compressed (``.gz``).

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
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sorl_verl.fileio import atomic_file
from sorl_verl.progress import progress


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
                raise CorpusFormatError(f"{where}: missing field {field!r} (rows need 'contents' or 'title' and 'text')")
            if not isinstance(row[field], str):
                raise CorpusFormatError(f"{where}: field {field!r} must be a string, got {type(row[field]).__name__}")
        contents = format_contents(row["title"], row["text"])
    else:
        raise CorpusFormatError(f"{where}: missing field 'contents' (or both 'title' and 'text')")
    return Document(id=str(raw_id), contents=contents)


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
        for line_number, line in enumerate(progress(f, desc=f"read {path.name}", unit=" docs", disable=not show_progress), 1):
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
