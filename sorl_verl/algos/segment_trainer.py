"""``sorl_segment``: verl's synchronous trainer on segments of running episodes (segment mode).

Selected with ``trainer.v1.trainer_mode=sorl_segment`` plus ``turn_gae`` and a critic; settings
in ``trainer.v1.segment`` (:class:`~sorl_verl.agent.segments.SegmentConfig`; overrides from
:func:`~sorl_verl.agent.segments.segment_overrides`), e.g.::

    algorithm.adv_estimator=turn_gae critic.enable=True trainer.v1.trainer_mode=sorl_segment
    +trainer.v1.segment.turns=2 +trainer.v1.segment.resets=staggered

It is the ``sorl_sync`` trainer (verl's ``sync``) with four steps changed, nothing copied:

1. the step's prompts (``_next_train_batch``) are the rows of the pool's episodes to advance,
   each carrying its episode's state for the ``search_r1`` loop;
2. after the step (``step``), the loop's outputs update the pool (carry-over or replacement)
   and the step logs the ``rollout/`` segment metrics and the turn-level staleness of the
   trained turns (``actor/sorl/turn_staleness_*``) and of their context
   (``rollout/context_staleness_*``);
3. ``turn_gae`` gets, per row, the critic's value at the segment's extra last token (the state
   after the segment) as the bootstrap when the episode goes on, 0 when it ended;
4. checkpoints hold the pool (``segment_pool.pt`` next to verl's ``data.pt``): a resumed run
   continues the same episodes from the same contexts.
"""

from __future__ import annotations

import logging
import os

import torch
import transfer_queue as tq
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.utils import tensordict_utils as tu

from sorl_verl.agent.segments import (
    STATE_KEY,
    TRAINER_MODE,
    EpisodePool,
    SegmentConfig,
    batch_from_rows,
    rows_from_batch,
    segment_rollout_metrics,
)

from .async_trainers import TURN_VERSIONS_KEY, turn_staleness_metrics
from .trainer import SorlSyncTrainer

__all__ = ["POOL_FILE", "SorlSegmentTrainer", "bootstrap_values"]

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "INFO"))

POOL_FILE = "segment_pool.pt"


def bootstrap_values(values: torch.Tensor, response_lengths: torch.Tensor, goes_on: torch.Tensor) -> torch.Tensor:
    """Each row's value after its last turn: the value at its last response token when the
    episode goes on (that token is the loop's extra mask-0 one), else 0.

    Args:
        values: ``(batch, response_len)`` critic values, right-padded.
        response_lengths: ``(batch,)`` long, each row's response length (>= 1).
        goes_on: ``(batch,)`` bool, True for a segment whose episode is not finished.

    Returns:
        ``(batch,)`` in the dtype of ``values``.
    """
    last = values.gather(1, (response_lengths.clamp(min=1) - 1).unsqueeze(1).to(values.device)).squeeze(1)
    return torch.where(goes_on.to(values.device), last, torch.zeros_like(last))


