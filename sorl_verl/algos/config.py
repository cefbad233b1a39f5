"""Options of the SORL policy losses, as a subclass of verl's ``PolicyLossConfig``.

Select it in a verl run with::

    actor_rollout_ref.actor.policy_loss._target_=sorl_verl.algos.config.SorlPolicyLossConfig
    actor_rollout_ref.actor.policy_loss.loss_mode=st_ppo
    +actor_rollout_ref.actor.policy_loss.normalization=absolute   # optional overrides
    +actor_rollout_ref.actor.policy_loss.kappa=0.5

verl builds ``ActorConfig.policy_loss`` with ``hydra.utils.instantiate``, so the ``_target_``
above makes it an instance of this class and the loss reads it as ``config.policy_loss``.
Without the ``_target_`` (verl's plain ``PolicyLossConfig``) every loss name runs with its
paper defaults (:data:`LOSS_DEFAULTS`, kept with the recipes in :mod:`sorl_verl.recipes`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from verl.workers.config import PolicyLossConfig

from sorl_verl.recipes import LOSS_DEFAULTS

from .correction import DEFAULT_KAPPA, DEFAULT_TAU, NORM_SCOPES, NORMALIZATION_MODES

__all__ = [
    "LOSS_DEFAULTS",
    "NORMALIZATION_MODES",
    "NORM_SCOPES",
    "RATIO_LEVELS",
    "SorlLossOptions",
    "SorlPolicyLossConfig",
    "config_get",
    "resolve_options",
]

RATIO_LEVELS = ("token", "turn", "sequence")

_FIELD = "actor_rollout_ref.actor.policy_loss"
# Options that existed before and why they are gone (a clear error instead of a silent default).
_REMOVED = {
    ("normalization", "literal"): "it jumped from 1 to 1/C when one token crossed the clip and enlarged steps "
    "when C < 1; `absolute` (s = min(1, kappa / C_tok)) is its continuous, bounded form",
    ("norm_scope", "micro_batch"): "it depended on how verl split the mini-batch into micro-batches; "
    "`batch` takes the norms over the whole mini-batch on every rank",
}


def _validate(ratio_level, normalization, norm_scope, tau, kappa) -> None:
    """One check of every SORL option (the config class and the loss both call it)."""
    for name, value, choices in (
        ("ratio_level", ratio_level, RATIO_LEVELS),
        ("normalization", normalization, NORMALIZATION_MODES),
        ("norm_scope", norm_scope, NORM_SCOPES),
    ):
        if (name, value) in _REMOVED:
            raise ValueError(f"{_FIELD}.{name}={value!r} was removed: {_REMOVED[name, value]}")
        if value is not None and value not in choices:
            raise ValueError(f"{_FIELD}.{name}={value!r} is not one of {choices}")
    for name, value in (("tau", tau), ("kappa", kappa)):
        if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
            raise ValueError(f"{_FIELD}.{name} must be a finite number > 0, got {value!r}")


@dataclass
class SorlPolicyLossConfig(PolicyLossConfig):
    """verl's ``PolicyLossConfig`` plus the SORL options.

    Args:
        ratio_level: importance ratio per ``token`` (PPO), per ``turn`` (the paper's turn-level
            ratio: geometric mean of the turn's token ratios) or per ``sequence`` (the same over
            the whole response). ``None``: the loss name's default.
        normalization: the clipping-bias correction, ``relative`` | ``absolute`` | ``none`` (see
            :mod:`sorl_verl.algos.correction`). ``None``: the loss name's default.
        norm_scope: ``batch`` (default: one scale for the whole mini-batch, applied to the
            accumulated gradient before the optimizer step) or ``sequence`` (one scale per
            trajectory, inside the loss).
        tau: threshold of ``relative``: ``s = min(1, tau * G_tok / C_tok)``.
        kappa: threshold of ``absolute``: ``s = min(1, kappa / C_tok)``, in advantage units.
    """

    ratio_level: str | None = None
    normalization: str | None = None
    norm_scope: str = "batch"
    tau: float = DEFAULT_TAU
    kappa: float = DEFAULT_KAPPA

    def __post_init__(self):
        _validate(self.ratio_level, self.normalization, self.norm_scope, self.tau, self.kappa)


@dataclass(frozen=True)
class SorlLossOptions:
    """Everything one SORL loss call needs, resolved from the actor config."""

    ratio_level: str
    normalization: str
    norm_scope: str
    tau: float
    kappa: float
    clip_ratio_low: float
    clip_ratio_high: float
    clip_ratio_c: float


def config_get(config: Any, key: str, default: Any = None) -> Any:
    """Read ``key`` from a dataclass config, a DictConfig or a dict alike (``None`` -> default)."""
    if config is None:
        return default
    getter = getattr(config, "get", None)
    if callable(getter):
        value = getter(key, default)
    else:
        value = getattr(config, key, default)
    return default if value is None else value


def resolve_options(loss_name: str, config: Any) -> SorlLossOptions:
    """Options for ``loss_name`` from an actor config (``ActorConfig`` or a DictConfig of one).

    ``config.policy_loss`` may be our :class:`SorlPolicyLossConfig`, verl's plain
    ``PolicyLossConfig`` (then the loss name's defaults apply) or a mapping with the same keys.
    """
    if loss_name not in LOSS_DEFAULTS:
        raise ValueError(f"unknown SORL loss {loss_name!r}; known: {sorted(LOSS_DEFAULTS)}")
    if config is None:
        raise ValueError(f"policy loss {loss_name!r} needs the actor config (got config=None)")
    defaults = LOSS_DEFAULTS[loss_name]
    policy_loss = config_get(config, "policy_loss")
    ratio_level = config_get(policy_loss, "ratio_level", defaults["ratio_level"])
    normalization = config_get(policy_loss, "normalization", defaults["normalization"])
    norm_scope = config_get(policy_loss, "norm_scope", "batch")
    tau = config_get(policy_loss, "tau", DEFAULT_TAU)
    kappa = config_get(policy_loss, "kappa", DEFAULT_KAPPA)
    _validate(ratio_level, normalization, norm_scope, tau, kappa)

    clip_ratio = float(config_get(config, "clip_ratio", 0.2))
    clip_ratio_c = float(config_get(config, "clip_ratio_c", 3.0))
    if not clip_ratio_c > 1.0:
        raise ValueError(f"actor_rollout_ref.actor.clip_ratio_c must be > 1 (dual clip), got {clip_ratio_c}")
    return SorlLossOptions(
        ratio_level=ratio_level,
        normalization=normalization,
        norm_scope=norm_scope,
        tau=float(tau),
        kappa=float(kappa),
        clip_ratio_low=float(config_get(config, "clip_ratio_low", clip_ratio)),
        clip_ratio_high=float(config_get(config, "clip_ratio_high", clip_ratio)),
        clip_ratio_c=clip_ratio_c,
    )
