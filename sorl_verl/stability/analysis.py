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
:func:`sorl_verl.stability.report.write_segment_report`): trained model turns per step, measured from the metrics,
and the training wall time, both cumulated at every validation step; the mean turn-position spread
and the mean correction scale.
"""

from __future__ import annotations

import csv
import io
import re
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

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
PANEL_PATTERNS = dict(STABILITY_PANELS)

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
# the batch's mean turn position; its step-to-step change is the sync pool's rhythm (phase_swing)
TURN_POSITION_MEAN = "rollout/turn_position_mean"
CORRECTION_SCALE = METRIC_PREFIX + "norm_scale"
STEP_SECONDS = "timing_s/step"  # verl's step timer: rollout, updates, checkpoint; not validation or start-up
# The segment figure's per-step panels, kept in each run's row so that a study spanning sittings draws
# them from its archive: (archive column, metric); None = the token clip metric the runs log (the
# first of CLIP_COLUMNS).
STEP_SERIES = (
    ("steps_turn_position_std", TURN_POSITION_STD),
    ("steps_token_clip", None),
    ("steps_correction_scale", CORRECTION_SCALE),
)


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
    phase_swing: float | None = None
    # STEP_SERIES column -> (steps, values) where the run logged the metric
    step_series: dict[str, tuple[list[int], list[float]]] = field(default_factory=dict)


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


def mean_step_change(run: Run, metric: str) -> float | None:
    """Mean of ``|value(s + 1) - value(s)|`` over the consecutive steps that logged ``metric``; None below
    two. Of the batch's mean turn position: how far the batch's phase moves from one step to the next
    (0 for a pool whose batches hold the same mix of turns every step)."""
    steps, values = run.series(metric)
    changes = [abs(b - a) for s, t, a, b in zip(steps, steps[1:], values, values[1:], strict=False) if t == s + 1]
    return statistics.fmean(changes) if changes else None


def segment_measures(run: Run, steps: list[int], rows_per_step: int | None, whole: bool) -> dict:
    """The segment study's measures of one run: ``curve_turns`` (trained model turns, = rows per step x
    turns per row, cumulated at each of ``steps``), ``curve_wall`` (seconds of verl's step timer,
    cumulated), ``turns_per_row``, ``turn_position_std`` and ``correction_scale`` (means over training
    steps; None when not logged) and ``phase_swing`` (:func:`mean_step_change` of the mean turn position)."""
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
        "phase_swing": mean_step_change(run, TURN_POSITION_MEAN),
    }


def step_series(run: Run, token_clip: str | None) -> dict[str, tuple[list[int], list[float]]]:
    """The run's STEP_SERIES that it logged; ``token_clip``: the token clip metric's name."""
    series = {}
    for column, metric in STEP_SERIES:
        name = metric or token_clip
        steps, values = run.series(name) if name else ([], [])
        if steps:
            series[column] = (steps, values)
    return series


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
        step_series=step_series(run, clip_metrics.get(CLIP_COLUMNS[0][0])),
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
    clip_metrics = {column: metric_for_panel(runs, PANEL_PATTERNS[title]) for column, title in CLIP_COLUMNS}
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
    results.sort(key=table_order)
    return results, notes


def table_order(r: RunResult) -> tuple:
    """The sort key of runs in tables and figures: task, pressure, method, arm, seed."""
    return task_order(r.task), pressure_order(r.pressure), method_order(r.method), arm_order(r.arm), r.seed


def csv_key(column: str) -> str:
    """``"Token clip"`` -> ``"token_clip"``: a table column's name in the CSV files."""
    return column.lower().replace(" ", "_")


# stability_runs.csv: what runs_csv writes and archived_results reads (``task`` may be absent: the
# default task, as in archives written before tasks were an axis; the trailing segment-study columns
# too: whole episodes, nothing measured, as in archives written before arms were an axis).
# curve_turns and curve_wall are ``step:value`` pairs at the curve's steps (cumulative trained model
# turns, cumulative seconds of verl's step timer); empty when not measured. The STEP_SERIES columns
# are ``step:value`` pairs at every step the run logged the metric (4 significant digits).
RUN_FIELDS = ("run", "pressure", "algo", "method", "seed", "warm", "peak", "final", "auc", "collapsed")
SEGMENT_FIELDS = ("arm", "turns_per_row", "turn_position_std", "correction_scale", "curve_turns", "curve_wall")
RUNS_CSV_COLUMNS = (
    "task",
    *RUN_FIELDS,
    *(csv_key(c) for c, _ in CLIP_COLUMNS),
    "curve",
    *SEGMENT_FIELDS,
    *(column for column, _ in STEP_SERIES),
    "phase_swing",
)


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


