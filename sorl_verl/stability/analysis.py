"""A sweep's finished runs -> per-run figures of merit, the pressure x method table, the figures.

Runs are read with :mod:`sorl_verl.tables` (metrics JSONL + Hydra config). Per run (our
definitions, documented in docs/stability.md):

- the *validation curve* is the mean validation score over the run's data sources at each
  validation step (``tables.plot.mean_validation_curve``); step 0 is the warm start;
- ``warm`` = its value at the first validated step, ``peak`` = its maximum (warm start included),
  ``final`` = its value at the last validated step;
- ``auc`` = the trapezoid area under it divided by the steps it spans: the mean score over
  training, in score units, so runs of different lengths compare;
- ``collapsed``: ``final <= warm - 0.15`` or ``final < peak / 2``: the run ends 0.15 below its warm start or below half its peak;
- clip fractions: the mean over training steps of the token and turn clip fractions, where the
  run logs them (names from ``tables.plot.STABILITY_PANELS``, so renamed metrics follow it).

Per (task, pressure, method, arm): mean and sample standard deviation over seeds, and collapsed runs
k/n. The paper's layout (:func:`paper_table`): rows = methods (at a pressure), column groups = task
families.

The segment study's measures (:func:`segment_measures`; its table and figure:
:func:`write_segment_report`): trained model turns per step, measured from the metrics,
and the training wall time, both cumulated at every validation step; the mean turn-position spread
and the mean correction scale.
"""

from __future__ import annotations

import csv
import io
import math
import re
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sorl_verl.fileio import write_text_atomic
from sorl_verl.recipes import METRIC_PREFIX
from sorl_verl.stability.grid import (
    DEFAULT_TASK,
    DONE_MARKER,
    GROUP_METHODS,
    METHODS,
    PRESSURES,
    RESETS,
    RUN_RECORD,
    WHOLE,
)
from sorl_verl.tables.plot import STABILITY_PANELS, mean_validation_curve, metric_for_panel
from sorl_verl.tables.runs import Run, RunError, load_run

COLLAPSE_DROP = 0.15  # final at least this far below the warm start ...
COLLAPSE_PEAK_FRACTION = 0.5  # ... or below this fraction of the peak
# Table columns averaged over training steps: (column, STABILITY_PANELS title).
CLIP_COLUMNS = (("Token clip", "Token clip fraction"), ("Turn clip", "Turn clip fraction"))
_PANEL_PATTERNS = dict(STABILITY_PANELS)

# The segment study's metrics. Trained model turns per trained row, the first logged of: a segment's
# (the segment trainer's rollout/segment_turns_mean, from the agent loop); the response-mask turns the
# SORL losses count (the model-token runs of the trained rows: exact, but logged by the SORL losses
# only); for whole episodes, verl's turn count / 2: for the search loop that count is the user turn +
# m model turns + the m - 1 observations between them = 2m (an episode cut off by the response length
# right after an observation counts half a turn more).
SEGMENT_TURNS = "rollout/segment_turns_mean"
EPISODE_TURN_COUNTS = ("num_turns/mean", "training/num_turns/mean")  # verl's two names, same value
RESPONSE_MASK_TURNS = METRIC_PREFIX + "turns_per_seq"
TURN_POSITION_STD = "rollout/turn_position_std"
CORRECTION_SCALE = METRIC_PREFIX + "norm_scale"
STEP_SECONDS = "timing_s/step"  # verl's step timer: rollout, updates, checkpoint; not validation or start-up


@dataclass
class RunResult:
    name: str
    pressure: str
    method: str  # ALGO name (common.sh)
    label: str  # the paper's name (tables.method_name)
    seed: int
    steps: list[int]
    scores: list[float]
    warm: float
    peak: float
    final: float
    auc: float
    collapsed: bool
    clip: dict[str, float | None] = field(default_factory=dict)  # CLIP_COLUMNS -> mean over steps
    run: Run | None = None
    pressure_title: str = ""  # figure panel title, from the run's recorded pressure
    task: str = DEFAULT_TASK
    arm: str = WHOLE  # the segment study's arm (grid.Arm.name), "whole" for whole episodes
    # measured (segment_measures): at each of ``steps``, cumulative trained model turns and training
    # seconds (None when some training step did not log them); means over training steps
    curve_turns: list[float] | None = None
    curve_wall: list[float] | None = None
    turns_per_row: float | None = None
    turn_position_std: float | None = None
    correction_scale: float | None = None


def method_label(method: str, label: str) -> str:
    """The table's name of a grid method: the paper's name of its loss and estimator (``label``), and
    the variant for a method of the grid such as ``s_ppo+absolute`` (``S-PPO (absolute)``)."""
    _, plus, variant = method.partition("+")
    return f"{label} ({variant})" if plus else label


def area_under_curve(steps: list[int], scores: list[float]) -> float:
    """Trapezoid area of ``scores`` over ``steps`` divided by the span (a single point: its value)."""
    if not steps:
        raise ValueError("no validation points")
    if len(steps) == 1 or steps[-1] == steps[0]:
        return scores[-1]
    area = sum((b - a) * (ya + yb) / 2 for a, b, ya, yb in zip(steps, steps[1:], scores, scores[1:], strict=False))
    return area / (steps[-1] - steps[0])


def is_collapsed(warm: float, peak: float, final: float) -> bool:
    # a tolerance so that "exactly 0.15 below" counts despite float rounding
    return final <= warm - COLLAPSE_DROP + 1e-9 or final < COLLAPSE_PEAK_FRACTION * peak


