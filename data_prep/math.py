"""Competition math to verl parquet: DAPO-Math-17k (training) and AIME-2024 (evaluation), from local files.

Accepted layouts, as published (parquet, or the same records as JSON lines):

- ``dapo_math``: BytedTsinghua-SIA/DAPO-Math-17k: ``data_source`` ("math_dapo"), ``prompt`` (one user
  message: a header, the problem, a footer asking for ``Answer: ...``), ``ability`` ("MATH"),
  ``reward_model {ground_truth: "34", style: "rule-lighteval/MATH_v2"}``, ``extra_info {index: uuid}``.
  The prompt text is kept verbatim. The published file repeats its ~17k problems about 100 times;
  ``--dedupe`` keeps the first row of each problem text.
- ``aime2024``: ``Problem`` and ``Answer`` (Maxwell-Jia/AIME_2024; ``ID`` kept as the source id) or the
  lower-case ``problem``/``answer``/``id`` of other AIME-2024 copies. Rendered with DAPO's prompt
  (:data:`data_prep.templates.DAPO_MATH`), so both sets ask for the same answer format.

Rows: ``data_source`` "dapo_math" / "aime2024", ``ability="math"``, ``ground_truth={"target": [answer]}``,
scored by :mod:`reward_fns.math`. The agent defaults to verl's ``single_turn_agent`` (no search).

Example::

    python -m data_prep.math --input dapo_math=dapo-math-17k.parquet --split train --dedupe --output data/math/train.parquet
    python -m data_prep.math --input aime2024=aime_2024_problems.parquet --split test --output data/math/aime2024.parquet
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path

from data_prep._common import (
    SINGLE_TURN_AGENT,
    DataPrepError,
    add_subset_args,
    located,
    make_row,
    parse_input,
    read_records,
    require_records,
    run_cli,
    select_indices,
    write_parquet_atomic,
)
from data_prep.templates import dapo_problem, render_dapo_math
from sorl_verl.progress import progress

DATA_SOURCES = ("dapo_math", "aime2024")
ABILITY = "math"

# (problem, prompt text, answer, source id)
Item = tuple[str, str, str, str]


def _answer_text(value, path: Path, where: str, field: str) -> str:
    """A finite answer as text: strings and numbers; booleans, NaN, infinities (and 1e400) are refused."""
    if isinstance(value, bool) or value is None:
        raise located(path, where, field, "missing" if value is None else f"expected an answer, got a boolean {value}")
    if isinstance(value, float) and not math.isfinite(value):
        raise located(path, where, field, f"{value!r} is not a finite answer")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, (str, int, float)) or not str(value).strip():
        raise located(path, where, field, f"expected a non-empty answer, got {value!r:.60}")
    text = str(value).strip()
    try:
        number = float(text)
    except (ValueError, OverflowError):
        return text
    if not math.isfinite(number):
        raise located(path, where, field, f"{text[:40]!r} is not a finite answer")
    return text


def read_dapo(path: Path) -> list[Item]:
    items = []
    for where, record in read_records(path):
        messages = record.get("prompt")
        if not isinstance(messages, list) or not messages:
            raise located(path, where, "prompt", "missing or not a list of chat messages")
        user = [m for m in messages if isinstance(m, dict) and m.get("role") == "user"]
        if not user or not isinstance(user[-1].get("content"), str) or not user[-1]["content"].strip():
            raise located(path, where, "prompt", "no user message with text")
        content = user[-1]["content"]
        reward_model = record.get("reward_model")
        if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
            raise located(path, where, "reward_model.ground_truth", "missing")
        answer = _answer_text(reward_model["ground_truth"], path, where, "reward_model.ground_truth")
        extra_info = record.get("extra_info") if isinstance(record.get("extra_info"), dict) else {}
        items.append((dapo_problem(content), content, answer, str(extra_info.get("index", ""))))
    return list(require_records(items, path))


def read_aime(path: Path) -> list[Item]:
    items = []
    for where, record in read_records(path):
        problem_field = "Problem" if "Problem" in record else "problem"
        answer_field = "Answer" if "Answer" in record else "answer"
        problem = record.get(problem_field)
        if not isinstance(problem, str) or not problem.strip():
            raise located(path, where, problem_field, "missing or empty")
        answer = _answer_text(record.get(answer_field), path, where, answer_field)
        source_id = record.get("ID", record.get("id", ""))
        items.append((problem.strip(), render_dapo_math(problem), answer, str(source_id)))
    return list(require_records(items, path))


def convert(
    inputs: Sequence[tuple[str, Path]],
    split: str,
    agent_name: str = SINGLE_TURN_AGENT,
    dedupe: bool = False,
    limit: int | None = None,
    sample: int | None = None,
    seed: int = 0,
) -> list[dict]:
    rows = []
    for data_source, path in inputs:
        if data_source == "dapo_math":
            items = read_dapo(Path(path))
        elif data_source == "aime2024":
            items = read_aime(Path(path))
        else:
            raise DataPrepError(f"unknown data source {data_source!r} for {path}; choose from {', '.join(DATA_SOURCES)}")
        if dedupe:
            seen, unique = set(), []
            for item in items:
                if item[0] not in seen:
                    seen.add(item[0])
                    unique.append(item)
            items = unique
        keep = select_indices(len(items), limit, sample, seed)
        for index, position in enumerate(progress(keep, desc=data_source, leave=False)):
            problem, content, answer, source_id = items[position]
            rows.append(
                make_row(
                    data_source=data_source,
                    agent_name=agent_name,
                    content=content,
                    ability=ABILITY,
                    targets=[answer],
                    split=split,
                    index=index,
                    question=problem,
                    retrieval_query=problem,
                    source_id=source_id,
                )
            )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m data_prep.math",
        description="DAPO-Math-17k / AIME-2024 (parquet or JSONL, published layouts) -> verl parquet.",
    )
    parser.add_argument(
        "--input",
        action="append",
        type=parse_input,
        required=True,
        metavar="NAME=PATH",
        help=f"a data set and its file; repeat to mix. NAME is one of {', '.join(DATA_SOURCES)}",
    )
    parser.add_argument("--split", required=True, help="written to extra_info.split (train or test)")
    parser.add_argument("--output", type=Path, required=True, help="parquet file to write (atomically)")
    parser.add_argument("--dedupe", action="store_true", help="keep the first row of each distinct problem text")
    parser.add_argument(
        "--agent-name", default=SINGLE_TURN_AGENT, help=f"agent loop per row (default: {SINGLE_TURN_AGENT})"
    )
    add_subset_args(parser)
    args = parser.parse_args(argv)
    rows = convert(args.input, args.split, args.agent_name, args.dedupe, args.limit, args.sample, args.seed)
    write_parquet_atomic(rows, args.output)
    print(f"wrote {len(rows)} rows to {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run_cli(main))