def _format_curve(steps: list[int], values: list[float] | None, spec: str) -> str:
    """``step:value`` pairs, each value in the format ``spec`` (``".4f"``); "" when ``values`` is None."""
    return "" if values is None else " ".join(f"{s}:{v:{spec}}" for s, v in zip(steps, values, strict=True))


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
    the curve at its 4 decimals; archived runs keep only the STEP_SERIES of their per-step metrics
    (``run`` is None), so the diagnostics figure leaves them out and the segment figure draws them.
    Raises :class:`ArchiveError` naming the row and field.
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
            for field_name in ("turns_per_row", "turn_position_std", "correction_scale", "phase_swing"):
                measured[field_name] = float(row[field_name]) if row.get(field_name) else None
            for field_name in ("curve_turns", "curve_wall"):
                measured[field_name] = _parse_measured_curve(row.get(field_name), steps)
            series = {}
            for field_name, _ in STEP_SERIES:
                if row.get(field_name):
                    series[field_name] = _parse_curve(row[field_name])
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
                step_series=series,
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


def pressure_order(name: str) -> tuple[int, str]:
    order = list(PRESSURES)
    return (order.index(name) if name in order else len(order), name)


def method_order(name: str) -> tuple[int, str]:
    return (METHODS.index(name) if name in METHODS else len(METHODS), name)


TASK_ORDER = ("search", "multihop", "multihop_long", "medical")


def task_order(name: str) -> tuple[int, str]:
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


def mixed_warm_starts(results: list[RunResult], digits: int = 3) -> str:
    """A paragraph naming every (task, seed) whose runs started from different warm starts ("" if none).

    A seed's warm start is made once per sweep folder, and its bits can differ between machines (their
    kernels' sums; also seen between sittings on machines of one kind), so runs of one seed made in
    different sittings can start from different models even with the same settings. Told apart by the
    step-0 validation score (every method validates the same model greedily on the same questions, so
    one warm start gives one score; two warm starts with the same score are not told apart)."""
    groups: dict[tuple[str, int], dict[float, list[str]]] = {}
    for r in results:
        titles = groups.setdefault((r.task, r.seed), {}).setdefault(round(r.warm, 4), [])
        titles.append(r.label if r.pressure == "reuse_8x8" else f"{r.label} at {r.pressure}")
    lines = []
    for (task, seed), by_warm in sorted(groups.items(), key=lambda kv: (task_order(kv[0][0]), kv[0][1])):
        if len(by_warm) > 1:
            # smallest group first; only the largest, when long, is "the others"
            ordered = sorted(by_warm.items(), key=lambda kv: len(kv[1]))
            parts = "; ".join(
                f"{warm:.{digits}f} ({len(t)} run{'s' if len(t) > 1 else ''}: "
                f"{'the others' if k == len(ordered) - 1 and len(t) > 4 else ', '.join(sorted(t))})"
                for k, (warm, t) in enumerate(ordered)
            )
            lines.append(f"{task} seed {seed}: {parts}")
    if not lines:
        return ""
    return (
        "Warm starts differ within a seed (runs made in different sittings: a seed's warm start is rebuilt "
        "in each sweep folder and has not always come out the same; step-0 validation score, runs): "
        + " | ".join(lines)
        + ".\n"
    )


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
    tasks = sorted({c.task for c in cells}, key=task_order)
    rows: dict[tuple[str, str, str], dict[str, Cell]] = {}
    for c in sorted(cells, key=lambda c: (method_order(c.method), pressure_order(c.pressure), arm_order(c.arm))):
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
        curve = _format_curve(r.steps, r.scores, ".4f")
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
            + [_format_curve(r.steps, r.curve_turns, ".1f"), _format_curve(r.steps, r.curve_wall, ".1f")]
            + [_format_curve(*r.step_series.get(c, ([], [])), ".4g") for c, _ in STEP_SERIES]
            + [_num(r.phase_swing)]
        )
    return _csv(rows)