def _mean_of(run: Run, metric: str) -> float | None:
    values = run.series(metric)[1]
    return statistics.fmean(values) if values else None


def turns_per_row(metrics: dict[str, float], whole: bool) -> float | None:
    """Trained model turns per trained row at one step (see SEGMENT_TURNS); None when not logged."""
    for name in (SEGMENT_TURNS, RESPONSE_MASK_TURNS):
        if name in metrics:
            return metrics[name]
    if whole:  # verl's turn count covers the whole trajectory: of a segment's, not what it trained
        for name in EPISODE_TURN_COUNTS:
            if name in metrics:
                return metrics[name] / 2
    return None


def _cumulative(values: dict[int, float | None], at: list[int]) -> list[float] | None:
    """Running sums of the training steps' ``values`` (step 1 on) at each step of ``at``; None when a
    training step up to the last of ``at`` has no value (a sum with a gap would look measured)."""
    last = max(at, default=0)
    if any(values.get(step) is None for step in range(1, last + 1)):
        return None
    total, sums = 0.0, {0: 0.0}
    for step in range(1, last + 1):
        total += values[step]
        sums[step] = total
    return [sums[step] for step in at]


def segment_measures(run: Run, steps: list[int], rows_per_step: int | None, whole: bool) -> dict:
    """The segment study's measures of one run: ``curve_turns`` (trained model turns, = rows per step x
    turns per row, cumulated at each of ``steps``), ``curve_wall`` (seconds of verl's step timer,
    cumulated), ``turns_per_row``, ``turn_position_std`` and ``correction_scale`` (means over training
    steps; None when not logged)."""
    training = {step: metrics for step, metrics in run.steps.items() if step >= 1}
    per_row = {step: turns_per_row(metrics, whole) for step, metrics in training.items()}
    turns = {step: None if v is None else v * rows_per_step for step, v in per_row.items()} if rows_per_step else {}
    logged = [v for v in per_row.values() if v is not None]
    return {
        "curve_turns": _cumulative(turns, steps) if rows_per_step else None,
        "curve_wall": _cumulative({step: m.get(STEP_SECONDS) for step, m in training.items()}, steps),
        "turns_per_row": statistics.fmean(logged) if logged else None,
        "turn_position_std": _mean_of(run, TURN_POSITION_STD),
        "correction_scale": _mean_of(run, CORRECTION_SCALE),
    }


def rows_per_step(record: dict) -> int | None:
    """Trajectories trained per step from a run's record (its batch in prompts x samples per prompt)."""
    env = record.get("env", {})
    try:
        per_prompt = int(env["GROUP_SIZE"]) if record.get("method") in GROUP_METHODS else 1
        return int(env["TRAIN_BATCH_SIZE"]) * per_prompt
    except (KeyError, ValueError):
        return None


def run_result(
    run: Run,
    pressure: str,
    method: str,
    seed: int,
    clip_metrics: dict[str, str | None],
    task: str = DEFAULT_TASK,
    arm: str = WHOLE,
    rows: int | None = None,
) -> RunResult | None:
    """Figures of merit of one run; None when it has no validation score. ``rows``: trajectories per step."""
    steps, scores = mean_validation_curve(run)
    if not steps:
        return None
    warm, peak, final = scores[0], max(scores), scores[-1]
    clip = {}
    for column, metric in clip_metrics.items():
        values = run.series(metric)[1] if metric else []
        clip[column] = sum(values) / len(values) if values else None
    return RunResult(
        name=run.path.name,
        pressure=pressure,
        method=method,
        label=method_label(method, run.method),
        seed=seed,
        steps=steps,
        scores=scores,
        warm=warm,
        peak=peak,
        final=final,
        auc=area_under_curve(steps, scores),
        collapsed=is_collapsed(warm, peak, final),
        clip=clip,
        run=run,
        task=task,
        arm=arm,
        **segment_measures(run, steps, rows, arm == WHOLE),
    )


def load_results(sweep_dir: Path, archives: list[Path] | tuple[Path, ...] = ()) -> tuple[list[RunResult], list[str]]:
    """Every finished run of the sweep folder, in table order; and notes on the runs left out.

    ``archives``: ``stability_runs.csv`` files of earlier sittings (:func:`archived_results`); their
    runs join the table unless the sweep folder holds a finished run of the same name, which wins.
    """
    import json

    found: list[tuple[Run, dict]] = []
    notes: list[str] = []
    for folder in sorted((Path(sweep_dir) / "runs").glob("*")):
        if not (folder / RUN_RECORD).is_file():
            continue
        if not (folder / DONE_MARKER).is_file():
            notes.append(f"{folder.name}: not finished, left out")
            continue
        record = json.loads((folder / RUN_RECORD).read_text(encoding="utf-8"))
        try:
            found.append((load_run(folder), record))
        except RunError as e:
            notes.append(f"{folder.name}: unreadable, left out ({e})")
    runs = [run for run, _ in found]
    clip_metrics = {column: metric_for_panel(runs, _PANEL_PATTERNS[title]) for column, title in CLIP_COLUMNS}
    results = []
    for run, record in found:
        result = run_result(
            run,
            record["pressure"]["name"],
            record["method"],
            int(record["seed"]),
            clip_metrics,
            record.get("task", DEFAULT_TASK),
            (record.get("arm") or {}).get("name", WHOLE),
            rows_per_step(record),
        )
        if result is not None:
            result.pressure_title = pressure_title(record["pressure"])
        if result is None:
            notes.append(f"{run.path.name}: no validation score, left out")
        else:
            results.append(result)
    names = {r.name for r in results}
    for path in archives:
        archived = archived_results(path)
        results += [r for r in archived if r.name not in names]
        names |= {r.name for r in archived}
    results.sort(
        key=lambda r: (
            _task_order(r.task),
            _pressure_order(r.pressure),
            _method_order(r.method),
            arm_order(r.arm),
            r.seed,
        )
    )
    return results, notes


