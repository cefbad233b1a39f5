"""Row format, input readers with located errors, deterministic subsets, atomic parquet writes, CLI plumbing.

Every family writes the same parquet schema (:data:`SCHEMA`), because verl concatenates its
``data.train_files`` with ``datasets.concatenate_datasets``, which refuses files whose columns or
nested fields differ: one schema is what lets a run mix QA, medical and math rows.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import random
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from sorl_verl.fileio import atomic_file

SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("agent_name", pa.string()),
        ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
        ("ability", pa.string()),
        (
            "reward_model",
            pa.struct([("style", pa.string()), ("ground_truth", pa.struct([("target", pa.list_(pa.string()))]))]),
        ),
        (
            "extra_info",
            pa.struct(
                [
                    ("split", pa.string()),
                    ("index", pa.int64()),
                    ("question", pa.string()),  # the raw question / problem
                    ("retrieval_query", pa.string()),  # what a one-shot retriever should search: the question only
                    ("choices", pa.list_(pa.string())),  # option texts in letter order; empty when not multiple choice
                    ("source_id", pa.string()),  # the id in the source file ("" when it has none)
                    ("subject", pa.string()),  # e.g. the MMLU subject; "" when none
                    # a reward name of reward_fns (e.g. "qa_em") overriding the router's choice by
                    # data_source; "" = by data_source. Used by sources the router does not know
                    # (the quick start's sorl_quickstart). Added after the first release: older
                    # files lack it, so regenerate them before mixing with new ones.
                    ("reward_fn", pa.string()),
                ]
            ),
        ),
    ]
)
SEARCH_AGENT = "search_r1"  # the agent loop registered by sorl_verl.agent
SINGLE_TURN_AGENT = "single_turn_agent"  # verl's built-in one-turn loop
# MIRAGE's MMLU-Med: the six MMLU subjects it keeps (data_prep.medical reads their files,
# data_prep.hub exports them from the hub's per-subject configs).
MMLU_MED_SUBJECTS = (
    "anatomy",
    "clinical_knowledge",
    "college_biology",
    "college_medicine",
    "medical_genetics",
    "professional_medicine",
)


class DataPrepError(ValueError):
    """Bad input; the message names the file, the line (or entry) and the field."""


def located(path: Path | str, where: str, field: str, problem: str) -> DataPrepError:
    return DataPrepError(f"{path}: {where}: field '{field}': {problem}")


def make_row(
    *,
    data_source: str,
    agent_name: str,
    content: str,
    ability: str,
    targets: Sequence[str],
    split: str,
    index: int,
    question: str,
    retrieval_query: str = "",
    choices: Sequence[str] = (),
    source_id: str = "",
    subject: str = "",
    reward_fn: str = "",
) -> dict:
    """One verl row in our format: a single user message and a rule reward with ``{"target": [...]}``."""
    return {
        "data_source": data_source,
        "agent_name": agent_name,
        "prompt": [{"role": "user", "content": content}],
        "ability": ability,
        "reward_model": {"style": "rule", "ground_truth": {"target": [str(t) for t in targets]}},
        "extra_info": {
            "split": split,
            "index": int(index),
            "question": question,
            "retrieval_query": retrieval_query,
            "choices": [str(c) for c in choices],
            "source_id": str(source_id),
            "subject": subject,
            "reward_fn": reward_fn,
        },
    }


def require_file(path: Path) -> Path:
    if not path.is_file():
        raise DataPrepError(f"{path}: file not found")
    return path


def _read_text(path: Path) -> str:
    """The file as UTF-8 text; unreadable or invalid UTF-8 is a located error."""
    require_file(path)
    try:
        data = path.read_bytes()
    except OSError as error:
        raise DataPrepError(f"{path}: cannot read ({error.strerror or error})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise DataPrepError(f"{path}: line {line}: not valid UTF-8 (byte 0x{data[error.start]:02x})") from None


def _parse_json(text: str, path: Path, where: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise DataPrepError(f"{path}: {where}: malformed JSON ({error.msg})") from None
    except RecursionError:
        raise DataPrepError(f"{path}: {where}: malformed JSON (nested too deeply)") from None
    except ValueError as error:  # e.g. an integer longer than Python's 4300-digit limit
        raise DataPrepError(f"{path}: {where}: malformed JSON ({str(error)[:120]})") from None


def _surrogate_field(value, name: str = "") -> str | None:
    """The dotted name of the first string in ``value`` holding a lone surrogate, else None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return name or "(value)"
        return None
    if isinstance(value, dict):
        items = ((f"{name}.{key}" if name else str(key), item) for key, item in value.items())
    elif isinstance(value, list):
        items = ((f"{name}[{index}]", item) for index, item in enumerate(value))
    else:
        return None
    for item_name, item in items:
        found = _surrogate_field(item, item_name)
        if found is not None:
            return found
    return None


def check_unicode(record, path: Path, where: str) -> None:
    """A located error if any string of ``record`` holds a lone surrogate (parquet stores UTF-8 only)."""
    field = _surrogate_field(record)
    if field is not None:
        raise located(path, where, field, "contains a lone surrogate (an escaped \\ud800-\\udfff alone), not text")


