"""MIRAGE's medical multiple-choice sets to verl parquet: MedQA-US, MedMCQA (dev), PubMedQA*, MMLU-Med.

The benchmark is MIRAGE's (Xiong et al., 2024): zero-shot multiple choice, retrieval with the question
only (never the options), accuracy. Each row's prompt renders the options (:data:`data_prep.templates.MEDICAL`,
our template), ``extra_info.retrieval_query`` is the question alone, ``extra_info.choices`` the option
texts, and the gold is a letter: ``ground_truth={"target": ["B"]}``; ``ability="medical-mcqa"``.

Raw files, as MIRAGE ships them (``--mirage-dir`` holds these sub-folders):

============  =====================================  ==================================================
data_source   file                                   fields
============  =====================================  ==================================================
medqa         ``medqa/US_4options_test.jsonl``       ``question``, ``options{A..D}``, ``answer_idx``
medmcqa       ``medmcqa/dev.json`` (JSON lines)      ``question``, ``opa..opd``, ``cop`` (1-based)
pubmedqa      ``pubmedqa/test_set.json``             ``{pmid: {QUESTION, final_decision}}``;
                                                     contexts dropped (PubMedQA*); A=yes, B=no, C=maybe
mmlu_med      ``mmlu_med/{subject}_test.csv``        no header: question, A, B, C, D, answer letter;
                                                     the six subjects in :data:`MMLU_MED_SUBJECTS`
============  =====================================  ==================================================

The PubMedQA* letter mapping (A=yes, B=no, C=maybe) is MIRAGE's. ``mmlu_med`` rows carry their subject
in ``extra_info.subject``.

Example::

    python -m data_prep.medical --mirage-dir ../shared/data/mirage --output-dir data/medical
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator, Sequence
from pathlib import Path

from data_prep._common import (
    MMLU_MED_SUBJECTS,
    SEARCH_AGENT,
    DataPrepError,
    add_subset_args,
    check_unicode,
    located,
    make_row,
    read_csv_rows,
    read_json,
    read_jsonl,
    require_records,
    required_text,
    run_cli,
    select_indices,
    write_parquet_atomic,
)
from data_prep.templates import options_block_error, render_medical
from sorl_verl.progress import progress

ABILITY = "medical-mcqa"
LETTERS = "ABCD"
PUBMEDQA_LETTERS = {"yes": "A", "no": "B", "maybe": "C"}
DATASETS = ("medqa", "medmcqa", "pubmedqa", "mmlu_med")
SPLITS = {"medqa": "test", "medmcqa": "dev", "pubmedqa": "test", "mmlu_med": "test"}

# One parsed question: (question, option texts in letter order, gold letter, source id, subject).
Item = tuple[str, list[str], str, str, str]


def read_medqa(path: Path) -> Iterator[Item]:
    for line_number, record in read_jsonl(path):
        where = f"line {line_number}"
        question = required_text(record, "question", path, where)
        options = record.get("options")
        if not isinstance(options, dict) or not options:
            raise located(path, where, "options", "missing or not an object of letter -> text")
        letters = sorted(options)
        if "".join(letters) != "ABCDEFGHIJ"[: len(letters)]:
            raise located(path, where, "options", f"letters {letters} are not A, B, C, ...")
        choices = [required_text(options, letter, path, where + " options") for letter in letters]
        choices = check_options(choices, letters, path, where, "options.")
        answer = record.get("answer_idx")
        if not isinstance(answer, str) or answer not in options:
            raise located(path, where, "answer_idx", f"{answer!r} is not one of the options {letters}")
        yield question, choices, answer, "", ""


def check_options(choices: list[str], fields: Sequence[str], path: Path, where: str, prefix: str = "") -> list[str]:
    """The option texts with line breaks made spaces (MedQA's export has options ending in a line break and a
    stray quote), or a located error (file, row, field) for one the prompt's options block cannot show as
    itself (an empty text): the reward reads the options the row carries, the model those the prompt shows."""
    choices = [" ".join(c.split()) if ("\n" in c or "\r" in c) else c for c in choices]
    error = options_block_error(choices)
    if error is not None:
        index, why = error
        raise located(path, where, f"{prefix}{fields[index]}", why)
    return choices


def read_medmcqa(path: Path) -> Iterator[Item]:
    for line_number, record in read_jsonl(path):
        where = f"line {line_number}"
        question = required_text(record, "question", path, where)
        choices = []
        for field in ("opa", "opb", "opc", "opd"):
            value = record.get(field)
            if value is None:
                raise located(path, where, field, "missing")
            if isinstance(value, bool) or not isinstance(value, (str, int, float)) or (
                isinstance(value, float) and not math.isfinite(value)
            ):
                raise located(path, where, field, f"expected option text, got {type(value).__name__} {value!r:.40}")
            choices.append(str(value))
        choices = check_options(choices, ("opa", "opb", "opc", "opd"), path, where)
        cop = record.get("cop")
        if not isinstance(cop, int) or isinstance(cop, bool) or not 1 <= cop <= 4:
            raise located(path, where, "cop", f"answer index {cop!r} out of range 1..4")
        yield question, choices, LETTERS[cop - 1], str(record.get("id", "")), str(record.get("subject_name") or "")


def read_pubmedqa(path: Path) -> Iterator[Item]:
    data = read_json(path)
    if not isinstance(data, dict):
        raise DataPrepError(f"{path}: expected an object {{pmid: entry}}, got {type(data).__name__}")
    choices = list(PUBMEDQA_LETTERS)  # yes, no, maybe
    for pmid, record in data.items():
        where = f"entry {pmid}"
        if not isinstance(record, dict):
            raise located(path, where, "QUESTION", "entry is not an object")
        check_unicode(record, path, where)
        question = required_text(record, "QUESTION", path, where)
        decision = record.get("final_decision")
        if not isinstance(decision, str) or decision not in PUBMEDQA_LETTERS:
            raise located(path, where, "final_decision", f"{decision!r} is not yes/no/maybe")
        yield question, choices, PUBMEDQA_LETTERS[decision], str(pmid), ""


def read_mmlu_subject(path: Path, subject: str) -> Iterator[Item]:
    for line_number, fields in read_csv_rows(path):
        where = f"line {line_number}"
        if len(fields) != 6:
            raise located(path, where, "columns", f"expected 6 (question, A, B, C, D, answer), got {len(fields)}")
        question, *choices, answer = fields
        if not question.strip():
            raise located(path, where, "question", "empty")
        if answer.strip() not in LETTERS:
            raise located(path, where, "answer", f"{answer!r} is not one of A, B, C, D")
        choices = check_options(choices, LETTERS, path, where, "column ")
        yield question, choices, answer.strip(), "", subject


def read_dataset(name: str, mirage_dir: Path) -> list[Item]:
    """Every item of one data set; an input file without items is an error naming it."""
    if name == "medqa":
        path = mirage_dir / "medqa" / "US_4options_test.jsonl"
        return list(require_records(list(read_medqa(path)), path))
    if name == "medmcqa":
        path = mirage_dir / "medmcqa" / "dev.json"
        return list(require_records(list(read_medmcqa(path)), path))
    if name == "pubmedqa":
        path = mirage_dir / "pubmedqa" / "test_set.json"
        return list(require_records(list(read_pubmedqa(path)), path))
    if name == "mmlu_med":
        items = []
        for subject in MMLU_MED_SUBJECTS:
            path = mirage_dir / "mmlu_med" / f"{subject}_test.csv"
            items.extend(require_records(list(read_mmlu_subject(path, subject)), path))
        return items
    raise DataPrepError(f"unknown medical data set {name!r}; choose from {', '.join(DATASETS)}")


def convert(
    name: str,
    mirage_dir: Path,
    agent_name: str = SEARCH_AGENT,
    limit: int | None = None,
    sample: int | None = None,
    seed: int = 0,
) -> list[dict]:
    """Rows of one MIRAGE data set."""
    items = read_dataset(name, Path(mirage_dir))
    rows = []
    for index, position in enumerate(progress(select_indices(len(items), limit, sample, seed), desc=name, leave=False)):
        question, choices, letter, source_id, subject = items[position]
        rows.append(
            make_row(
                data_source=name,
                agent_name=agent_name,
                content=render_medical(question, choices),
                ability=ABILITY,
                targets=[letter],
                split=SPLITS[name],
                index=index,
                question=question.strip(),
                retrieval_query=question.strip(),
                choices=choices,
                source_id=source_id,
                subject=subject,
            )
        )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m data_prep.medical",
        description="MIRAGE medical multiple choice (MedQA, MedMCQA, PubMedQA*, MMLU-Med) -> verl parquet, "
        "one file per data set: OUTPUT_DIR/<name>.parquet.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--mirage-dir", type=Path, help="folder with medqa/ medmcqa/ pubmedqa/ mmlu_med/")
    source.add_argument("--hf", action="store_true",
                        help="the sets' public copies on the Hugging Face hub, through datasets (see data_prep.hub)")
    parser.add_argument("--hf-repo", action="append", metavar="NAME=REPO",
                        help="with --hf: another repo or a local folder in the hub's layout for data set NAME (repeatable)")
    parser.add_argument("--output-dir", type=Path, required=True)
    parser.add_argument(
        "--datasets", default=",".join(DATASETS), help=f"comma-separated subset of {','.join(DATASETS)} (default: all)"
    )
    parser.add_argument("--agent-name", default=SEARCH_AGENT, help=f"agent loop per row (default: {SEARCH_AGENT})")
    add_subset_args(parser)
    args = parser.parse_args(argv)
    names = [name.strip() for name in args.datasets.split(",") if name.strip()]
    for name in names:
        if name not in DATASETS:
            raise DataPrepError(f"unknown medical data set {name!r}; choose from {', '.join(DATASETS)}")
    mirage_dir = args.mirage_dir
    if args.hf_repo and not args.hf:
        parser.error("--hf-repo goes with --hf")
    if args.hf:
        from data_prep import hub

        mirage_dir = hub.fetch_medical(names, hub.parse_repo_overrides(args.hf_repo, DATASETS))
    for name in names:
        rows = convert(name, mirage_dir, args.agent_name, args.limit, args.sample, args.seed)
        output = write_parquet_atomic(rows, args.output_dir / f"{name}.parquet")
        print(f"wrote {len(rows)} rows to {output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