def csv_key(column: str) -> str:
    """``"Token clip"`` -> ``"token_clip"``: a table column's name in the CSV files."""
    return column.lower().replace(" ", "_")


# stability_runs.csv: what runs_csv writes and archived_results reads (``task`` may be absent: the
# default task, as in archives written before tasks were an axis; the trailing segment-study columns
# too: whole episodes, nothing measured, as in archives written before arms were an axis).
# curve_turns and curve_wall are ``step:value`` pairs at the curve's steps (cumulative trained model
# turns, cumulative seconds of verl's step timer); empty when not measured.
RUN_FIELDS = ("run", "pressure", "algo", "method", "seed", "warm", "peak", "final", "auc", "collapsed")
SEGMENT_FIELDS = ("arm", "turns_per_row", "turn_position_std", "correction_scale", "curve_turns", "curve_wall")
RUNS_CSV_COLUMNS = ("task", *RUN_FIELDS, *(csv_key(c) for c, _ in CLIP_COLUMNS), "curve", *SEGMENT_FIELDS)


class ArchiveError(ValueError):
    """A ``stability_runs.csv`` that cannot be read; the message names the file, row and field."""


def _parse_curve(text: str) -> tuple[list[int], list[float]]:
    pairs = [item.split(":") for item in text.split()]
    if not pairs or any(len(p) != 2 for p in pairs):
        raise ValueError(f"expected 'step:score' pairs, got {text!r}")
    return [int(step) for step, _ in pairs], [float(score) for _, score in pairs]


def _parse_measured_curve(text: str | None, steps: list[int]) -> list[float] | None:
    """A ``curve_turns`` / ``curve_wall`` cell: None when empty, else its values at ``steps``."""
    if not text:
        return None
    at, values = _parse_curve(text)
    if at != steps:
        raise ValueError(f"its steps {at} are not the curve's {steps}")
    return values


def _format_curve(steps: list[int], values: list[float] | None, digits: int) -> str:
    return "" if values is None else " ".join(f"{s}:{v:.{digits}f}" for s, v in zip(steps, values, strict=True))


def arm_order(name: str) -> tuple:
    """Whole episodes first, then the segment arms by T, then reset schedule (grid.RESETS order)."""
    if name == WHOLE:
        return (0, 0, 0, name)
    m = re.fullmatch(r"T(\d+)-(.+)", name)
    if m is None:
        return (2, 0, 0, name)
    return (1, int(m[1]), RESETS.index(m[2]) if m[2] in RESETS else len(RESETS), name)


