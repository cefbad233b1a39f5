"""The stability report: figures of validation curves and diagnostics, the segment study's table
and figure, and :func:`write_report`, which writes them all into a sweep folder.

The per-run figures of merit, the archive and the tables are :mod:`sorl_verl.stability.analysis`.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from sorl_verl.fileio import write_text_atomic
from sorl_verl.stability.analysis import (
    CORRECTION_SCALE,
    STEP_SERIES,
    TURN_POSITION_MEAN,
    TURN_POSITION_STD,
    RunResult,
    Stat,
    aggregate,
    arm_order,
    load_results,
    method_order,
    mixed_warm_starts,
    paper_table,
    pressure_order,
    runs_csv,
    table_order,
    task_order,
    to_csv,
    to_markdown,
)
from sorl_verl.stability.grid import METHODS, WHOLE
from sorl_verl.tables.plot import STABILITY_PANELS, metric_for_panel

# ---------------------------------------------------------------- the figures


def _mean_curve(
    curves: list[tuple[list[int], list[float]]],
) -> tuple[list[int], list[float], list[float], list[float]]:
    """(steps every curve has, mean, min, max) of several (steps, values) curves."""
    if not curves:
        return [], [], [], []
    common = sorted(set.intersection(*(set(xs) for xs, _ in curves)))
    maps = [dict(zip(xs, ys, strict=True)) for xs, ys in curves]
    columns = [[m[step] for m in maps] for step in common]
    return common, [statistics.fmean(v) for v in columns], [min(v) for v in columns], [max(v) for v in columns]


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
    methods = sorted({r.method for r in results}, key=method_order)
    return {
        m: cycle[method_order(m)[0] % len(cycle)] if m in METHODS else cycle[i % len(cycle)]
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
    order = {r.label: method_order(r.method) for r in results}
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
    """Validation score vs step, one panel per pressure, one line per method: the mean over seeds,
    shaded from the lowest to the highest seed (a score's range, where mean ± std of three seeds
    would leave it)."""
    grouped = _by_pressure_method(results)
    colors = _colors(results)
    fig, axes = _grid(len(grouped), min(4, len(grouped)), 4.6, 3.6)
    for ax, (pressure, by_method) in zip(axes.flat, grouped.items(), strict=False):
        for method, rs in by_method.items():
            xs, mean, low, high = _mean_curve([(r.steps, r.scores) for r in rs])
            color = colors[method]
            ax.plot(xs, mean, marker="o", markersize=3, linewidth=1.5, color=color, label=f"{rs[0].label}")
            if len(rs) > 1:
                ax.fill_between(xs, low, high, color=color, alpha=0.15, linewidth=0)
        ax.set_title(_panel_title(next(iter(by_method.values())), pressure), fontsize=9)
        ax.set_xlabel("training step")
        ax.set_ylabel("validation score")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(grouped) :]:
        ax.axis("off")
    _legend(fig, axes, results)
    _save(fig, out)
    return len(grouped)


def task_panels(results: list[RunResult]) -> list[tuple[str, list[RunResult]]]:
    """The panels of one task family's figure (:func:`plot_task_validation`): one per (method,
    pressure) in the paper table's row order, titled with the method, the pressure and collapsed k/n."""
    groups: dict[tuple[str, str], list[RunResult]] = {}
    for r in sorted(results, key=lambda r: (method_order(r.method), pressure_order(r.pressure), r.seed)):
        groups.setdefault((r.method, r.pressure), []).append(r)
    return [
        (f"{rs[0].label}, {pressure}: collapsed {sum(r.collapsed for r in rs)}/{len(rs)}", rs)
        for (_, pressure), rs in groups.items()
    ]


