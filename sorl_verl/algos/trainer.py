"""``sorl_sync``: verl's synchronous V1 trainer, plus handing the critic's values to ``turn_gae``.

verl 0.9.1 passes ``values`` only to its built-in ``gae``. This trainer, registered with verl's
own ``register_trainer``, changes exactly one step: when ``algorithm.adv_estimator=turn_gae``
it reads the critic values that ``_compute_values`` just stored and makes them visible to
``turn_gae`` (:func:`sorl_verl.algos.advantages.provide_critic_values`) while verl's own
``_compute_advantage`` runs. Everything else is verl's ``sync`` trainer. Select it with::

    algorithm.adv_estimator=turn_gae critic.enable=True trainer.v1.trainer_mode=sorl_sync

(verl enables the critic by itself only for ``gae``.) Other estimators run unchanged under
``sorl_sync``, so it is safe to use for every SORL run. :class:`SorlTrainerMixin` is shared with
the asynchronous trainers (:mod:`sorl_verl.algos.async_trainers`).
"""

from __future__ import annotations

import transfer_queue as tq
from verl.trainer.ppo.v1.trainer_base import register_trainer
from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

from .advantages import TURN_GAE_OVERRIDES, provide_critic_values

__all__ = ["SorlSyncTrainer", "SorlTrainerMixin"]


class SorlTrainerMixin:
    """Put before a verl V1 trainer class: ``turn_gae`` gets the critic's values.

    ``VERL_MODE`` is the verl mode the subclass extends. verl's trainer keys its own behaviour
    on the *name* in ``trainer.v1.trainer_mode`` (the replay buffer class, the mode's settings
    section ``trainer.v1.<mode>``, e.g. ``parameter_sync_step``, checkpointing of in-flight
    prompts: ``trainer_base.py``, verl 0.9.1), so ``self.trainer_mode`` answers ``VERL_MODE``
    while the config keeps the registered name the user selected.
    """

    VERL_MODE: str = ""
    REGISTERED_AS: str = ""

    @property
    def trainer_mode(self) -> str:
        return self.VERL_MODE

    @trainer_mode.setter
    def trainer_mode(self, value: str) -> None:
        # verl's __init__ assigns config.trainer.v1.trainer_mode here
        if value not in (self.VERL_MODE, self.REGISTERED_AS):
            raise ValueError(f"{type(self).__name__} runs as {self.REGISTERED_AS!r}, got trainer_mode={value!r}")

    def __init__(self, config):
        super().__init__(config)
        if self._uses_turn_gae() and not self.use_critic:
            raise ValueError(f"adv_estimator=turn_gae needs a critic. Run with: {TURN_GAE_OVERRIDES}")

    def _uses_turn_gae(self) -> bool:
        return str(self.config.algorithm.adv_estimator) == "turn_gae"

    def _compute_advantage(self, batch, metrics):
        if not self._uses_turn_gae():
            return super()._compute_advantage(batch, metrics)
        stored = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=["values"])
        values = stored.to_padded_tensor()["values"]
        with provide_critic_values(values, self._bootstrap_values(batch, values)):
            return super()._compute_advantage(batch, metrics)

    def _bootstrap_values(self, batch, values):
        """``(batch,)`` value after each row's last turn, or ``None`` (0: rows are whole episodes).
        The segment trainer's rows end where their episodes go on (:mod:`sorl_verl.algos.segment_trainer`)."""
        return None


@register_trainer("sorl_sync")
class SorlSyncTrainer(SorlTrainerMixin, PPOTrainerSync):
    """verl's ``sync`` trainer (verl's synchronous replay buffer and settings) for ``turn_gae``."""

    VERL_MODE = "sync"
    REGISTERED_AS = "sorl_sync"