def archived_results(path: Path) -> list[RunResult]:
    """The runs of a ``stability_runs.csv`` (what :func:`runs_csv` writes) as results.

    A sweep spans sittings, but run folders (checkpoints, metrics) are not kept in the repository;
    the committed per-run table is. Its figures of merit are taken as written (full precision),
    the curve at its 4 decimals; archived runs have no per-step metrics (``run`` is None), so the
    diagnostics figure leaves them out. Raises :class:`ArchiveError` naming the row and field.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ArchiveError(f"{path}: cannot read the archived runs ({e.strerror or e})") from None
    reader = csv.DictReader(io.StringIO(text))
    required = [*RUN_FIELDS, "curve"]  # the clip columns may be empty, so may be absent
    missing = [c for c in required if c not in (reader.fieldnames or [])]
    if missing:
        raise ArchiveError(f"{path}: not a stability_runs.csv (missing columns {missing})")
    clip_fields = [(column, csv_key(column)) for column, _ in CLIP_COLUMNS]
    results = []
    for line, row in enumerate(reader, start=2):
        field_name = "run"
        try:
            if not row["run"]:
                raise ValueError("empty")
            values = {}
            for field_name, parse in (("seed", int), ("warm", float), ("peak", float), ("final", float),
                                      ("auc", float), ("collapsed", int)):  # fmt: skip
                values[field_name] = parse(row[field_name])
            field_name = "curve"
            steps, scores = _parse_curve(row["curve"])
            clip = {}
            for column, key in clip_fields:
                field_name = key
                clip[column] = float(row[key]) if row.get(key) else None
            measured = {}
            for field_name in ("turns_per_row", "turn_position_std", "correction_scale"):
                measured[field_name] = float(row[field_name]) if row.get(field_name) else None
            for field_name in ("curve_turns", "curve_wall"):
                measured[field_name] = _parse_measured_curve(row.get(field_name), steps)
        except (TypeError, ValueError) as e:
            raise ArchiveError(f"{path}, row {line}, field {field_name!r}: {e}") from None
        known = PRESSURES.get(row["pressure"])
        results.append(
            RunResult(
                name=row["run"],
                pressure=row["pressure"],
                method=row["algo"],
                label=row["method"],
                task=row.get("task") or DEFAULT_TASK,
                seed=values["seed"],
                steps=steps,
                scores=scores,
                warm=values["warm"],
                peak=values["peak"],
                final=values["final"],
                auc=values["auc"],
                collapsed=bool(values["collapsed"]),
                clip=clip,
                pressure_title=pressure_title(asdict(known)) if known else row["pressure"],
                arm=row.get("arm") or WHOLE,
                **measured,
            )
        )
    return results


def pressure_title(pressure: dict) -> str:
    """``reuse_4x4\n4 epochs x 4 mini-batches`` (+ ``, lr 5e-4``, ``+ N overrides``) from a recorded Pressure."""
    epochs = pressure["ppo_epochs"]
    text = f"{pressure['name']}\n{epochs} epoch{'s' if epochs != 1 else ''} x {pressure['mini_batches']} mini-batches"
    if pressure.get("actor_lr") is not None:
        text += f", lr {pressure['actor_lr']:g}"
    if pressure.get("overrides"):
        text += f", + {len(pressure['overrides'])} overrides"
    return text


def _pressure_order(name: str) -> tuple[int, str]:
    order = list(PRESSURES)
    return (order.index(name) if name in order else len(order), name)


def _method_order(name: str) -> tuple[int, str]:
    return (METHODS.index(name) if name in METHODS else len(METHODS), name)


TASK_ORDER = ("search", "multihop", "medical")


def _task_order(name: str) -> tuple[int, str]:
    return (TASK_ORDER.index(name) if name in TASK_ORDER else len(TASK_ORDER), name)


# ---------------------------------------------------------------- the table


@dataclass
class Stat:
    mean: float | None
    std: float | None  # sample standard deviation; None below 2 values

    @classmethod
    def of(cls, values: list[float | None]) -> Stat:
        values = [v for v in values if v is not None]
        if not values:
            return cls(None, None)
        return cls(statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None)

    def text(self, digits: int = 3) -> str:
        if self.mean is None:
            return "-"
        return f"{self.mean:.{digits}f}" + ("" if self.std is None else f" ± {self.std:.{digits}f}")


@dataclass
class Cell:
    pressure: str
    method: str
    label: str
    seeds: list[int]
    collapsed: int
    stats: dict[str, Stat]
    task: str = DEFAULT_TASK
    arm: str = WHOLE

    @property
    def title(self) -> str:
        """The method's name in the tables: with the segment arm in brackets (none for whole episodes)."""
        return arm_label(self.label, self.arm)


def arm_label(label: str, arm: str) -> str:
    return label if arm == WHOLE else f"{label} [{arm}]"


STAT_COLUMNS = ("Warm start", "Peak", "Final", "AUC", *(c for c, _ in CLIP_COLUMNS))


def aggregate(results: list[RunResult]) -> list[Cell]:
    """One cell per (task, pressure, method, arm), in the order of ``results``."""
    groups: dict[tuple[str, str, str, str], list[RunResult]] = {}
    for r in results:
        groups.setdefault((r.task, r.pressure, r.method, r.arm), []).append(r)
    cells = []
    for (task, pressure, method, arm), rs in groups.items():
        values = {
            "Warm start": [r.warm for r in rs],
            "Peak": [r.peak for r in rs],
            "Final": [r.final for r in rs],
            "AUC": [r.auc for r in rs],
            **{c: [r.clip.get(c) for r in rs] for c, _ in CLIP_COLUMNS},
        }
        cells.append(
            Cell(
                pressure=pressure,
                method=method,
                label=rs[0].label,
                seeds=[r.seed for r in rs],
                collapsed=sum(r.collapsed for r in rs),
                stats={k: Stat.of(v) for k, v in values.items()},
                task=task,
                arm=arm,
            )
        )
    return cells


