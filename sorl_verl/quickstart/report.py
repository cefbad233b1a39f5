"""The summary numbers of a quick-start run, and the terminal's one line per trainer step.

Metrics are read with the project's one reader, :mod:`sorl_verl.tables` (``read_metrics``
merges the run's ``metrics-*.jsonl`` files, one per launch; ``validation_scores`` picks
verl's ``val-core/<source>/<acc|reward>/mean@<n>``); plots are drawn by
:func:`sorl_verl.tables.plot.plot_runs`. This module only adds what is specific to the
quick start: the before -> after summary, the turn count of a ``search_r1`` trajectory,
the per-phase step timings, and the parsing of verl's console lines for the progress filter.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from sorl_verl.recipes import METRIC_PREFIX
from sorl_verl.tables.plot import mean_validation_curve
from sorl_verl.tables.runs import Run, validation_scores

TRAIN_REWARD = "critic/score/mean"
TOKEN_CLIP = "actor/pg_clipfrac"
TURN_CLIP = METRIC_PREFIX + "clipfrac_turn"
# verl's turn count (the user turn, every model turn, every observation): training batch, validation
TRAIN_TURNS = "num_turns/mean"
VAL_TURNS = "val-aux/num_turns/mean"
# the asynchronous trainers' staleness metrics (sorl_verl.algos.async_trainers)
STALENESS_MEAN = METRIC_PREFIX + "turn_staleness_mean"
STALENESS_MAX = METRIC_PREFIX + "turn_staleness_max"
MIXED_SHARE = METRIC_PREFIX + "mixed_version_share"
# verl's marked_timer names (ray_trainer.fit): the phases of one training step
TIMING_PREFIX = "timing_s/"


def progress_validation(values: dict[str, float]) -> float | None:
    """Mean validation score over data sources in one console line's values, or ``None``."""
    scores = [by_step[0] for by_step in validation_scores({0: values}).values() if math.isfinite(by_step[0])]
    return sum(scores) / len(scores) if scores else None


def _series(steps: dict[int, dict[str, float]], name: str) -> list[float]:
    return [steps[s][name] for s in sorted(steps) if name in steps[s]]


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
    step_seconds: float | None = None  # median of timing_s/step over training steps
    timing: dict[str, float] = field(default_factory=dict)  # phase -> median seconds per step
    # asynchronous trainers only: turn staleness (mean over steps of the step's mean, max over
    # steps of the step's max) and the mean share of trajectories mixing weight versions
    staleness_mean: float | None = None
    staleness_max: float | None = None
    mixed_version_share: float | None = None

    def rows(self) -> list[tuple[str, str]]:
        def fmt(x: float | None) -> str:
            return "n/a" if x is None else f"{x:.3f}"

        rows = [
            ("validation reward (before -> after)", f"{fmt(self.val_reward_before)} -> {fmt(self.val_reward_after)}"),
            ("validation steps (before, after)", f"{self.first_step}, {self.last_step}"),
            (
                "model turns per trajectory, validation (before -> after)",
                f"{fmt(self.turns_before)} -> {fmt(self.turns_after)}",
            ),
            ("token clip fraction (mean over steps)", fmt(self.token_clip_frac)),
            ("turn clip fraction (mean over steps)", fmt(self.turn_clip_frac)),
        ]
        if self.staleness_mean is not None:
            rows.append(
                (
                    "turn staleness: mean, max; mixed-version share",
                    f"{fmt(self.staleness_mean)}, {fmt(self.staleness_max)}; {fmt(self.mixed_version_share)}",
                )
            )
        if self.step_seconds is not None:
            phases = ", ".join(f"{k} {v:.2f}" for k, v in self.timing.items() if k != "step")
            rows.append(("seconds per training step (median)", f"{self.step_seconds:.2f} ({phases})"))
        return rows


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def model_turns(num_turns: float | None) -> float | None:
    """Model turns of a ``search_r1`` trajectory from verl's ``num_turns`` (see :func:`summarize`)."""
    return None if num_turns is None else num_turns / 2


# the phases worth showing, in the order of a step; others (start_profile, ...) are noise
TIMING_PHASES = (
    "step",
    "gen",
    "reward",
    "old_log_prob",
    "ref",
    "values",
    "adv",
    "update_critic",
    "update_actor",
    "update_weights",
    "save_checkpoint",
    "testing",
)


def summarize(run: Run) -> Summary:
    """Reward before/after (first and last logged validation), turns, mean clip fractions, step timings, staleness.

    ``run`` is :func:`sorl_verl.tables.load_run`'s reading of the run folder; the
    validation score is the mean over data sources (``tables.plot.mean_validation_curve``).
    Turns: verl's ``num_turns`` counts the user turn, every model turn and every observation;
    a ``search_r1`` trajectory of ``m`` model turns has ``m - 1`` observations, so ``m`` is
    ``num_turns / 2`` (exact unless an observation was cut by the length budget).
    Timings: the median over training steps of each ``timing_s/<phase>`` verl logs (the
    median, because a step that validates or saves a checkpoint is much longer).
    """
    steps = run.steps
    val = dict(zip(*mean_validation_curve(run), strict=True))
    first, last = (min(val), max(val)) if val else (None, None)
    timing = {}
    for phase in TIMING_PHASES:
        values = [v for v in _series(steps, TIMING_PREFIX + phase) if math.isfinite(v)]
        if values:
            timing[phase] = round(statistics.median(values), 3)
    return Summary(
        val_reward_before=val[first] if first is not None else None,
        val_reward_after=val[last] if last is not None else None,
        first_step=first,
        last_step=last,
        turns_before=model_turns(steps[first].get(VAL_TURNS)) if first is not None else None,
        turns_after=model_turns(steps[last].get(VAL_TURNS)) if last is not None else None,
        token_clip_frac=_mean(_series(steps, TOKEN_CLIP)),
        turn_clip_frac=_mean(_series(steps, TURN_CLIP)),
        step_seconds=timing.get("step"),
        timing=timing,
        staleness_mean=_mean(_series(steps, STALENESS_MEAN)),
        staleness_max=max(_series(steps, STALENESS_MAX), default=None),
        mixed_version_share=_mean(_series(steps, MIXED_SHARE)),
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
    if TRAIN_REWARD in values:
        parts.append(f"train reward {values[TRAIN_REWARD]:.3f}")
    reward = progress_validation(values)
    if reward is not None:
        parts.append(f"VALIDATION reward {reward:.3f}")
    if TOKEN_CLIP in values:
        parts.append(f"token clip {values[TOKEN_CLIP]:.3f}")
    if TURN_CLIP in values:
        parts.append(f"turn clip {values[TURN_CLIP]:.3f}")
    if STALENESS_MEAN in values:
        parts.append(f"staleness {values[STALENESS_MEAN]:.2f}")
    if "timing_s/step" in values:
        parts.append(f"{values['timing_s/step']:.1f} s/step")
    return " | ".join(parts)
