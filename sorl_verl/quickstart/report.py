"""Plots and the summary table of a quick-start run, from verl's metrics JSONL.

verl's file logger (``trainer.logger=[...,'file']``, path from ``VERL_FILE_LOGGER_PATH``)
writes one ``{"step": s, "data": {metric: value}}`` line per ``logger.log`` call: the
validation before training at step 0 (or at the resumed step), then one line per training
step (holding that step's validation when ``trainer.test_freq`` hits). The logger truncates
its file when it opens it, so a resumed run writes a new file; :func:`load_metrics` merges
several files by step (a later file wins for the same metric).

Metric names are verl's (``val-core/<source>/reward/mean@1``, ``actor/pg_clipfrac``,
``num_turns/mean``) and sorl-verl's (``actor/sorl/...``); each plot lists the names it
accepts, in order of preference, so the same report works for every algorithm and shows
what a variant does not log instead of failing.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

VAL_REWARD_PATTERN = re.compile(r"^val-core/(?P<source>[^/]+)/(acc|reward)/mean@\d+$")


def load_metrics(paths: Iterable[str | Path]) -> dict[int, dict[str, float]]:
    """Read metrics JSONL files into ``{step: {name: value}}`` (files in order; later wins).

    Non-numeric values are dropped. Raises ``ValueError`` naming the file and line for a
    malformed line.
    """
    merged: dict[int, dict[str, float]] = {}
    for path in paths:
        path = Path(path)
        for line_number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                step = int(row["step"])
                data = row["data"]
                if not isinstance(data, dict):
                    raise TypeError("field 'data' is not an object")
            except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{path}:{line_number}: not a verl file-logger line ({e})") from None
            values = merged.setdefault(step, {})
            for name, value in data.items():
                if isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                values[name] = float(value)
    return merged


def val_reward(metrics: dict[str, float]) -> float | None:
    """Mean validation reward of one logged step (mean over data sources), or ``None``."""
    values = [v for k, v in metrics.items() if VAL_REWARD_PATTERN.match(k) and math.isfinite(v)]
    return sum(values) / len(values) if values else None


def series(history: dict[int, dict[str, float]], names: Sequence[str]) -> tuple[str | None, list[int], list[float]]:
    """The first of ``names`` that was logged, as ``(name, steps, values)``; ``(None, [], [])`` if none."""
    for name in names:
        points = [(step, m[name]) for step, m in sorted(history.items()) if name in m and math.isfinite(m[name])]
        if points:
            return name, [s for s, _ in points], [v for _, v in points]
    return None, [], []


@dataclass(frozen=True)
class PlotSpec:
    filename: str
    title: str
    ylabel: str
    curves: tuple[tuple[str, tuple[str, ...]], ...]  # (label, accepted metric names in order)


PLOTS = (
    PlotSpec(
        "clip_fraction.png",
        "Clip fraction per training step",
        "fraction",
        (
            ("token clip fraction", ("actor/pg_clipfrac",)),
            ("turn clip fraction", ("actor/sorl/clipfrac_turn",)),
        ),
    ),
    PlotSpec(
        "clip_bias_norm.png",
        "Clipping-bias norm per training step",
        "norm",
        (("clipping-bias norm C_norm", ("actor/sorl/c_norm",)),),
    ),
    PlotSpec(
        "norm_scale.png",
        "Normalization scale per training step",
        "scale",
        (("normalization scale", ("actor/sorl/norm_scale",)),),
    ),
    PlotSpec(
        "train_reward.png",
        "Training reward (rollouts) per step",
        "reward",
        (("mean score", ("critic/score/mean",)),),
    ),
)


def write_plots(history: dict[int, dict[str, float]], out_dir: str | Path, title_prefix: str = "") -> dict[str, str]:
    """Write the PNG plots into ``out_dir``; returns ``{filename: "written" | reason skipped}``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    status: dict[str, str] = {}

    steps = [s for s, m in sorted(history.items()) if val_reward(m) is not None]
    if steps:
        fig, ax = plt.subplots(figsize=(5, 3.2))
        ax.plot(steps, [val_reward(history[s]) for s in steps], marker="o")
        ax.set(title=f"{title_prefix}Validation reward (exact match)", xlabel="training step", ylabel="reward")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out_dir / "val_reward.png", dpi=100)
        plt.close(fig)
        status["val_reward.png"] = "written"
    else:
        status["val_reward.png"] = "no validation metrics logged"

    for spec in PLOTS:
        fig, ax = plt.subplots(figsize=(5, 3.2))
        drawn = []
        for label, names in spec.curves:
            name, xs, ys = series(history, names)
            if name is not None:
                ax.plot(xs, ys, marker=".", label=f"{label} ({name})")
                drawn.append(name)
        if drawn:
            ax.set(title=f"{title_prefix}{spec.title}", xlabel="training step", ylabel=spec.ylabel)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
            fig.tight_layout()
            fig.savefig(out_dir / spec.filename, dpi=100)
            status[spec.filename] = "written"
        else:
            accepted = ", ".join(n for _, names in spec.curves for n in names)
            status[spec.filename] = f"not logged by this algorithm (looked for {accepted})"
        plt.close(fig)
    return status