def to_markdown(cells: list[Cell], digits: int = 3) -> str:
    lines = [
        "Validation score (mean over data sources) per off-policy pressure and method: mean ± std over seeds. "
        f"Collapsed: final <= warm start - {COLLAPSE_DROP} or final < {COLLAPSE_PEAK_FRACTION} x peak. "
        "AUC: area under the validation curve / steps (the mean score over training). "
        "Clip columns: mean over training steps.",
        "",
        "| Task | Pressure | Method | Seeds | "
        + " | ".join(STAT_COLUMNS[:4])
        + " | Collapsed | "
        + " | ".join(STAT_COLUMNS[4:])
        + " |",
        "|:---|:---|:---|---:|" + "---:|" * 4 + "---:|" + "---:|" * (len(STAT_COLUMNS) - 4),
    ]
    for c in cells:
        stats = [c.stats[k].text(digits) for k in STAT_COLUMNS]
        row = [c.task, c.pressure, c.title, str(len(c.seeds)), *stats[:4], f"{c.collapsed}/{len(c.seeds)}", *stats[4:]]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def paper_table(cells: list[Cell], digits: int = 3) -> str:
    """The paper's layout: one row per method (at a pressure), a column group per task family with the
    final and peak validation score (mean ± std over seeds), collapsed runs k/n and the mean token clip
    fraction. A row's cells are empty for a task it was not run on."""
    tasks = sorted({c.task for c in cells}, key=_task_order)
    rows: dict[tuple[str, str, str], dict[str, Cell]] = {}
    for c in sorted(cells, key=lambda c: (_method_order(c.method), _pressure_order(c.pressure), arm_order(c.arm))):
        rows.setdefault((c.method, c.pressure, c.arm), {})[c.task] = c
    group = ("final", "peak", "collapsed", "token clip")
    head = ["Method", "Pressure", *(f"{t}: {g}" for t in tasks for g in group)]
    lines = [
        "Validation score per task family (mean ± std over seeds; final = at the last step, peak = the best "
        f"step, warm start included). Collapsed: final <= warm start - {COLLAPSE_DROP} or final < "
        f"{COLLAPSE_PEAK_FRACTION} x peak, as k/n runs. Token clip: mean token clip fraction over training.",
        "",
        "| " + " | ".join(head) + " |",
        "|:---|:---|" + "---:|" * (len(head) - 2),
    ]
    for (_, pressure, _), by_task in rows.items():
        label = next(iter(by_task.values())).title
        row = [label, pressure]
        for t in tasks:
            c = by_task.get(t)
            if c is None:
                row += ["", "", "", ""]
                continue
            row += [
                c.stats["Final"].text(digits),
                c.stats["Peak"].text(digits),
                f"{c.collapsed}/{len(c.seeds)}",
                c.stats[CLIP_COLUMNS[0][0]].text(digits),
            ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def _csv(rows: list[list]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerows(rows)
    return buf.getvalue()


def _num(value: float | None) -> str:
    return "" if value is None else repr(value)


def to_csv(cells: list[Cell]) -> str:
    """Full precision; ``*_std`` empty below two seeds; ``arm`` last (a column added with the segment study)."""
    keys = [csv_key(k) for k in STAT_COLUMNS]
    header = ["task", "pressure", "method", "algo", "seeds", "collapsed"] + [
        f"{k}_{s}" for k in keys for s in ("mean", "std")
    ]
    rows = [header + ["arm"]]
    for c in cells:
        stats = [v for k in STAT_COLUMNS for v in (_num(c.stats[k].mean), _num(c.stats[k].std))]
        rows.append([c.task, c.pressure, c.label, c.method, " ".join(map(str, c.seeds)), c.collapsed, *stats, c.arm])
    return _csv(rows)


def runs_csv(results: list[RunResult]) -> str:
    """One row per run: its figures of merit and its validation curve (``step:score`` pairs)."""
    rows = [list(RUNS_CSV_COLUMNS)]
    for r in results:
        curve = " ".join(f"{s}:{v:.4f}" for s, v in zip(r.steps, r.scores, strict=True))
        rows.append(
            [
                r.task,
                r.name,
                r.pressure,
                r.method,
                r.label,
                r.seed,
                repr(r.warm),
                repr(r.peak),
                repr(r.final),
                repr(r.auc),
                int(r.collapsed),
            ]
            + [_num(r.clip.get(k)) for k, _ in CLIP_COLUMNS]
            + [curve]
            + [r.arm, _num(r.turns_per_row), _num(r.turn_position_std), _num(r.correction_scale)]
            + [_format_curve(r.steps, r.curve_turns, 1), _format_curve(r.steps, r.curve_wall, 1)]
        )
    return _csv(rows)


# ---------------------------------------------------------------- the figures


def _mean_curve(curves: list[tuple[list[int], list[float]]]) -> tuple[list[int], list[float], list[float]]:
    """(steps every curve has, mean, sample std or 0) of several (steps, values) curves."""
    if not curves:
        return [], [], []
    common = sorted(set.intersection(*(set(xs) for xs, _ in curves)))
    maps = [dict(zip(xs, ys, strict=True)) for xs, ys in curves]
    means, stds = [], []
    for step in common:
        values = [m[step] for m in maps]
        means.append(statistics.fmean(values))
        stds.append(statistics.stdev(values) if len(values) > 1 else 0.0)
    return common, means, stds


def _save(fig, out: Path) -> None:
    import matplotlib.pyplot as plt

    from sorl_verl.fileio import atomic_file

    try:
        with atomic_file(out) as tmp:
            fig.savefig(tmp, dpi=110, format="png")
    finally:
        plt.close(fig)


def _grid(n_panels: int, ncols: int, width: float, height: float):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nrows = math.ceil(n_panels / ncols)
    return plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)


def _colors(results: list[RunResult]) -> dict[str, str]:
    import matplotlib.pyplot as plt

    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    methods = sorted({r.method for r in results}, key=_method_order)
    return {
        m: cycle[_method_order(m)[0] % len(cycle)] if m in METHODS else cycle[i % len(cycle)]
        for i, m in enumerate(methods)
    }


def _by_pressure_method(results: list[RunResult]) -> dict[str, dict[str, list[RunResult]]]:
    """``{panel: {method: runs}}``, a panel per pressure (per task and pressure when several tasks)."""
    several = len({r.task for r in results}) > 1
    out: dict[str, dict[str, list[RunResult]]] = {}
    for r in results:
        panel = f"{r.task} {r.pressure}" if several else r.pressure
        out.setdefault(panel, {}).setdefault(r.method, []).append(r)
    return out


def _panel_title(rs: list[RunResult], panel: str) -> str:
    title = rs[0].pressure_title or rs[0].pressure
    return f"{rs[0].task}: {title}" if panel != rs[0].pressure else title


def _legend(fig, axes, results: list[RunResult]) -> None:
    """One legend for the figure, methods in table order, below the panels."""
    order = {r.label: _method_order(r.method) for r in results}
    found: dict[str, object] = {}
    for ax in axes.flat:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            found.setdefault(label, h)
    labels = sorted(found, key=lambda label: order.get(label, (len(METHODS), label)))
    if labels:
        height = fig.get_figheight()
        fig.legend(
            [found[k] for k in labels], labels, loc="lower center", ncol=min(7, len(labels)), fontsize=9, frameon=False
        )
        fig.tight_layout(rect=(0, min(0.4, 0.45 / height), 1, 1))  # ~0.45 inch for the legend
    else:
        fig.tight_layout()


def plot_validation(results: list[RunResult], out: Path) -> int:
    """Validation score vs step, one panel per pressure, one line per method (mean ± std over seeds)."""
    grouped = _by_pressure_method(results)
    colors = _colors(results)
    fig, axes = _grid(len(grouped), min(4, len(grouped)), 4.6, 3.6)
    for ax, (pressure, by_method) in zip(axes.flat, grouped.items(), strict=False):
        for method, rs in by_method.items():
            xs, mean, std = _mean_curve([(r.steps, r.scores) for r in rs])
            color = colors[method]
            ax.plot(xs, mean, marker="o", markersize=3, linewidth=1.5, color=color, label=f"{rs[0].label}")
            if len(rs) > 1:
                ax.fill_between(
                    xs,
                    [m - s for m, s in zip(mean, std, strict=True)],
                    [m + s for m, s in zip(mean, std, strict=True)],
                    color=color,
                    alpha=0.15,
                    linewidth=0,
                )
        ax.set_title(_panel_title(next(iter(by_method.values())), pressure), fontsize=9)
        ax.set_xlabel("training step")
        ax.set_ylabel("validation score")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(grouped) :]:
        ax.axis("off")
    _legend(fig, axes, results)
    _save(fig, out)
    return len(grouped)


