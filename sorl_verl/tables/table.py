"""Runs -> the paper's results table (methods x datasets, grouped as the paper groups them).

Paper parts: the dataset groups and order (general QA: NQ, TriviaQA, PopQA; multi-hop QA:
HotpotQA, 2Wiki, Musique, Bamboogle; then the medical sets and math) and one average column.
Our choices, documented in the README:

- ``best`` picks, per run, the validation step with the highest mean score over that run's
  datasets (one checkpoint for every column, never a per-column maximum, which would mix
  checkpoints); ``last`` picks the last validation step. Only steps that validated every
  dataset the run ever validated are candidates.
- ``Avg.`` is the plain mean over the table's dataset columns, shown only when the row has
  all of them ('-' otherwise: an average over a different set of datasets would not compare).
- the best value of each column within a model is bold (markdown and LaTeX).
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass

from sorl_verl.tables.runs import Run

MISSING = "-"

# (group, [(canonical key, column title, aliases)]). Aliases are compared after lower-casing
# and dropping everything but letters and digits, so "2WikiMultihopQA", "medqa_us" and
# "mmlu-med" all match.
DATASET_GROUPS: list[tuple[str, list[tuple[str, str, tuple[str, ...]]]]] = [
    (
        "General QA",
        [
            ("nq", "NQ", ("nq", "nqopen", "naturalquestions")),
            ("triviaqa", "TriviaQA", ("triviaqa", "tqa")),
            ("popqa", "PopQA", ("popqa",)),
        ],
    ),
    (
        "Multi-hop QA",
        [
            ("hotpotqa", "HotpotQA", ("hotpotqa",)),
            ("2wikimultihopqa", "2Wiki", ("2wikimultihopqa", "2wiki", "2wikimqa")),
            ("musique", "Musique", ("musique",)),
            ("bamboogle", "Bamboogle", ("bamboogle",)),
        ],
    ),
    (
        "Medical",
        [
            ("medqa", "MedQA", ("medqa", "medqaus", "medqausmle", "medqa4options")),
            ("medmcqa", "MedMCQA", ("medmcqa",)),
            ("pubmedqa", "PubMedQA", ("pubmedqa", "pubmedqastar")),
            ("mmlumed", "MMLU-Med", ("mmlumed", "mmlumedical")),
        ],
    ),
    (
        "Math",
        [
            ("aime24", "AIME24", ("aime24", "aime2024", "aime")),
            ("dapomath", "DAPO-Math", ("dapomath", "dapomath17k", "mathdapo")),
        ],
    ),
]
OTHER_GROUP = "Other"


def _normalize(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


_ALIASES = {
    alias: (group, key, title) for group, cols in DATASET_GROUPS for key, title, aliases in cols for alias in aliases
}
_ORDER = {key: i for i, key in enumerate(key for _, cols in DATASET_GROUPS for key, *_ in cols)}


@dataclass(frozen=True)
class Column:
    group: str
    key: str
    title: str


def column_for(source: str) -> Column:
    """The table column of a verl ``data_source``; unknown sources go to group 'Other' under their own name."""
    hit = _ALIASES.get(_normalize(source))
    if hit is None:
        return Column(OTHER_GROUP, source, source)
    return Column(*hit)


def _score_at_step(run: Run, step: int) -> dict[Column, float]:
    return {column_for(src): by_step[step] for src, by_step in run.validation.items() if step in by_step}


def select_step(run: Run, select: str) -> int | None:
    """The validation step reported for a run (see the module docstring); None without validation."""
    if select not in ("best", "last"):
        raise ValueError(f"select must be 'best' or 'last', got {select!r}")
    val_steps = sorted({s for by_step in run.validation.values() for s in by_step})
    if not val_steps:
        return None
    coverage = {s: sum(s in by_step for by_step in run.validation.values()) for s in val_steps}
    candidates = [s for s in val_steps if coverage[s] == max(coverage.values())]
    if select == "last":
        return candidates[-1]

    def mean_at(step: int) -> float:
        values = [by_step[step] for by_step in run.validation.values() if step in by_step]
        return sum(values) / len(values)

    # max() keeps the first of equal scores: the earliest step wins a tie.
    return max(candidates, key=mean_at)


@dataclass
class Row:
    model: str
    method: str
    run: str
    step: int | None
    scores: dict[Column, float]
    average: float | None = None


@dataclass
class Table:
    columns: list[Column]
    rows: list[Row]
    select: str


def build_table(runs: list[Run], select: str = "best") -> Table:
    """Rows sorted by model, then by the order the runs were given; columns in the paper's order."""
    rows = []
    for run in runs:
        step = select_step(run, select)
        scores = _score_at_step(run, step) if step is not None else {}
        rows.append(Row(model=run.model, method=run.method, run=run.experiment, step=step, scores=scores))
    seen: dict[Column, None] = {}
    for row in rows:
        seen.update(dict.fromkeys(row.scores))
    columns = sorted(seen, key=lambda c: (_ORDER.get(c.key, len(_ORDER)), c.title))
    for row in rows:
        if columns and all(c in row.scores for c in columns):
            row.average = sum(row.scores[c] for c in columns) / len(columns)
    # Two runs of one method on one model (seeds, ablations) stay apart by their experiment name.
    labels: dict[tuple[str, str], int] = {}
    for row in rows:
        labels[(row.model, row.method)] = labels.get((row.model, row.method), 0) + 1
    for row in rows:
        if labels[(row.model, row.method)] > 1:
            row.method = f"{row.method} [{row.run}]"
    model_order = {m: i for i, m in reversed(list(enumerate(r.model for r in rows)))}
    rows.sort(key=lambda r: model_order[r.model])
    return Table(columns=columns, rows=rows, select=select)


