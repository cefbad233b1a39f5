"""The segment study's table and figure: ``segments.md`` and ``segments.png`` of a sweep folder.

The study (docs/stability.md#the-segment-study) compares, per task, pressure and method, whole
episodes with segment arms (``T<turns>-<resets>``, :class:`sorl_verl.stability.grid.Arm`). Its runs
are the ones of every (task, pressure, method) that has a segment arm among the finished (or
archived) runs: the whole-episode runs of the same cell are its ``whole`` arm.

Budget rule (grid.Arm.budget): a T arm runs ``max(1, L / T)`` times the whole-episode steps and
validation interval (``L``: the model turns a whole episode trains per trajectory, planned), so
every arm trains about the same number of model turns. The report does not take the plan on trust:
it shows the trained turns measured from the metrics
(:func:`sorl_verl.stability.analysis.segment_measures`) and plots validation against them.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from sorl_verl.fileio import write_text_atomic
from sorl_verl.stability.analysis import (
    CORRECTION_SCALE,
    TURN_POSITION_STD,
    RunResult,
    Stat,
    _mean_curve,
    _method_order,
    _pressure_order,
    _save,
    _task_order,
    arm_order,
)
from sorl_verl.stability.grid import WHOLE
from sorl_verl.tables.plot import STABILITY_PANELS, metric_for_panel

SEGMENTS_MD = "segments.md"
SEGMENTS_PNG = "segments.png"
_TOKEN_CLIP = dict(STABILITY_PANELS)["Token clip fraction"]

# (column, how a run's value is read), means ± std over seeds
COLUMNS = (
    ("Final", lambda r: r.final),
    ("Peak", lambda r: r.peak),
    ("Trained turns", lambda r: r.curve_turns[-1] if r.curve_turns else None),
    ("Turns/row", lambda r: r.turns_per_row),
    ("Train min", lambda r: r.curve_wall[-1] / 60 if r.curve_wall else None),
    ("Turn-pos. std", lambda r: r.turn_position_std),
    ("Token clip", lambda r: r.clip.get("Token clip")),
    ("Correction scale", lambda r: r.correction_scale),
)
DIGITS = {"Trained turns": 0, "Train min": 1, "Turns/row": 2}


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


def _groups(results: list[RunResult]) -> dict[tuple[str, str, str, str], list[RunResult]]:
    groups: dict[tuple[str, str, str, str], list[RunResult]] = {}
    for r in results:
        groups.setdefault((r.task, r.pressure, r.method, r.arm), []).append(r)
    return groups


def to_markdown(results: list[RunResult]) -> str:
    """One row per (task, pressure, method, arm): the COLUMNS as mean ± std over seeds."""
    lines = [
        "The segment study: validation score (mean over data sources) per method and arm, mean ± std over "
        "seeds. Arms: whole episodes, or segment mode with T model turns per segment and sync or staggered "
        "resets (T<T>-<resets>). Budget rule: a T arm runs max(1, L/T) times the whole-episode steps and "
        "validation interval (L: the model turns a whole episode trains per trajectory, planned), so every "
        "arm trains about the same number of model turns. Measured, not planned: Trained turns = model "
        "turns trained over the run (rows per step x turns per row, summed over steps); Turns/row = mean "
        "over steps of the turns a trained row holds (segments: rollout/segment_turns_mean; whole "
        "episodes: verl's num_turns/mean / 2); Train min = verl's step timer summed (rollout, updates, "
        "checkpoints; no validation or start-up). Means over training steps: Turn-pos. std = "
        f"{TURN_POSITION_STD} (segment arms only: the trainer logs no turn positions for whole episodes), "
        f"Token clip = actor/pg_clipfrac, Correction scale = {CORRECTION_SCALE} (SORL losses only). "
        "'-': not logged.",
        "",
        "| Task | Pressure | Method | Arm | Seeds | Steps | " + " | ".join(c for c, _ in COLUMNS) + " |",
        "|:---|:---|:---|:---|---:|---:|" + "---:|" * len(COLUMNS),
    ]
    for (task, pressure, _, arm), rs in _groups(results).items():
        steps = sorted({r.steps[-1] for r in rs})
        stats = [Stat.of([read(r) for r in rs]).text(DIGITS.get(column, 3)) for column, read in COLUMNS]
        row = [task, pressure, rs[0].label, arm, str(len(rs)), "/".join(map(str, steps)), *stats]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- the figure

# (title, x axis)
PANELS = (
    ("validation vs step", "training step"),
    ("validation vs trained turns", "trained model turns (measured)"),
    ("validation vs training wall time", "training wall time (min)"),
    ("turn-position std vs step", "training step"),
    ("token clip fraction vs step", "training step"),
    ("correction scale vs step", "training step"),
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
    """A row of PANELS per (task, pressure); a line per (method, arm): colour = arm, line style =
    method; the mean over seeds. The per-step panels draw runs whose folders are present."""
    import matplotlib.pyplot as plt

    from sorl_verl.stability.analysis import _grid

    rows: dict[tuple[str, str], dict[tuple[str, str], list[RunResult]]] = {}
    for (task, pressure, method, arm), rs in _groups(results).items():
        rows.setdefault((task, pressure), {})[(method, arm)] = rs
    arms = sorted({r.arm for r in results}, key=arm_order)
    methods = sorted({r.method for r in results}, key=_method_order)
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    color = {arm: cycle[i % len(cycle)] for i, arm in enumerate(arms)}
    style = {m: ("-", "--", ":", "-.")[i % 4] for i, m in enumerate(methods)}
    runs = [r.run for r in results if r.run is not None]
    clip_metric = metric_for_panel(runs, _TOKEN_CLIP)
    per_step = {3: TURN_POSITION_STD, 4: clip_metric, 5: CORRECTION_SCALE}

    fig, axes = _grid(len(rows) * len(PANELS), len(PANELS), 4.0, 3.2)
    for i, ((task, pressure), series) in enumerate(rows.items()):
        for (method, arm), rs in series.items():
            kw = {"color": color[arm], "linestyle": style[method], "linewidth": 1.4}
            label = f"{rs[0].label} [{arm}]"  # the whole arm named too: the legend lists every arm
            xs, mean, _ = _mean_curve([(r.steps, r.scores) for r in rs])
            axes[i][0].plot(xs, mean, marker="o", markersize=3, label=label, **kw)
            for j, xs_of in ((1, lambda r: r.curve_turns), (2, lambda r: r.curve_wall)):
                xs, ys = _measured_curve(rs, xs_of)
                scale = 60 if j == 2 else 1
                axes[i][j].plot([x / scale for x in xs], ys, marker="o", markersize=3, **kw)
            for j, metric in per_step.items():
                if metric is None:
                    continue
                curves = [r.run.series(metric) for r in rs if r.run is not None]
                xs, mean, _ = _mean_curve([c for c in curves if c[0]])
                if xs:
                    axes[i][j].plot(xs, mean, **kw)
        for j, (title, xlabel) in enumerate(PANELS):
            ax = axes[i][j]
            ax.set_title(f"{task} {pressure}: {title}", fontsize=8)
            ax.set_xlabel(xlabel)
            ax.grid(alpha=0.3)
        axes[i][0].set_ylabel("validation score")
    handles, labels = [], []
    for ax in axes.flat:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    fig.legend(handles, labels, loc="lower center", ncol=min(5, max(1, len(labels))), fontsize=8, frameon=False)
    legend_rows = -(-len(labels) // 5)
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
    markdown = to_markdown(study)
    write_text_atomic(sweep_dir / SEGMENTS_MD, markdown)
    written[SEGMENTS_MD] = str(sweep_dir / SEGMENTS_MD)
    plot_segments(study, sweep_dir / SEGMENTS_PNG)
    written[SEGMENTS_PNG] = str(sweep_dir / SEGMENTS_PNG)
    return {"written": written, "notes": notes, "markdown": markdown}