def read_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` for every non-blank line; a malformed line raises naming the file and line."""
    # split("\n"), not splitlines(): JSON strings may hold U+2028 and other characters splitlines breaks at.
    for line_number, line in enumerate(_read_text(path).split("\n"), start=1):
        if not line.strip():
            continue
        where = f"line {line_number}"
        record = _parse_json(line, path, where)
        if not isinstance(record, dict):
            raise DataPrepError(f"{path}: {where}: expected a JSON object, got {type(record).__name__}")
        check_unicode(record, path, where)
        yield line_number, record


def read_json(path: Path):
    text = _read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise DataPrepError(f"{path}: line {error.lineno}: malformed JSON ({error.msg})") from None
    except RecursionError:
        raise DataPrepError(f"{path}: malformed JSON (nested too deeply)") from None
    except ValueError as error:
        raise DataPrepError(f"{path}: malformed JSON ({str(error)[:120]})") from None


def read_csv_rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """``(line number where the record starts, fields)``; quoted fields may span lines."""
    reader = csv.reader(io.StringIO(_read_text(path), newline=""))
    start = 1
    try:
        for fields in reader:
            yield start, fields
            start = reader.line_num + 1
    except csv.Error as error:
        raise DataPrepError(f"{path}: line {start}: malformed CSV ({error})") from None


def require_records(items: Sequence, path: Path) -> Sequence:
    """``items``, or a located error when the input held none (an empty file is a mistake, not a data set)."""
    if not items:
        raise DataPrepError(f"{path}: no records (the input is empty)")
    return items


def text_answer(value, path: Path, where: str, field: str) -> str:
    """A gold answer that is a non-empty string; booleans, null, numbers and NaN are refused."""
    if not isinstance(value, str):
        raise located(path, where, field, f"expected a non-empty string answer, got {type(value).__name__} {value!r:.40}")
    if not value.strip():
        raise located(path, where, field, "empty answer")
    return value


def read_parquet_records(path: Path) -> list[dict]:
    require_file(path)
    try:
        return pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError) as error:
        raise DataPrepError(f"{path}: not a readable parquet file ({error})") from None


def read_records(path: Path) -> Iterator[tuple[str, dict]]:
    """``(location, record)`` from a ``.parquet`` or ``.jsonl``/``.json`` (JSON lines) file."""
    if path.suffix == ".parquet":
        for row_number, record in enumerate(read_parquet_records(path)):
            yield f"row {row_number}", record
    else:
        for line_number, record in read_jsonl(path):
            yield f"line {line_number}", record


def required_text(record: dict, field: str, path: Path, where: str) -> str:
    """A non-empty string field, else a located error."""
    if field not in record or record[field] is None:
        raise located(path, where, field, "missing")
    value = record[field]
    if not isinstance(value, str):
        raise located(path, where, field, f"expected a string, got {type(value).__name__}")
    if not value.strip():
        raise located(path, where, field, "empty")
    return value


def select_indices(total: int, limit: int | None = None, sample: int | None = None, seed: int = 0) -> list[int]:
    """Which rows to keep: all, the first ``limit``, or ``sample`` drawn without replacement with ``seed``
    (kept in file order). The same arguments always give the same rows."""
    if limit is not None and sample is not None:
        raise DataPrepError("--limit and --sample exclude each other")
    if limit is not None:
        return list(range(min(max(limit, 0), total)))
    if sample is not None:
        return sorted(random.Random(seed).sample(range(total), min(max(sample, 0), total)))
    return list(range(total))


def write_parquet_atomic(rows: list[dict], output: Path) -> Path:
    """Write ``rows`` with :data:`SCHEMA` to a temp file beside ``output``, then rename it over ``output``.

    A failure (bad row, full disk, interrupt) leaves no partial file, and an existing ``output`` untouched.
    No rows, an output that is a folder, or one that cannot be written is a :class:`DataPrepError`.
    """
    output = Path(output)
    if not rows:
        raise DataPrepError(f"{output}: no rows to write (nothing was selected from the input)")
    if output.is_dir():
        raise DataPrepError(f"{output}: is a directory; give a .parquet file path")
    table = pa.Table.from_pylist(rows, schema=SCHEMA)
    try:
        with atomic_file(output) as temp_path:
            pq.write_table(table, temp_path)
    except OSError as error:
        raise DataPrepError(f"{output}: cannot write ({error.strerror or error})") from None
    return output


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def add_subset_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("quick runs (applied to each data set separately)")
    group.add_argument("--limit", type=_at_least_one, default=None, metavar="N", help="keep the first N rows")
    group.add_argument("--sample", type=_at_least_one, default=None, metavar="N", help="keep N random rows (see --seed)")
    group.add_argument("--seed", type=int, default=0, help="seed for --sample (default: 0)")


def run_cli(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """Run a CLI entry point; bad input prints one ``error:`` line to stderr and exits 2."""
    try:
        return main(argv)
    except DataPrepError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def parse_input(spec: str) -> tuple[str, Path]:
    """``--input NAME=PATH`` (argparse ``type``): ``(data_source, path)``."""
    name, sep, path = spec.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {spec!r}")
    return name, Path(path)