def _bests(table: Table) -> set[tuple[int, str]]:
    """(row index, column key or 'avg') of the best value per column within each model."""
    best: set[tuple[int, str]] = set()
    keys = [(c.key, lambda r, c=c: r.scores.get(c)) for c in table.columns] + [("avg", lambda r: r.average)]
    for model in dict.fromkeys(r.model for r in table.rows):
        idx = [i for i, r in enumerate(table.rows) if r.model == model]
        if len(idx) < 2:
            continue
        for key, get in keys:
            values = [(get(table.rows[i]), i) for i in idx if get(table.rows[i]) is not None]
            if values:
                top = max(v for v, _ in values)
                best.update((i, key) for v, i in values if v == top)
    return best


def _fmt(value: float | None, digits: int) -> str:
    return MISSING if value is None else f"{value:.{digits}f}"


def _cells(table: Table, i: int, digits: int, bold) -> list[str]:
    row, best = table.rows[i], _bests(table)
    out = []
    for key, value in [(c.key, row.scores.get(c)) for c in table.columns] + [("avg", row.average)]:
        text = _fmt(value, digits)
        out.append(bold(text) if (i, key) in best else text)
    return out


def to_markdown(table: Table, digits: int = 3) -> str:
    groups = list(dict.fromkeys(c.group for c in table.columns))
    lines = [
        f"Validation score at the {table.select} step of each run; "
        + "; ".join(f"{g}: {', '.join(c.title for c in table.columns if c.group == g)}" for g in groups),
        "",
        "| " + " | ".join(["Model", "Method", "Step", *[c.title for c in table.columns], "Avg."]) + " |",
        "|" + "|".join([":---", ":---", "---:"] + ["---:"] * (len(table.columns) + 1)) + "|",
    ]
    for i, row in enumerate(table.rows):
        step = MISSING if row.step is None else str(row.step)
        cells = [row.model, row.method, step, *_cells(table, i, digits, lambda t: f"**{t}**")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _tex(text: str) -> str:
    return re.sub(r"([&%$#_{}])", r"\\\1", text)


def to_latex(table: Table, digits: int = 3) -> str:
    """A booktabs table: one header row of groups (with rules under them), one of datasets.

    Paper-ready, so without the step column (markdown and csv show it).
    """
    n = len(table.columns)
    lines = [
        "% requires \\usepackage{booktabs}",
        "\\begin{tabular}{ll" + "c" * (n + 1) + "}",
        "\\toprule",
    ]
    spans: list[tuple[str, int]] = []
    for c in table.columns:
        if spans and spans[-1][0] == c.group:
            spans[-1] = (c.group, spans[-1][1] + 1)
        else:
            spans.append((c.group, 1))
    head, rules, start = ["", ""], [], 3
    for group, width in spans:
        head.append(f"\\multicolumn{{{width}}}{{c}}{{{_tex(group)}}}")
        rules.append(f"\\cmidrule(lr){{{start}-{start + width - 1}}}")
        start += width
    head.append("")
    lines.append(" & ".join(head) + " \\\\")
    lines.append(" ".join(rules))
    lines.append(" & ".join(["Model", "Method", *[_tex(c.title) for c in table.columns], "Avg."]) + " \\\\")
    lines.append("\\midrule")
    previous_model = None
    for i, row in enumerate(table.rows):
        if previous_model is not None and row.model != previous_model:
            lines.append("\\midrule")
        previous_model = row.model
        cells = [_tex(row.model), _tex(row.method), *_cells(table, i, digits, lambda t: f"\\textbf{{{t}}}")]
        lines.append(" & ".join(cells) + " \\\\")
    lines += ["\\bottomrule", "\\end{tabular}"]
    return "\n".join(lines) + "\n"


def to_csv(table: Table) -> str:
    """Full-precision values for further processing; empty cells where a dataset is missing."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["model", "method", "run", "step", *[c.title for c in table.columns], "avg"])
    for row in table.rows:
        values = [row.scores.get(c) for c in table.columns] + [row.average]
        writer.writerow(
            [row.model, row.method, row.run, "" if row.step is None else row.step]
            + ["" if v is None else repr(v) for v in values]
        )
    return buf.getvalue()


FORMATS = {"markdown": to_markdown, "latex": to_latex, "csv": lambda t, digits=3: to_csv(t)}
