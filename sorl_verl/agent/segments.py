"""Segment mode: a pool of running episodes, advanced a few turns per training step.

The idea is the simulator-RL practice that Staggered Environment Resets (arXiv 2511.21011)
studies: instead of generating every trajectory to its end before training on it, each update
trains on a short **segment** of every running episode and bootstraps the rest of the episode
with the critic. When all episodes start together (``sync`` resets) every batch holds the same
phase of the task; the paper's fix is to start episodes at varied points of the horizon
(``staggered`` resets). How we do it in verl (our design, not the paper's):

- the trainer (:mod:`sorl_verl.algos.segment_trainer`) keeps an :class:`EpisodePool` of
  ``pool_size`` episodes; each step it hands ``train_batch_size`` of them (round robin; all of
  them when ``pool_size == train_batch_size``) to the ``search_r1`` agent loop, each row
  carrying its episode's state in the field :data:`SEGMENT_KEY`;
- the loop continues the episode from that state for at most ``turns`` model turns and returns
  the segment as the trained sample (prompt = question + carried context, response = the
  segment's tokens) and the new state in ``extra_fields[STATE_KEY]``;
- ``staggered``: the initial pool gets seeded start points (:func:`start_fractions`); a fresh
  episode placed at fraction ``f`` first generates :func:`warmup_turns` turns as context, with
  the same weights, and is trained from there; an episode that ends is replaced by a fresh one
  that starts at turn 0 under both schedules.

Nothing here imports Ray or verl's trainer; everything is plain Python/NumPy so the pool can be
tested (and checkpointed with ``torch.save``) on its own.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

__all__ = [
    "RESETS",
    "SEGMENT_KEY",
    "SEGMENT_SETTINGS",
    "STATE_KEY",
    "Episode",
    "EpisodePool",
    "SegmentConfig",
    "batch_from_rows",
    "rows_from_batch",
    "segment_overrides",
    "segment_rollout_metrics",
    "start_fractions",
    "warmup_turns",
]

RESETS = ("sync", "staggered")
# Config section of the segment settings (under verl's trainer.v1, next to verl's own modes).
SEGMENT_SETTINGS = "trainer.v1.segment"
# Row field carrying an episode's state into the agent loop (verl passes every row field to run()).
SEGMENT_KEY = "sorl_segment"
# extra_fields key of the agent loop's output: the episode's state after the segment.
STATE_KEY = "sorl_segment_state"
TRAINER_MODE = "sorl_segment"


def segment_overrides(turns: int, resets: str, pool_size: int | None = None, seed: int | None = None) -> list[str]:
    """The Hydra overrides that select segment mode (for sweeps: ``--segment-turns T --resets R``).

    The estimator (``turn_gae``) and the critic are the algorithm's own overrides
    (:data:`sorl_verl.recipes.ALGOS`); this adds the trainer mode and its settings.
    """
    overrides = [
        f"trainer.v1.trainer_mode={TRAINER_MODE}",
        f"+{SEGMENT_SETTINGS}.turns={turns}",
        f"+{SEGMENT_SETTINGS}.resets={resets}",
    ]
    if pool_size is not None:
        overrides.append(f"+{SEGMENT_SETTINGS}.pool_size={pool_size}")
    if seed is not None:
        overrides.append(f"+{SEGMENT_SETTINGS}.seed={seed}")
    return overrides


def _get(config: Any, dotted: str, default: Any = None) -> Any:
    node = config
    for part in dotted.split("."):
        if node is None:
            return default
        node = node.get(part) if isinstance(node, Mapping) or hasattr(node, "get") else getattr(node, part, None)
    return default if node is None else node


@dataclass(frozen=True)
class SegmentConfig:
    """The segment settings, checked.

    Args:
        turns: ``T``, the most model turns an episode advances per training step (>= 1).
        resets: ``sync`` (every episode starts at turn 0) or ``staggered`` (the initial pool is
            spread over the horizon).
        pool_size: running episodes (>= ``train_batch_size``; default ``train_batch_size``).
        seed: seed of the staggered placement (default: ``data.seed``, else 0).
    """

    turns: int
    resets: str
    pool_size: int
    seed: int

    @classmethod
    def from_trainer_config(cls, config: Any) -> SegmentConfig:
        """Read and check ``trainer.v1.segment`` and the settings segment mode depends on.

        Raises ``ValueError`` naming the setting for: ``turns`` < 1, an unknown ``resets``, a
        pool smaller than the batch, an estimator other than ``turn_gae`` (critic-free ones
        need whole episodes), ``rollout.n`` != 1, and DAPO group filtering / failed-group refill
        (they ask the trainer for extra prompts, which segment mode cannot give).
        """
        section = _get(config, SEGMENT_SETTINGS, {}) or {}
        batch_size = int(_get(config, "data.train_batch_size"))
        turns = _get(section, "turns", 1)
        if isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
            raise ValueError(f"{SEGMENT_SETTINGS}.turns must be an integer >= 1, got {turns!r}")
        resets = str(_get(section, "resets", "sync"))
        if resets not in RESETS:
            raise ValueError(f"{SEGMENT_SETTINGS}.resets must be one of {RESETS}, got {resets!r}")
        pool_size = _get(section, "pool_size", batch_size)
        if isinstance(pool_size, bool) or not isinstance(pool_size, int) or pool_size < batch_size:
            raise ValueError(
                f"{SEGMENT_SETTINGS}.pool_size={pool_size!r} is smaller than data.train_batch_size={batch_size}: "
                "each step advances train_batch_size episodes of the pool"
            )
        estimator = str(_get(config, "algorithm.adv_estimator", ""))
        if estimator != "turn_gae":
            why = (
                "verl's token-level gae takes no bootstrap value for an unfinished segment"
                if estimator == "gae"
                else "it is critic-free and needs whole episodes; segment mode bootstraps unfinished "
                "episodes with the critic"
            )
            raise ValueError(
                f"trainer.v1.trainer_mode={TRAINER_MODE} needs algorithm.adv_estimator=turn_gae with a critic "
                f"(critic.enable=True), not algorithm.adv_estimator={estimator}: {why}"
            )
        n = int(_get(config, "actor_rollout_ref.rollout.n", 1))
        if n != 1:
            raise ValueError(
                f"trainer.v1.trainer_mode={TRAINER_MODE} needs actor_rollout_ref.rollout.n=1 (one continuation per "
                f"episode), got {n}"
            )
        if _get(config, "algorithm.filter_groups.enable", False) or _get(
            config, "trainer.v1.sampler.sync_refill_failed_groups", False
        ):
            raise ValueError(
                f"trainer.v1.trainer_mode={TRAINER_MODE} does not support algorithm.filter_groups.enable or "
                "trainer.v1.sampler.sync_refill_failed_groups: the pool cannot replace a segment with a new prompt"
            )
        seed = _get(section, "seed", _get(config, "data.seed", 0))
        return cls(turns=turns, resets=resets, pool_size=pool_size, seed=int(seed))


def start_fractions(count: int, resets: str, rng: np.random.Generator) -> np.ndarray:
    """Where each episode of a fresh pool starts, as a fraction of the horizon in ``[0, 1)``.

    ``sync``: all 0. ``staggered``: stratified, one episode per slice ``[k/count, (k+1)/count)``
    in a random order, so the pool covers the horizon evenly whatever ``count`` is.

    Returns:
        ``(count,)`` float64.
    """
    if resets == "sync":
        return np.zeros(count)
    return (rng.permutation(count) + rng.random(count)) / count


def warmup_turns(fraction: float, horizon: int) -> int:
    """Model turns generated as context before the first trained turn: ``floor(f * horizon)``,
    at most ``horizon - 1`` (an episode always has its last turn left to train on)."""
    return max(0, min(int(fraction * horizon), horizon - 1))


@dataclass
class Episode:
    """One running episode of the pool.

    Attributes:
        episode_id: unique within the run.
        row: the data-set row (the dataloader's fields, one value each).
        state: the agent loop's state after the last segment; ``None`` before the first one.
        start_fraction: where a fresh episode starts (:func:`start_fractions`).
        segments: segments trained so far.
    """

    episode_id: int
    row: dict[str, Any]
    state: dict[str, Any] | None = None
    start_fraction: float = 0.0
    segments: int = 0


@dataclass
class EpisodePool:
    """``config.pool_size`` running episodes; each step advances ``batch_size`` of them.

    Use: :meth:`next_rows` (fills empty slots from ``fetch_rows`` and returns the rows of the
    episodes to advance), then :meth:`update` with the agent loop's states. Slots keep their
    place, so the round robin over the pool is not disturbed by replacements.
    """

    config: SegmentConfig
    batch_size: int
    slots: list[Episode | None] = field(default_factory=list)
    waiting: list[dict[str, Any]] = field(default_factory=list)  # fetched rows not yet in the pool
    next_id: int = 0
    cursor: int = 0
    advanced: list[int] = field(default_factory=list)  # slots handed out by the last next_rows

    def _new_episode(self, fetch_rows: Callable[[], list[dict]], fraction: float) -> Episode:
        while not self.waiting:
            self.waiting.extend(fetch_rows())
        episode = Episode(episode_id=self.next_id, row=self.waiting.pop(0), start_fraction=float(fraction))
        self.next_id += 1
        return episode

    def next_rows(self, fetch_rows: Callable[[], list[dict]]) -> list[dict[str, Any]]:
        """The rows of the next ``batch_size`` episodes, each with a fresh ``uid`` and :data:`SEGMENT_KEY`.

        The first call fills the pool and places it (:func:`start_fractions`); later calls put a
        fresh episode (start 0) into every slot emptied by :meth:`update`.
        """
        if not self.slots:
            rng = np.random.default_rng(self.config.seed)
            fractions = start_fractions(self.config.pool_size, self.config.resets, rng)
            self.slots = [self._new_episode(fetch_rows, f) for f in fractions]
        for index, episode in enumerate(self.slots):
            if episode is None:
                self.slots[index] = self._new_episode(fetch_rows, 0.0)
        size = len(self.slots)
        self.advanced = [(self.cursor + k) % size for k in range(self.batch_size)]
        self.cursor = (self.cursor + self.batch_size) % size
        rows = []
        for index in self.advanced:
            episode = self.slots[index]
            row = dict(episode.row)
            row["uid"] = str(uuid.uuid4())
            row[SEGMENT_KEY] = {
                "episode_id": episode.episode_id,
                "turns": self.config.turns,
                "start_fraction": episode.start_fraction,
                "state": episode.state,
            }
            rows.append(row)
        return rows

    def update(self, states: Mapping[int, Mapping[str, Any]]) -> dict[str, int]:
        """Take the agent loop's :data:`STATE_KEY` outputs, by episode id, for the advanced episodes.

        An episode whose segment ended it, or that has no output (its rollout failed), leaves
        its slot empty for a fresh episode. Returns counts: ``continued``, ``ended``, ``lost``.
        """
        counts = {"continued": 0, "ended": 0, "lost": 0}
        for index in self.advanced:
            episode = self.slots[index]
            output = states.get(episode.episode_id)
            if output is None:
                counts["lost"] += 1
                self.slots[index] = None
            elif output["done"]:
                counts["ended"] += 1
                self.slots[index] = None
            else:
                counts["continued"] += 1
                episode.state = output["state"]
                episode.segments += 1
        self.advanced = []
        return counts

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue the pool's episodes after a restart (``torch.save``-able)."""
        return {
            "slots": [None if e is None else vars(e).copy() for e in self.slots],
            "waiting": list(self.waiting),
            "next_id": self.next_id,
            "cursor": self.cursor,
            "config": vars(self.config).copy(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if dict(state["config"]) != vars(self.config):
            raise ValueError(
                f"the checkpointed episode pool was made with {dict(state['config'])}, this run has "
                f"{vars(self.config)}: resume with the same {SEGMENT_SETTINGS} settings"
            )
        self.slots = [None if e is None else Episode(**e) for e in state["slots"]]
        self.waiting = list(state["waiting"])
        self.next_id = int(state["next_id"])
        self.cursor = int(state["cursor"])
        self.advanced = []


def segment_rollout_metrics(states: list[Mapping[str, Any]]) -> dict[str, float]:
    """``rollout/`` metrics of one step's trained segments (the agent loop's :data:`STATE_KEY` outputs).

    - ``rollout/turn_position_mean`` / ``_std``: the 0-based turn index within its episode of
      every trained model turn;
    - ``rollout/segment_episode_end_fraction``: the share of segments that ended their episode;
    - ``rollout/segment_turns_mean``: trained model turns per segment;
    - ``rollout/segment_context_turns_mean``: model turns carried as context into a segment.
    """
    if not states:
        return {}
    positions = np.concatenate(
        [np.arange(s["first_turn"], s["first_turn"] + s["turns"], dtype=np.float64) for s in states]
    )
    return {
        "rollout/turn_position_mean": float(positions.mean()) if positions.size else 0.0,
        "rollout/turn_position_std": float(positions.std()) if positions.size else 0.0,
        "rollout/segment_episode_end_fraction": float(np.mean([bool(s["done"]) for s in states])),
        "rollout/segment_turns_mean": float(np.mean([s["turns"] for s in states])),
        "rollout/segment_context_turns_mean": float(np.mean([s["first_turn"] for s in states])),
    }


def rows_from_batch(batch) -> list[dict[str, Any]]:
    """A dataloader batch (verl's ``TensorDict``) as one dict per row (values as the agent loop gets them)."""
    from tensordict import NonTensorData, NonTensorStack

    columns = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            columns[key] = [value[i] for i in range(len(batch))]
        elif isinstance(value, NonTensorStack):
            columns[key] = [value[i].data for i in range(len(batch))]
        elif isinstance(value, NonTensorData):  # one value for the whole batch (global_steps, ...)
            continue
        else:
            raise TypeError(f"segment mode: unsupported field {key!r} of type {type(value).__name__}")
    return [{key: column[i] for key, column in columns.items()} for i in range(len(batch))]


def batch_from_rows(rows: list[dict[str, Any]]):
    """The inverse of :func:`rows_from_batch`: one ``TensorDict`` with a field per key."""
    from verl.utils import tensordict_utils as tu

    columns: dict[str, Any] = {}
    for key in rows[0]:
        values = [row[key] for row in rows]
        if all(isinstance(v, torch.Tensor) for v in values):
            columns[key] = torch.stack(values)
        else:
            column = np.empty(len(values), dtype=object)
            for i, value in enumerate(values):  # np.array would split equal-length lists into an axis
                column[i] = value
            columns[key] = column
    return tu.get_tensordict(columns)