def plot_diagnostics(results: list[RunResult], out: Path) -> list[str]:
    """Training diagnostics vs step (rows: clip fractions, clipping-bias norm, scale, ...; columns:
    pressures), mean over seeds per method. Rows no run logged are left out; returns the metrics drawn."""
    runs = [r.run for r in results if r.run is not None]
    rows = [(title, metric_for_panel(runs, patterns)) for title, patterns in STABILITY_PANELS]
    rows = [(title, metric) for title, metric in rows if metric is not None]
    if not rows:
        return []
    grouped = _by_pressure_method(results)
    colors = _colors(results)
    pressures = list(grouped)
    fig, axes = _grid(len(rows) * len(pressures), len(pressures), 4.2, 2.9)
    for i, (title, metric) in enumerate(rows):
        for j, pressure in enumerate(pressures):
            ax = axes[i][j]
            for method, rs in grouped[pressure].items():
                curves = [r.run.series(metric) for r in rs if r.run is not None]
                xs, mean, _ = _mean_curve([c for c in curves if c[0]])
                if xs:
                    ax.plot(xs, mean, linewidth=1.3, color=colors[method], label=rs[0].label)
            if i == 0:
                ax.set_title(_panel_title(next(iter(grouped[pressure].values())), pressure), fontsize=9)
            if j == 0:
                ax.set_ylabel(f"{title}\n({metric})", fontsize=8)
            if i == len(rows) - 1:
                ax.set_xlabel("training step")
            ax.grid(alpha=0.3)
    _legend(fig, axes, results)
    _save(fig, out)
    return [metric for _, metric in rows]


# ---------------------------------------------------------------- the segment study
#
# segments.md and segments.png (docs/stability.md#the-segment-study). The study compares, per task,
# pressure and method, whole episodes with segment arms (``T<turns>-<resets>``, grid.Arm). Its runs
# are those of every (task, pressure, method) that has a segment arm among the finished (or archived)
# runs: the whole-episode runs of the same cell are its ``whole`` arm. Budget rule (grid.Arm.budget):
# a T arm runs max(1, L / T) times the whole-episode steps and validation interval, so every arm
# trains about the same number of model turns; the report does not take that plan on trust but shows
# the trained turns measured from the metrics (segment_measures) and plots validation against them.

SEGMENTS_MD = "segments.md"
SEGMENTS_PNG = "segments.png"

# (column, how a run's value is read), means ± std over seeds
SEGMENT_COLUMNS = (
    ("Final", lambda r: r.final),
    ("Peak", lambda r: r.peak),
    ("Trained turns", lambda r: r.curve_turns[-1] if r.curve_turns else None),
    ("Turns/row", lambda r: r.turns_per_row),
    ("Train min", lambda r: r.curve_wall[-1] / 60 if r.curve_wall else None),
    ("Turn-pos. std", lambda r: r.turn_position_std),
    ("Token clip", lambda r: r.clip.get("Token clip")),
    ("Correction scale", lambda r: r.correction_scale),
)
SEGMENT_DIGITS = {"Trained turns": 0, "Train min": 1, "Turns/row": 2}


def study_results(results: list[RunResult]) -> list[RunResult]:
    """The runs of every (task, pressure, method) with a segment arm, in table order."""
    cells = {(r.task, r.pressure, r.method) for r in results if r.arm != WHOLE}
    study = [r for r in results if (r.task, r.pressure, r.method) in cells]
    return sorted(
        study,
        key=lambda r: (
            _task_order(r.task),
            _pressure_order(r.pressure),
            _method_order(r.method),
            arm_order(r.arm),
            r.seed,
        ),
    )


def _segment_groups(results: list[RunResult]) -> dict[tuple[str, str, str, str], list[RunResult]]:
    groups: dict[tuple[str, str, str, str], list[RunResult]] = {}
    for r in results:
        groups.setdefault((r.task, r.pressure, r.method, r.arm), []).append(r)
    return groups