def plot_task_validation(results: list[RunResult], out: Path) -> int:
    """One task family's validation curves, a panel per method (:func:`task_panels`): each seed's
    curve (thin, numbered at its end) and their mean (bold) over the seeds' mean warm start (dashed),
    on one score axis, so a collapse and a spread between seeds are seen at a glance; returns the
    number of panels."""
    from matplotlib.ticker import MaxNLocator

    panels = task_panels(results)
    fig, axes = _grid(len(panels), min(4, len(panels)), 3.3, 2.6)
    for ax, (title, rs) in zip(axes.flat, panels, strict=False):
        for r in rs:
            ax.plot(r.steps, r.scores, linewidth=0.9, alpha=0.55, color="tab:blue")
            ax.annotate(str(r.seed), (r.steps[-1], r.scores[-1]), fontsize=7, color="tab:blue",
                        xytext=(3, 0), textcoords="offset points", va="center")  # fmt: skip
        xs, mean, *_ = _mean_curve([(r.steps, r.scores) for r in rs])
        ax.plot(xs, mean, linewidth=2.0, color="black")
        ax.axhline(statistics.fmean(r.warm for r in rs), color="gray", linestyle="--", linewidth=0.9)
        ax.set_title(title, fontsize=8)
        ax.set_ylim(-0.03, 1.03)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_xlabel("training step", fontsize=8)
        ax.set_ylabel("validation score", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(
        f"{results[0].task}: validation score per seed (thin, numbered), mean (bold), warm start (dashed)",
        fontsize=9,
    )
    fig.tight_layout()
    _save(fig, out)
    return len(panels)


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
                xs, mean, *_ = _mean_curve([c for c in curves if c[0]])
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
    ("Phase swing", lambda r: r.phase_swing),
    ("Token clip", lambda r: r.clip.get("Token clip")),
    ("Correction scale", lambda r: r.correction_scale),
)
SEGMENT_DIGITS = {"Trained turns": 0, "Train min": 1, "Turns/row": 2}


def study_results(results: list[RunResult]) -> list[RunResult]:
    """The runs of every (task, pressure, method) with a segment arm, in table order."""
    cells = {(r.task, r.pressure, r.method) for r in results if r.arm != WHOLE}
    study = [r for r in results if (r.task, r.pressure, r.method) in cells]
    return sorted(study, key=table_order)


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
        f"Phase swing = mean over consecutive steps of the change of the batch's mean turn position "
        f"({TURN_POSITION_MEAN}): how far a sync pool's batches swing between phases (0: the same mix every step), "
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
    arm, line style = method; the mean over seeds. The per-step panels (second row) draw each run's
    STEP_SERIES (kept in the archive too)."""
    import matplotlib.pyplot as plt

    rows: dict[tuple[str, str], dict[tuple[str, str], list[RunResult]]] = {}
    for (task, pressure, method, arm), rs in _segment_groups(results).items():
        rows.setdefault((task, pressure), {})[(method, arm)] = rs
    arms = sorted({r.arm for r in results}, key=arm_order)
    methods = sorted({r.method for r in results}, key=method_order)
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    color = {arm: cycle[i % len(cycle)] for i, arm in enumerate(arms)}
    style = {m: ("-", "--", ":", "-.")[i % 4] for i, m in enumerate(methods)}
    per_step = {3 + i: column for i, (column, _) in enumerate(STEP_SERIES)}

    fig, grid = _grid(len(rows) * len(SEGMENT_PANELS), 3, 4.6, 3.4)
    order: dict[str, tuple] = {}  # legend: a column per arm, a row per method (matplotlib fills columns first)
    for i, ((task, pressure), series) in enumerate(rows.items()):
        axes = [grid[2 * i + j // 3][j % 3] for j in range(len(SEGMENT_PANELS))]
        for (method, arm), rs in series.items():
            kw = {"color": color[arm], "linestyle": style[method], "linewidth": 1.4}
            label = f"{rs[0].label} [{arm}]"  # the whole arm named too: the legend lists every arm
            order.setdefault(label, (arm_order(arm), method_order(method)))
            xs, mean, *_ = _mean_curve([(r.steps, r.scores) for r in rs])
            axes[0].plot(xs, mean, marker="o", markersize=3, label=label, **kw)
            for j, xs_of in ((1, lambda r: r.curve_turns), (2, lambda r: r.curve_wall)):
                xs, ys = _measured_curve(rs, xs_of)
                scale = 60 if j == 2 else 1
                axes[j].plot([x / scale for x in xs], ys, marker="o", markersize=3, **kw)
            for j, column in per_step.items():
                xs, mean, *_ = _mean_curve([r.step_series[column] for r in rs if column in r.step_series])
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
    mixed = mixed_warm_starts(results)
    if mixed:
        notes.append(mixed.strip())
    footer = f"\n{mixed}" if mixed else ""  # under both tables
    markdown = to_markdown(cells) + footer
    for name, text in (
        ("stability.md", markdown),
        ("stability_paper.md", paper_table(cells) + footer),
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
    tasks = sorted({r.task for r in whole}, key=task_order)
    for task in tasks if len(tasks) > 1 else ():  # one figure of validation curves per task family
        name = f"validation_{task}.png"
        plot_task_validation([r for r in whole if r.task == task], sweep_dir / name)
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
