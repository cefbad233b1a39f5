"""Curves of several runs in one PNG: validation score vs step, then training-stability metrics.

The first panel is each run's mean validation score over its datasets at every validation
step that covers all of them (the quantity ``--select best`` maximizes). The other panels
are the stability diagnostics the paper discusses (clipping-bias norm, clip fractions,
gradient norm), each drawn only when some run logged it. Which names are looked for is
:data:`STABILITY_PANELS`; a panel takes the first pattern any run matches.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from sorl_verl.recipes import METRIC_PREFIX
from sorl_verl.tables.runs import Run

# (panel title, metric-name patterns in order of preference). verl's own names are
# actor/pg_clipfrac, actor/grad_norm and actor/ppo_kl; the actor/sorl/* names are those of
# sorl_verl.algos' diagnostics.
STABILITY_PANELS: list[tuple[str, list[str]]] = [
    # c_tok: per-token RMS of the clipped tokens' ratio x advantage (sorl_verl.algos.correction);
    # c_norm: its name before the batch-level correction (older runs)
    ("Clipping-bias norm C", [METRIC_PREFIX + "c_tok", METRIC_PREFIX + "c_norm"]),
    ("Normalization scale s", [METRIC_PREFIX + "norm_scale"]),
    ("Token clip fraction", [r"actor/pg_clipfrac"]),
    ("Turn clip fraction", [METRIC_PREFIX + "clipfrac_turn"]),
    ("Actor gradient norm", [r"actor/grad_norm"]),
    ("Approx. KL to rollout policy", [r"actor/ppo_kl"]),
    # logged by the asynchronous trainers only (sorl_verl.algos.async_trainers): stale-rollout pressure
    ("Turn staleness (mean)", [METRIC_PREFIX + "turn_staleness_mean"]),
]


def run_label(run: Run) -> str:
    return f"{run.model} {run.method}"


def mean_validation_curve(run: Run) -> tuple[list[int], list[float]]:
    """(steps, mean score over the run's datasets) at the steps that validated all of them."""
    sources = list(run.validation.values())
    steps = sorted(set.intersection(*(set(s) for s in sources))) if sources else []
    return steps, [sum(s[step] for s in sources) / len(sources) for step in steps]


def metric_for_panel(runs: list[Run], patterns: list[str]) -> str | None:
    """The first metric name, in ``patterns`` order, that any of ``runs`` logged (None if none)."""
    names = {name for run in runs for metrics in run.steps.values() for name in metrics}
    for pattern in patterns:
        hits = sorted(n for n in names if re.fullmatch(pattern, n))
        if hits:
            return hits[0]
    return None


@dataclass(frozen=True)
class Derived:
    """A panel whose curve is ``fn(value)`` of its metric at every step, not the metric itself.

    ``label`` replaces the metric's name under the panel's title (``{metric}`` stands for it),
    so the title says what is drawn.
    """

    label: str
    fn: Callable[[float], float]


# (title, patterns) as in STABILITY_PANELS, or (title, patterns, Derived) for a computed curve
Panel = tuple[str, list[str]] | tuple[str, list[str], Derived]
Curve = tuple[list[int], list[float]]


def panel_curves(runs: list[Run], extra_panels: Sequence[Panel] = ()) -> list[tuple[str, list[Curve]]]:
    """``(title, one (steps, values) curve per run)`` of every panel to draw, in order.

    First the mean validation score, then :data:`STABILITY_PANELS` and ``extra_panels`` that
    some run logged (a panel nobody logged is left out).
    """
    panels = [("Validation score (mean over datasets)", [mean_validation_curve(run) for run in runs])]
    for title, patterns, *derived in [*STABILITY_PANELS, *extra_panels]:
        metric = metric_for_panel(runs, patterns)
        if metric is None:
            continue
        curves = [run.series(metric) for run in runs]
        if derived:
            curves = [(xs, [derived[0].fn(y) for y in ys]) for xs, ys in curves]
            metric = derived[0].label.format(metric=metric)
        panels.append((f"{title}\n{metric}", curves))
    return panels


def plot_runs(runs: list[Run], out: str | Path, extra_panels: Sequence[Panel] = ()) -> list[str]:
    """Write the PNG (atomically) and return the titles of the panels drawn.

    ``extra_panels`` (see :data:`Panel`) are drawn after :data:`STABILITY_PANELS`, e.g. the
    quick start's training reward.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = panel_curves(runs, extra_panels)

    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(5.2 * ncols, 3.8 * nrows), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (title, curves) in zip(axes.flat, panels, strict=False):
        for i, (run, (xs, ys)) in enumerate(zip(runs, curves, strict=True)):
            if xs:
                # Few validation points: markers make each one visible; dense training curves: lines only.
                marker = "o" if len(xs) <= 30 else None
                ax.plot(
                    xs,
                    ys,
                    marker=marker,
                    markersize=3,
                    linewidth=1.4,
                    color=colors[i % len(colors)],
                    label=run_label(run),
                )
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("training step")
        ax.grid(alpha=0.3)
    spare = list(axes.flat)[len(panels) :]
    for ax in spare:
        ax.axis("off")
    handles, labels = [], []
    for ax in axes.flat:
        handles, labels = ax.get_legend_handles_labels()
        if handles:
            break
    if handles and spare:
        # An unused grid cell holds the legend, so it never crowds the curves.
        spare[0].legend(handles, labels, loc="center", fontsize=9, frameon=False)
        fig.tight_layout()
    elif handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=9, frameon=False)
        fig.tight_layout(rect=(0, 0.05 * math.ceil(len(labels) / 4) + 0.01, 1, 1))
    else:
        fig.tight_layout()

    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    try:
        fig.savefig(tmp, dpi=120, format="png")
        tmp.replace(out)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
    return [t for t, _ in panels]