def segments_markdown(results: list[RunResult]) -> str:
    """One row per (task, pressure, method, arm): the SEGMENT_COLUMNS as mean ± std over seeds."""
    lines = [
        "The segment study: validation score (mean over data sources) per method and arm, mean ± std over "
        "seeds. Arms: whole episodes, or segment mode with T model turns per segment and sync or staggered "
        "resets (T<T>-<resets>). Budget rule: a T arm runs max(1, L/T) times the whole-episode steps and "
        "validation interval (L: the model turns a whole episode trains per trajectory, planned), so every "
        "arm trains about the same number of model turns. Measured, not planned: Trained turns = model "
        "turns trained over the run (rows per step x turns per row, summed over steps); Turns/row = mean "
        "over steps of the model turns a trained row holds (segments: rollout/segment_turns_mean; "
        "else the SORL losses' response-mask turns actor/sorl/turns_per_seq; else, whole episodes, verl's "
        "num_turns/mean / 2); Train min = verl's step timer summed (rollout, updates, "
        "checkpoints; no validation or start-up). Means over training steps: Turn-pos. std = "
        f"{TURN_POSITION_STD} (segment arms only: the trainer logs no turn positions for whole episodes), "
        f"Token clip = actor/pg_clipfrac, Correction scale = {CORRECTION_SCALE} (SORL losses only). "
        "'-': not logged.",
        "",
        "| Task | Pressure | Method | Arm | Seeds | Steps | " + " | ".join(c for c, _ in SEGMENT_COLUMNS) + " |",
        "|:---|:---|:---|:---|---:|---:|" + "---:|" * len(SEGMENT_COLUMNS),
    ]
    for (task, pressure, _, arm), rs in _segment_groups(results).items():
        steps = sorted({r.steps[-1] for r in rs})
        stats = [Stat.of([read(r) for r in rs]).text(SEGMENT_DIGITS.get(column, 3)) for column, read in SEGMENT_COLUMNS]
        row = [task, pressure, rs[0].label, arm, str(len(rs)), "/".join(map(str, steps)), *stats]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the figure

# (title, x axis, y axis); drawn 3 to a row, two rows per (task, pressure)
SEGMENT_PANELS = (
    ("validation vs step", "training step", "validation score"),
    ("validation vs trained turns", "trained model turns (measured)", "validation score"),
    ("validation vs training wall time", "training wall time (min)", "validation score"),
    ("turn-position spread", "training step", TURN_POSITION_STD),
    ("token clip fraction", "training step", "actor/pg_clipfrac"),
    ("correction scale", "training step", CORRECTION_SCALE),
)


def _measured_curve(rs: list[RunResult], xs_of) -> tuple[list[float], list[float]]:
    """(mean x, mean score) over seeds at the validation steps every seed measured."""
    curves = [(r.steps, xs_of(r), r.scores) for r in rs if xs_of(r) is not None]
    if not curves:
        return [], []
    common = sorted(set.intersection(*(set(steps) for steps, _, _ in curves)))
    xs, ys = [], []
    for step in common:
        xs.append(statistics.fmean(x[steps.index(step)] for steps, x, _ in curves))
        ys.append(statistics.fmean(y[steps.index(step)] for steps, _, y in curves))
    return xs, ys