@register_trainer(TRAINER_MODE)
class SorlSegmentTrainer(SorlSyncTrainer):
    """``sorl_sync`` trained on segments of a pool of running episodes (see the module docstring)."""

    REGISTERED_AS = TRAINER_MODE

    def __init__(self, config):
        self.segment_config = SegmentConfig.from_trainer_config(config)
        super().__init__(config)
        self.pool = EpisodePool(self.segment_config, batch_size=int(config.data.train_batch_size))

    # 1. the step's prompts: the pool's rows
    def _fetch_rows(self) -> list[dict]:
        return rows_from_batch(self._fetch_one_gen_batch())

    def _next_train_batch(self, num_prompts: int | None = None):
        if num_prompts not in (None, self.config.data.train_batch_size):
            raise RuntimeError(
                f"{TRAINER_MODE}: verl asked for {num_prompts} extra prompts (a failed rollout group); segment mode "
                "cannot add episodes within a step"
            )
        batch = batch_from_rows(self.pool.next_rows(self._fetch_rows))
        tu.assign_non_tensor_data(batch, "global_steps", self.global_steps)
        return batch

    # 2. after the step: the pool and the segment metrics
    def step(self, metrics: dict, timing_raw: dict):
        batch = super().step(metrics, timing_raw)
        rows = [i for i, tag in enumerate(batch.tags) if not tag.get("is_padding", False)]
        keys = [batch.keys[i] for i in rows]
        stored = tq.kv_batch_get(keys=keys, partition_id=batch.partition_id, select_fields=["extra_fields"])
        extra_fields = [fields or {} for fields in stored.pop("extra_fields").tolist()]
        if any(STATE_KEY not in fields for fields in extra_fields):
            raise RuntimeError(
                f"{TRAINER_MODE}: a trained row has no extra_fields[{STATE_KEY!r}]: its agent loop does not run "
                "segments; the rows must select the search_r1 loop (agent_name: search_r1, or a subclass of it)"
            )
        states = [fields[STATE_KEY] for fields in extra_fields]
        counts = self.pool.update({state["episode_id"]: state for state in states})
        if counts["lost"]:
            logger.warning(f"{TRAINER_MODE}: {counts['lost']} episode(s) had no rollout output; replaced by new ones")
        metrics.update(segment_rollout_metrics(states))
        metrics["rollout/segment_lost_episodes"] = counts["lost"]
        trained = turn_staleness_metrics(
            [fields.get(TURN_VERSIONS_KEY) for fields in extra_fields],
            [batch.tags[i].get("min_global_steps") for i in rows],
            [batch.tags[i].get("max_global_steps") for i in rows],
            self.global_steps,
        )
        context = turn_staleness_metrics(
            [state["context_turn_versions"] for state in states],
            [None] * len(states),
            [None] * len(states),
            self.global_steps,
        )
        metrics.update(trained)
        metrics.update(
            {
                key.replace("actor/sorl/turn_staleness", "rollout/context_staleness"): value
                for key, value in context.items()
                if "turn_staleness" in key
            }
        )
        return batch

    # 3. the bootstrap values for turn_gae
    def _bootstrap_values(self, batch, values: torch.Tensor) -> torch.Tensor:
        stored = tq.kv_batch_get(
            keys=batch.keys, partition_id=batch.partition_id, select_fields=["extra_fields", "response_mask"]
        )
        lengths = stored["response_mask"].offsets().diff()
        goes_on = torch.tensor(
            [
                not tag.get("is_padding", False) and not (fields or {}).get(STATE_KEY, {"done": True})["done"]
                for tag, fields in zip(batch.tags, stored.pop("extra_fields").tolist(), strict=True)
            ],
            dtype=torch.bool,
        )
        return bootstrap_values(values, lengths, goes_on)

    # 4. the pool in the checkpoints
    def _save_checkpoint(self):
        # before verl's save, which writes latest_checkpointed_iteration.txt last: a run killed in
        # between resumes from the previous checkpoint, never from one without its pool
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, POOL_FILE)
        torch.save(self.pool.state_dict(), path + ".tmp")
        os.replace(path + ".tmp", path)
        super()._save_checkpoint()

    def _load_checkpoint(self):
        super()._load_checkpoint()
        if self.global_steps == 0:
            return
        folder = os.path.join(self.config.trainer.default_local_dir, f"global_step_{self.global_steps}")
        if self.config.trainer.resume_mode == "resume_path":
            folder = self.config.trainer.resume_from_path
        path = os.path.join(folder if os.path.isabs(folder) else os.path.join(os.getcwd(), folder), POOL_FILE)
        if os.path.exists(path):
            self.pool.load_state_dict(torch.load(path, weights_only=False))
            logger.info(f"{TRAINER_MODE}: resumed the episode pool from {path}")
        else:
            logger.warning(f"{TRAINER_MODE}: no episode pool at {path}; starting a fresh pool")