@dataclass(frozen=True)
class Summary:
    val_reward_before: float | None
    val_reward_after: float | None
    first_step: int | None
    last_step: int | None
    turns_before: float | None  # model turns per validation trajectory (see summarize)
    turns_after: float | None
    token_clip_frac: float | None  # mean over training steps
    turn_clip_frac: float | None

    def rows(self) -> list[tuple[str, str]]:
        def fmt(x: float | None) -> str:
            return "n/a" if x is None else f"{x:.3f}"

        return [
            ("validation reward (before -> after)", f"{fmt(self.val_reward_before)} -> {fmt(self.val_reward_after)}"),
            ("validation steps (before, after)", f"{self.first_step}, {self.last_step}"),
            ("model turns per trajectory, validation (before -> after)", f"{fmt(self.turns_before)} -> {fmt(self.turns_after)}"),
            ("token clip fraction (mean over steps)", fmt(self.token_clip_frac)),
            ("turn clip fraction (mean over steps)", fmt(self.turn_clip_frac)),
        ]


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _half(x: float | None) -> float | None:
    return None if x is None else x / 2


def summarize(history: dict[int, dict[str, float]]) -> Summary:
    """Reward before/after (first and last logged validation), turns, mean clip fractions.

    Turns: verl's ``num_turns`` counts the user turn, every model turn and every observation;
    a ``search_r1`` trajectory of ``m`` model turns has ``m - 1`` observations, so ``m`` is
    ``num_turns / 2`` (exact unless an observation was cut by the length budget).
    """
    val_steps = [s for s, m in sorted(history.items()) if val_reward(m) is not None]
    first, last = (val_steps[0], val_steps[-1]) if val_steps else (None, None)
    turn_name = "val-aux/num_turns/mean"
    _, _, token_clip = series(history, ("actor/pg_clipfrac",))
    _, _, turn_clip = series(history, ("actor/sorl/clipfrac_turn",))
    return Summary(
        val_reward_before=val_reward(history[first]) if first is not None else None,
        val_reward_after=val_reward(history[last]) if last is not None else None,
        first_step=first,
        last_step=last,
        turns_before=_half(history[first].get(turn_name)) if first is not None else None,
        turns_after=_half(history[last].get(turn_name)) if last is not None else None,
        token_clip_frac=_mean(token_clip),
        turn_clip_frac=_mean(turn_clip),
    )


def format_table(rows: Sequence[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CONSOLE_STEP = re.compile(r"(?:^|\) )step:(\d+)((?: - [^\n]*)?)$")
# verl pprint-s numpy scalars as e.g. ``np.float64(0.25)``
_CONSOLE_NUMBER = re.compile(r"^(?:np\.\w+\()?([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))\)?$")


def parse_console_line(line: str) -> tuple[int, dict[str, float]] | None:
    """verl's console logger line ``step:N - name:value - ...`` as ``(N, {name: value})``, else ``None``.

    Accepts Ray's ``(TaskRunner pid=...)`` prefix and colour codes, and numpy scalar reprs.
    """
    match = _CONSOLE_STEP.search(_ANSI.sub("", line.rstrip("\n")))
    if match is None:
        return None
    values: dict[str, float] = {}
    for part in match.group(2).split(" - ")[1:]:
        name, sep, raw = part.rpartition(":")
        number = _CONSOLE_NUMBER.match(raw.strip()) if sep else None
        if number is not None:
            values[name] = float(number.group(1))
    return int(match.group(1)), values


def progress_line(step: int, values: dict[str, float], elapsed_s: float) -> str:
    """One short line per logged step for the terminal (the full line goes to train.log)."""
    parts = [f"[{elapsed_s / 60:5.1f} min] step {step:3d}"]
    if "critic/score/mean" in values:
        parts.append(f"train reward {values['critic/score/mean']:.3f}")
    reward = val_reward(values)
    if reward is not None:
        parts.append(f"VALIDATION reward {reward:.3f}")
    if "actor/pg_clipfrac" in values:
        parts.append(f"token clip {values['actor/pg_clipfrac']:.3f}")
    if "actor/sorl/clipfrac_turn" in values:
        parts.append(f"turn clip {values['actor/sorl/clipfrac_turn']:.3f}")
    if "timing_s/step" in values:
        parts.append(f"{values['timing_s/step']:.1f} s/step")
    return " | ".join(parts)