def plot_segments(results: list[RunResult], out: Path) -> int:
    """The SEGMENT_PANELS per (task, pressure), in two rows of three; a line per (method, arm): colour =
    arm, line style = method; the mean over seeds. The per-step panels (second row) draw the runs whose
    folders are present (archived runs have no per-step metrics)."""
    import matplotlib.pyplot as plt

    rows: dict[tuple[str, str], dict[tuple[str, str], list[RunResult]]] = {}
    for (task, pressure, method, arm), rs in _segment_groups(results).items():
        rows.setdefault((task, pressure), {})[(method, arm)] = rs
    arms = sorted({r.arm for r in results}, key=arm_order)
    methods = sorted({r.method for r in results}, key=_method_order)
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    color = {arm: cycle[i % len(cycle)] for i, arm in enumerate(arms)}
    style = {m: ("-", "--", ":", "-.")[i % 4] for i, m in enumerate(methods)}
    runs = [r.run for r in results if r.run is not None]
    clip_metric = metric_for_panel(runs, _PANEL_PATTERNS["Token clip fraction"])
    per_step = {3: TURN_POSITION_STD, 4: clip_metric, 5: CORRECTION_SCALE}

    fig, grid = _grid(len(rows) * len(SEGMENT_PANELS), 3, 4.6, 3.4)
    order: dict[str, tuple] = {}  # legend: a column per arm, a row per method (matplotlib fills columns first)
    for i, ((task, pressure), series) in enumerate(rows.items()):
        axes = [grid[2 * i + j // 3][j % 3] for j in range(len(SEGMENT_PANELS))]
        for (method, arm), rs in series.items():
            kw = {"color": color[arm], "linestyle": style[method], "linewidth": 1.4}
            label = f"{rs[0].label} [{arm}]"  # the whole arm named too: the legend lists every arm
            order.setdefault(label, (arm_order(arm), _method_order(method)))
            xs, mean, _ = _mean_curve([(r.steps, r.scores) for r in rs])
            axes[0].plot(xs, mean, marker="o", markersize=3, label=label, **kw)
            for j, xs_of in ((1, lambda r: r.curve_turns), (2, lambda r: r.curve_wall)):
                xs, ys = _measured_curve(rs, xs_of)
                scale = 60 if j == 2 else 1
                axes[j].plot([x / scale for x in xs], ys, marker="o", markersize=3, **kw)
            for j, metric in per_step.items():
                if metric is None:
                    continue
                curves = [r.run.series(metric) for r in rs if r.run is not None]
                xs, mean, _ = _mean_curve([c for c in curves if c[0]])
                if xs:
                    axes[j].plot(xs, mean, **kw)
        for ax, (title, xlabel, ylabel) in zip(axes, SEGMENT_PANELS, strict=True):
            ax.set_title(f"{task} {pressure}: {title}", fontsize=9)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel, fontsize=8)
            ax.grid(alpha=0.3)
    handles, labels = [], []
    for ax in grid.flat:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    ranked = sorted(range(len(labels)), key=lambda k: order[labels[k]])
    handles, labels = [handles[k] for k in ranked], [labels[k] for k in ranked]
    ncol = max(1, min(len(arms), 5))
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    legend_rows = -(-len(labels) // ncol)
    fig.tight_layout(rect=(0, min(0.45, 0.3 * legend_rows / fig.get_figheight()), 1, 1))
    _save(fig, out)
    return len(rows)


def write_segment_report(results: list[RunResult], sweep_dir: Path) -> dict:
    """``segments.md`` and ``segments.png`` when the results hold segment-study runs (else both are
    removed: never a stale study beside a new table); returns what was written, notes and the table."""
    sweep_dir = Path(sweep_dir)
    study = study_results(results)
    written: dict[str, str] = {}
    if not study:
        for name in (SEGMENTS_MD, SEGMENTS_PNG):
            (sweep_dir / name).unlink(missing_ok=True)
        return {"written": written, "notes": []}
    notes = []
    unmeasured = sorted(r.name for r in study if r.curve_turns is None)
    if unmeasured:
        notes.append(f"{SEGMENTS_MD}: no trained-turn measure for {', '.join(unmeasured)} (left out of that panel)")
    markdown = segments_markdown(study)
    write_text_atomic(sweep_dir / SEGMENTS_MD, markdown)
    written[SEGMENTS_MD] = str(sweep_dir / SEGMENTS_MD)
    plot_segments(study, sweep_dir / SEGMENTS_PNG)
    written[SEGMENTS_PNG] = str(sweep_dir / SEGMENTS_PNG)
    return {"written": written, "notes": notes, "markdown": markdown}


# ---------------------------------------------------------------- the report


def write_report(sweep_dir: Path, archives: list[Path] | tuple[Path, ...] = ()) -> dict:
    """``stability.md``, ``stability.csv``, ``stability_runs.csv``, ``validation.png`` and
    ``diagnostics.png`` in the sweep folder, and ``segments.md`` / ``segments.png`` when segment-study
    runs are among them (:func:`write_segment_report`); returns what was written and the notes.

    ``archives``: earlier sittings' ``stability_runs.csv`` files, merged as :func:`load_results` says
    (in the tables, the runs CSV and the validation figures; not in the per-step panels).
    The validation and diagnostics figures draw whole-episode runs (their step axes are the
    benchmark's); the segment arms are drawn in ``segments.png``."""
    sweep_dir = Path(sweep_dir)
    results, notes = load_results(sweep_dir, archives)
    archived = sum(r.run is None for r in results)
    if archived:
        notes.append(f"{archived} archived runs (no per-step metrics) are left out of diagnostics.png")
    written: dict[str, str] = {}
    if not results:
        return {"runs": 0, "written": written, "notes": notes or ["no finished runs"]}
    segments = write_segment_report(results, sweep_dir)
    written.update(segments["written"])
    notes += segments["notes"]
    whole = [r for r in results if r.arm == WHOLE]
    cells = aggregate(results)
    markdown = to_markdown(cells)
    for name, text in (
        ("stability.md", markdown),
        ("stability_paper.md", paper_table(cells)),
        ("stability.csv", to_csv(cells)),
        ("stability_runs.csv", runs_csv(results)),
    ):
        write_text_atomic(sweep_dir / name, text)
        written[name] = str(sweep_dir / name)
    if whole:
        plot_validation(whole, sweep_dir / "validation.png")
        written["validation.png"] = str(sweep_dir / "validation.png")
    else:
        (sweep_dir / "validation.png").unlink(missing_ok=True)
    tasks = sorted({r.task for r in whole}, key=_task_order)
    for task in tasks if len(tasks) > 1 else ():  # one figure of validation curves per task family
        name = f"validation_{task}.png"
        plot_validation([r for r in whole if r.task == task], sweep_dir / name)
        written[name] = str(sweep_dir / name)
    drawn = plot_diagnostics(whole, sweep_dir / "diagnostics.png") if whole else []
    if drawn:
        written["diagnostics.png"] = str(sweep_dir / "diagnostics.png")
    else:
        (sweep_dir / "diagnostics.png").unlink(missing_ok=True)  # never leave a stale figure beside a new table
        notes.append("diagnostics.png: no run logged any clip fraction or SORL diagnostic")
    return {
        "runs": len(results),
        "cells": len(cells),
        "written": written,
        "notes": notes,
        "markdown": markdown,
        "diagnostics": drawn,
        "segments": segments.get("markdown"),
    }
