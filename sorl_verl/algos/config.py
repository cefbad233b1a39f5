"""Options of the SORL policy losses, as a subclass of verl's ``PolicyLossConfig``.

Select it in a verl run with::

    actor_rollout_ref.actor.policy_loss._target_=sorl_verl.algos.config.SorlPolicyLossConfig
    actor_rollout_ref.actor.policy_loss.loss_mode=st_ppo
    +actor_rollout_ref.actor.policy_loss.normalization=absolute   # optional overrides
    +actor_rollout_ref.actor.policy_loss.kappa=0.5

verl builds ``ActorConfig.policy_loss`` with ``hydra.utils.instantiate``, so the ``_target_``
above makes it an instance of this class and the loss reads it as ``config.policy_loss``.
Without the ``_target_`` (verl's plain ``PolicyLossConfig``) every loss name runs with its
paper defaults (:data:`LOSS_DEFAULTS`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from verl.workers.config import PolicyLossConfig

__all__ = [
    "LOSS_DEFAULTS",
    "NORMALIZATION_MODES",
    "NORM_SCOPES",
    "RATIO_LEVELS",
    "SorlLossOptions",
    "SorlPolicyLossConfig",
    "resolve_options",
]

RATIO_LEVELS = ("token", "turn", "sequence")
NORMALIZATION_MODES = ("relative", "absolute", "literal", "none")
NORM_SCOPES = ("sequence", "micro_batch")

# The paper's variants: which importance ratio and whether clipping-triggered normalization is on.
LOSS_DEFAULTS: dict[str, dict[str, str]] = {
    "turn_ppo": {"ratio_level": "turn", "normalization": "none"},
    "s_ppo": {"ratio_level": "token", "normalization": "relative"},
    "st_ppo": {"ratio_level": "turn", "normalization": "relative"},
    "so_ppo": {"ratio_level": "turn", "normalization": "relative"},
}

_FIELD = "actor_rollout_ref.actor.policy_loss"


def _check_choice(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value is not None and value not in choices:
        raise ValueError(f"{_FIELD}.{name}={value!r} is not one of {choices}")


@dataclass
class SorlPolicyLossConfig(PolicyLossConfig):
    """verl's ``PolicyLossConfig`` plus the SORL options.

    Args:
        ratio_level: importance ratio per ``token`` (PPO), per ``turn`` (the paper's turn-level
            ratio: geometric mean of the turn's token ratios) or per ``sequence`` (the same over
            the whole response). ``None``: the loss name's default.
        normalization: clipping-triggered normalization, ``relative`` | ``absolute`` | ``literal``
            | ``none`` (see :mod:`sorl_verl.algos.losses`). ``None``: the loss name's default.
        kappa: threshold of ``absolute`` mode, in the units of the aggregated loss's per-token
            coefficients (``w_t * A_t * c_t``).
        norm_scope: where the norms are taken: ``sequence`` (default, our reading; one scale per
            trajectory, independent of micro-batching and data parallelism) or ``micro_batch``
            (one scale per loss call; equals the paper's batch-level norm only when a mini-batch
            is a single micro-batch on a single rank).
    """

    ratio_level: str | None = None
    normalization: str | None = None
    kappa: float = 1.0
    norm_scope: str = "sequence"

    def __post_init__(self):
        _check_choice("ratio_level", self.ratio_level, RATIO_LEVELS)
        _check_choice("normalization", self.normalization, NORMALIZATION_MODES)
        _check_choice("norm_scope", self.norm_scope, NORM_SCOPES)
        if not self.kappa > 0:
            raise ValueError(f"{_FIELD}.kappa must be > 0, got {self.kappa}")


@dataclass(frozen=True)
class SorlLossOptions:
    """Everything one SORL loss call needs, resolved from the actor config."""

    ratio_level: str
    normalization: str
    norm_scope: str
    kappa: float
    clip_ratio_low: float
    clip_ratio_high: float
    clip_ratio_c: float


def _get(config: Any, key: str, default: Any = None) -> Any:
    """Read ``key`` from a dataclass config, a DictConfig or a dict alike."""
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
    policy_loss = _get(config, "policy_loss")
    ratio_level = _get(policy_loss, "ratio_level", defaults["ratio_level"])
    normalization = _get(policy_loss, "normalization", defaults["normalization"])
    norm_scope = _get(policy_loss, "norm_scope", "sequence")
    kappa = float(_get(policy_loss, "kappa", 1.0))
    _check_choice("ratio_level", ratio_level, RATIO_LEVELS)
    _check_choice("normalization", normalization, NORMALIZATION_MODES)
    _check_choice("norm_scope", norm_scope, NORM_SCOPES)
    if not kappa > 0:
        raise ValueError(f"{_FIELD}.kappa must be > 0, got {kappa}")

    clip_ratio = float(_get(config, "clip_ratio", 0.2))
    clip_ratio_c = float(_get(config, "clip_ratio_c", 3.0))
    if not clip_ratio_c > 1.0:
        raise ValueError(f"actor_rollout_ref.actor.clip_ratio_c must be > 1 (dual clip), got {clip_ratio_c}")
    return SorlLossOptions(
        ratio_level=ratio_level,
        normalization=normalization,
        norm_scope=norm_scope,
        kappa=kappa,
        clip_ratio_low=float(_get(config, "clip_ratio_low", clip_ratio)),
        clip_ratio_high=float(_get(config, "clip_ratio_high", clip_ratio)),
        clip_ratio_c=clip_ratio_c,
    )
