"""Reading one training run folder: its metrics JSONL, its resolved config, its method name.

A run folder is what the recipes in ``examples/`` write (and what ``make demo`` writes):

- ``metrics*.jsonl``: verl's ``FileLogger`` output (``verl/utils/tracking.py``), one JSON
  object per line, ``{"step": int, "data": {metric_name: value}}``. verl opens that file
  with mode ``"wb"``, so a resumed run would overwrite its own history: the recipes give
  every launch its own ``metrics-<timestamp>.jsonl``, and this module merges all of them in
  name order (a later file wins a step both contain). Without any ``metrics*.jsonl`` the
  folder's other ``*.jsonl`` files are read (verl's default ``<experiment>.jsonl``).
- the resolved config: ``config.yaml``, ``resolved_config.yaml`` or Hydra's
  ``.hydra/config.yaml`` (the composed config with the command-line overrides applied).

Validation scores: verl's trainer logs ``val-core/<data_source>/<var>/mean@<n>`` where
``<var>`` is ``acc`` when the reward function returns one, else ``reward``, and ``<n>`` is
the number of validation samples per prompt (``process_validation_metrics`` and
``_val_metrics_update`` in verl). We read ``mean@<largest n>`` of that core variable.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from sorl_verl.recipes import display_name

CONFIG_NAMES = ("config.yaml", "resolved_config.yaml", ".hydra/config.yaml")

_VAL_CORE = re.compile(r"^val-core/(?P<source>.+)/(?P<var>[^/]+)/mean@(?P<n>\d+)$")

# With a group-relative advantage (no critic) the paper calls so_ppo "SO-GRPO" (the ALGO so_grpo);
# the critic-free names of the other SORL losses, which no ALGO of the recipes runs, are ours, built
# the same way (st_ppo is so_ppo's earlier name).
_OTHER_GROUP_NAMES = {"turn_ppo": "Turn-GRPO", "s_ppo": "S-GRPO", "st_ppo": "SO-GRPO"}


class RunError(ValueError):
    """A run folder that cannot be read; the message names the file (and line)."""


def method_name(loss_mode: str, adv_estimator: str) -> str:
    """Paper name of a (policy loss, advantage estimator) pair.

    A pair some ``ALGO`` of the recipes runs has that ALGO's name (:data:`sorl_verl.recipes.ALGOS`).
    Otherwise ``gae`` is the paper's PPO family with a token-level critic; ``grpo`` its critic-free
    family; ``turn_gae`` (our turn-level advantage estimator) is marked with a suffix. Any
    other pair is shown as ``<loss name> (<estimator>)`` rather than guessed.
    """
    name = display_name(loss_mode, adv_estimator)  # the name of the recipes' ALGO that runs the pair
    if name is not None:
        return name
    if adv_estimator == "grpo":
        return _OTHER_GROUP_NAMES.get(loss_mode, f"{loss_mode} (grpo)")
    base = display_name(loss_mode, "gae") or loss_mode
    if adv_estimator == "gae":
        return base
    if adv_estimator == "turn_gae":
        return f"{base} (turn-GAE)"
    return f"{base} ({adv_estimator})"


@dataclass
class Run:
    """One run folder, read.

    ``steps`` maps a training step to every metric logged at it (records of the same step
    merged, later ones winning); ``validation`` maps a data source to ``{step: score}``.
    """

    path: Path
    metrics_files: list[Path]
    config_file: Path
    method: str
    model: str
    experiment: str
    steps: dict[int, dict[str, float]] = field(default_factory=dict)
    validation: dict[str, dict[int, float]] = field(default_factory=dict)

    def series(self, metric: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one metric over the run, in step order; empty when absent."""
        xs = [s for s in sorted(self.steps) if metric in self.steps[s]]
        return xs, [self.steps[s][metric] for s in xs]


