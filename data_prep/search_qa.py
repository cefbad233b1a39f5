"""Search-R1 QA sets to verl parquet: nq, triviaqa, popqa, hotpotqa, 2wikimultihopqa, musique, bamboogle.

Reproduces Search-R1's ``scripts/data_process/qa_search_train_merge.py`` / ``qa_search_test_merge.py``
(PeterGriffinJin/Search-R1) on local files instead of the HF hub: per data set, each question becomes
one row with Search-R1's prompt (:data:`data_prep.templates.SEARCH_R1`), ``data_source`` = the set's
name, ``ability="fact-reasoning"``, ``ground_truth={"target": golden_answers}``, ``extra_info.index`` =
position within its set; the sets are concatenated in the order given. Search-R1's training mix is
``--input nq=... --input hotpotqa=... --split train`` (their train files); the test mix is the seven sets'
test (or dev) files with ``--split test``.

Inputs are JSON lines, either FlashRAG's ``{"id", "question", "golden_answers": [...]}`` (what Search-R1
loads from ``RUC-NLPIR/FlashRAG_datasets``) or NQ-Open's ``{"question", "answer": [...]}``.

Example::

    python -m data_prep.search_qa --input nq=../shared/data/nq_open/NQ-open.dev.jsonl --split test \\
        --output data/search_r1/nq_test.parquet
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from data_prep._common import (
    SEARCH_AGENT,
    DataPrepError,
    add_subset_args,
    located,
    make_row,
    parse_input,
    read_jsonl,
    require_records,
    required_text,
    run_cli,
    select_indices,
    text_answer,
    write_parquet_atomic,
)
from data_prep.templates import render_search_r1, search_r1_question
from sorl_verl.progress import progress

DATA_SOURCES = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
ABILITY = "fact-reasoning"  # Search-R1's value


def read_qa_file(path: Path) -> list[dict]:
    """``[{"question", "answers", "id"}]`` from a FlashRAG or NQ-Open JSONL file, validated row by row."""
    records = []
    for line_number, record in read_jsonl(path):
        where = f"line {line_number}"
        question = required_text(record, "question", path, where)
        field = "golden_answers" if "golden_answers" in record else "answer"
        if field not in record or record[field] is None:
            raise located(path, where, "golden_answers", "missing (expected 'golden_answers' or NQ-Open's 'answer')")
        answers = record[field]
        if isinstance(answers, str):
            answers = [answers]
        if not isinstance(answers, list):
            raise located(path, where, field, "expected a list of strings")
        if not answers:
            raise located(path, where, field, "no answer")
        answers = [text_answer(answer, path, where, f"{field}[{i}]") for i, answer in enumerate(answers)]
        records.append({"question": question, "answers": answers, "id": str(record.get("id", ""))})
    return list(require_records(records, path))


def convert(
    inputs: Sequence[tuple[str, Path]],
    split: str,
    agent_name: str = SEARCH_AGENT,
    limit: int | None = None,
    sample: int | None = None,
    seed: int = 0,
) -> list[dict]:
    """Rows for ``[(data_source, path), ...]``, concatenated in order."""
    rows = []
    for data_source, path in inputs:
        if data_source not in DATA_SOURCES:
            raise DataPrepError(f"unknown data source {data_source!r} for {path}; choose from {', '.join(DATA_SOURCES)}")
        records = read_qa_file(Path(path))
        keep = select_indices(len(records), limit, sample, seed)
        for index, position in enumerate(progress(keep, desc=data_source, unit="q", leave=False)):
            record = records[position]
            question = search_r1_question(record["question"])
            rows.append(
                make_row(
                    data_source=data_source,
                    agent_name=agent_name,
                    content=render_search_r1(record["question"]),
                    ability=ABILITY,
                    targets=record["answers"],
                    split=split,
                    index=index,
                    question=question,
                    retrieval_query=question,
                    source_id=record["id"],
                )
            )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m data_prep.search_qa",
        description="Search-R1 QA JSONL (FlashRAG or NQ-Open format) -> verl parquet with Search-R1's prompt.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--input",
        action="append",
        type=parse_input,
        metavar="NAME=PATH",
        help=f"a data set and its JSONL file; repeat to build a mix. NAME is one of {', '.join(DATA_SOURCES)}",
    )
    source.add_argument(
        "--hf",
        metavar="NAME,...",
        help="data sets by name from the Hugging Face hub through datasets (FlashRAG's, as Search-R1 loads them; "
        "see data_prep.hub), e.g. nq,hotpotqa",
    )
    parser.add_argument("--hf-repo", default=None, help="with --hf: another repo, or a local folder in the hub's layout "
                        "(default RUC-NLPIR/FlashRAG_datasets)")
    parser.add_argument("--split", required=True, help="written to extra_info.split (Search-R1: train or test)")
    parser.add_argument("--output", type=Path, required=True, help="parquet file to write (atomically)")
    parser.add_argument("--agent-name", default=SEARCH_AGENT, help=f"agent loop per row (default: {SEARCH_AGENT})")
    add_subset_args(parser)
    args = parser.parse_args(argv)
    inputs = args.input
    if args.hf_repo is not None and args.hf is None:
        parser.error("--hf-repo goes with --hf")
    if args.hf is not None:
        from data_prep import hub

        names = hub.parse_names(args.hf, DATA_SOURCES, "QA data set")
        inputs = hub.fetch_qa(names, args.split, repo=args.hf_repo or hub.FLASHRAG_REPO)
    rows = convert(inputs, args.split, args.agent_name, args.limit, args.sample, args.seed)
    write_parquet_atomic(rows, args.output)
    print(f"wrote {len(rows)} rows to {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