def find_metrics_files(run_dir: Path) -> list[Path]:
    files = sorted(run_dir.glob("metrics*.jsonl")) or sorted(run_dir.glob("*.jsonl"))
    if not files:
        raise RunError(
            f"{run_dir}: no metrics JSONL (expected metrics*.jsonl, written by verl's FileLogger "
            "with trainer.logger containing 'file' and VERL_FILE_LOGGER_PATH pointing into the run folder)"
        )
    return files


def find_config_file(run_dir: Path) -> Path:
    for name in CONFIG_NAMES:
        if (run_dir / name).is_file():
            return run_dir / name
    raise RunError(f"{run_dir}: no resolved config (looked for {', '.join(CONFIG_NAMES)})")


def _as_number(value) -> float | None:
    # bool is an int subclass but never a score; NaN is logged as null by orjson.
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def read_metrics(paths: Iterable[Path]) -> dict[int, dict[str, float]]:
    """Merge FileLogger JSONL files into ``{step: {metric: value}}``; non-numeric values are dropped.

    Raises :class:`RunError` naming the file and line of the first malformed record.
    """
    steps: dict[int, dict[str, float]] = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for lineno, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                where = f"{path}:{lineno}"
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as e:
                    raise RunError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
                if not isinstance(record, dict):
                    raise RunError(
                        f"{where}: expected a JSON object with 'step' and 'data', got {type(record).__name__}"
                    )
                step, data = record.get("step"), record.get("data")
                if isinstance(step, bool) or not isinstance(step, int):
                    raise RunError(f"{where}: field 'step' must be an integer, got {step!r}")
                if not isinstance(data, dict):
                    raise RunError(f"{where}: field 'data' must be an object of metric values, got {data!r:.80}")
                bucket = steps.setdefault(step, {})
                for name, value in data.items():
                    number = _as_number(value)
                    if number is not None:
                        bucket[name] = number
    return steps


def validation_scores(steps: dict[int, dict[str, float]]) -> dict[str, dict[int, float]]:
    """``{data_source: {step: score}}`` from the ``val-core/.../mean@n`` metrics.

    Per data source the variable is ``acc`` when any step logs it, else ``reward`` (verl's
    own rule per validation), and the sample count ``n`` is the largest logged.
    """
    found: dict[str, dict[tuple[int, int], dict[int, float]]] = {}
    for step, metrics in steps.items():
        for name, value in metrics.items():
            m = _VAL_CORE.match(name)
            if m is None:
                continue
            rank = (1 if m["var"] == "acc" else 0, int(m["n"]))
            found.setdefault(m["source"], {}).setdefault(rank, {})[step] = value
    return {source: by_rank[max(by_rank)] for source, by_rank in found.items()}


def _select(cfg, key: str):
    return OmegaConf.select(cfg, key, default=None, throw_on_resolution_failure=False)


def load_run(run_dir: str | Path) -> Run:
    """Read a run folder (see the module docstring for what it must contain)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise RunError(f"{run_dir}: not a folder")
    config_file = find_config_file(run_dir)
    try:
        cfg = OmegaConf.load(config_file)
    except Exception as e:  # noqa: BLE001 - yaml and omegaconf raise many types; all mean "unreadable"
        raise RunError(f"{config_file}: cannot be read as YAML ({e})") from None
    loss_mode = _select(cfg, "actor_rollout_ref.actor.policy_loss.loss_mode") or "vanilla"
    adv = _select(cfg, "algorithm.adv_estimator")
    if adv is None:
        raise RunError(f"{config_file}: field 'algorithm.adv_estimator' is missing")
    model_path = _select(cfg, "actor_rollout_ref.model.path") or "?"
    metrics_files = find_metrics_files(run_dir)
    steps = read_metrics(metrics_files)
    return Run(
        path=run_dir,
        metrics_files=metrics_files,
        config_file=config_file,
        method=method_name(str(loss_mode), str(adv)),
        model=Path(str(model_path).rstrip("/")).name,
        experiment=str(_select(cfg, "trainer.experiment_name") or run_dir.name),
        steps=steps,
        validation=validation_scores(steps),
    )
