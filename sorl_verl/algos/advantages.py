"""Turn-level GAE, registered in verl as the advantage estimator ``turn_gae``.

The paper's part: GAE over the sequence of turns instead of tokens, with one value per turn,
so that credit is assigned per agent action. Our reading of the details:

* a turn's value is the critic's value at the turn's first token (the state before the turn);
* a turn's reward is the sum of the token rewards from its first token up to the next turn's
  first token, so a reward placed on an observation or padding token after the turn (e.g. the
  final score of an episode that ended on a tool call) is credited to the turn that caused it;
  rewards before a row's first turn go to its first turn;
* ``delta_k = r_k + gamma * V_{k+1} - V_k`` (``V`` after the last turn is 0, or the row's
  bootstrap value when the row is a segment of an unfinished episode: segment mode,
  :mod:`sorl_verl.algos.segment_trainer`) and
  ``A_k = sum_{j >= k} (gamma * lam)^(j - k) * delta_j`` over the turns of the row;
* every token of turn k gets ``A_k``; the critic's target is ``A_k + V_k`` on the turn's tokens
  (as verl's GAE: returns = advantages + values); off-mask tokens get 0 for both;
* advantages are whitened over the masked tokens with verl's ``masked_whiten``, as verl's GAE,
  then set to 0 off-mask (verl's GAE leaves ``-mean/std`` there; the losses ignore it either way).

Getting the critic's values: verl 0.9.1 hands ``values`` only to its built-in ``gae``;
registered estimators receive rewards, mask, ``index`` and the ``algorithm`` config. The
``sorl_sync`` trainer (:mod:`sorl_verl.algos.trainer`) reads the values the critic just wrote
and exposes them through :func:`provide_critic_values` for the duration of verl's own
``compute_advantage``; ``turn_gae`` picks them up there (or from an explicit ``values=``).
The segment trainer hands over, the same way, each row's bootstrap value: the critic's value
of the state after the row's last turn for a segment whose episode goes on, 0 for one whose
episode ended.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import torch
import verl.utils.torch_functional as verl_F
from verl.trainer.ppo.core_algos import register_adv_est

from .turns import segment_turns

__all__ = ["TURN_GAE_OVERRIDES", "compute_turn_gae_advantage_return", "provide_critic_values", "turn_gae_core"]

TURN_GAE_OVERRIDES = "algorithm.adv_estimator=turn_gae critic.enable=True trainer.v1.trainer_mode=sorl_sync"

# Not on verl's objects: verl 0.9's compute_advantage holds the values in its DataProto but calls a
# registered estimator with rewards, mask, uid, reward_baselines and the algorithm config only.
_critic_values: contextvars.ContextVar[tuple[torch.Tensor, torch.Tensor | None] | None] = contextvars.ContextVar(
    "sorl_verl_critic_values", default=None
)


@contextlib.contextmanager
def provide_critic_values(values: torch.Tensor, bootstrap: torch.Tensor | None = None) -> Iterator[None]:
    """Make ``values`` ``(batch, response_len)`` visible to ``turn_gae`` inside this block.

    ``bootstrap`` ``(batch,)``: the value after each row's last turn (default 0 for every row).
    """
    token = _critic_values.set((values, bootstrap))
    try:
        yield
    finally:
        _critic_values.reset(token)


def turn_gae_core(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float,
    lam: float,
    bootstrap: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn-level GAE before whitening.

    Args:
        token_level_rewards, values, response_mask: ``(batch, response_len)``.
        gamma, lam: discount and GAE lambda, applied per turn.
        bootstrap: ``(batch,)``, the value after each row's last turn; ``None``: 0 (whole
            episodes). A row without turns ignores it.

    Returns:
        ``(advantages, returns)``, both ``(batch, response_len)`` float32, constant over each turn
        and 0 off-mask.
    """
    mask = response_mask.bool()
    segments = segment_turns(mask)
    batch, response_len = mask.shape
    rewards = token_level_rewards.float()
    if segments.num_turns == 0:
        zeros = torch.zeros_like(rewards)
        return zeros, zeros.clone()

    # Rewards from a turn's start up to the next turn's start belong to that turn.
    starts = segments.starts
    owner_in_row = (starts.cumsum(dim=1) - 1).clamp(min=0)
    row_offset = segments.row_offset
    owner = torch.where(
        segments.turns_per_row[:, None] > 0, owner_in_row + row_offset[:, None], segments.num_turns
    ).reshape(-1)
    turn_rewards = rewards.new_zeros(segments.num_turns + 1).index_add_(0, owner, rewards.reshape(-1))
    turn_rewards = turn_rewards[: segments.num_turns]

    turn_values = values.float()[starts]  # row-major: global turn order

    # Pad turns into (batch, max_turns) and run GAE as one matrix product over turn positions.
    max_turns = int(segments.turns_per_row.max())
    rows, position = segments.turn_row, segments.turn_index
    padded_values = rewards.new_zeros(batch, max_turns + 1)
    padded_values[rows, position] = turn_values
    if bootstrap is not None:
        # the slot right after a row's last turn; GAE reads it as V_{K} of that row
        padded_values[torch.arange(batch, device=mask.device), segments.turns_per_row] = bootstrap.to(
            padded_values.dtype
        )
    padded_rewards = rewards.new_zeros(batch, max_turns)
    padded_rewards[rows, position] = turn_rewards
    deltas = padded_rewards + gamma * padded_values[:, 1:] - padded_values[:, :-1]
    valid = torch.zeros(batch, max_turns, dtype=torch.bool, device=mask.device)
    valid[rows, position] = True
    deltas = deltas * valid

    steps = torch.arange(max_turns, device=mask.device, dtype=torch.float32)
    offsets = steps[None, :] - steps[:, None]  # (j - k)
    discount = torch.where(offsets >= 0, (gamma * lam) ** offsets.clamp(min=0), torch.zeros_like(offsets))
    padded_advantages = deltas @ discount.T  # A[b, k] = sum_j discount[k, j] * delta[b, j]

    turn_advantages = padded_advantages[rows, position]
    advantages = segments.broadcast(turn_advantages)
    returns = segments.broadcast(turn_advantages + turn_values)
    return advantages, returns


@register_adv_est("turn_gae")
def compute_turn_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any = None,
    values: torch.Tensor | None = None,
    gamma: float | None = None,
    lam: float | None = None,
    bootstrap: torch.Tensor | None = None,
    **unused: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """verl advantage estimator ``turn_gae``: turn-level GAE, whitened.

    Args:
        token_level_rewards, response_mask: ``(batch, response_len)``, as verl passes them.
        config: verl's ``algorithm`` config (``gamma``, ``lam``), as verl passes it.
        values: ``(batch, response_len)`` critic values; default: those set by
            :func:`provide_critic_values` (the ``sorl_sync`` trainer does it).
        bootstrap: ``(batch,)`` value after each row's last turn; default: the one set by
            :func:`provide_critic_values` with ``values``, else 0.
        gamma, lam: override ``config.gamma`` / ``config.lam``.
        unused: other keywords verl passes to registered estimators (``index``, ...).

    Returns:
        ``(advantages, returns)``, ``(batch, response_len)``.
    """
    if values is None:
        values, provided_bootstrap = _critic_values.get() or (None, None)
        bootstrap = provided_bootstrap if bootstrap is None else bootstrap
    if values is None:
        raise ValueError(
            "adv_estimator=turn_gae needs the critic's values, which verl hands only to its built-in gae. "
            f"Run with: {TURN_GAE_OVERRIDES}"
        )
    if values.shape != token_level_rewards.shape:
        raise ValueError(
            f"turn_gae: critic values have shape {tuple(values.shape)}, rewards {tuple(token_level_rewards.shape)}"
        )
    if gamma is None:
        gamma = float(config.get("gamma", 1.0)) if config is not None else 1.0
    if lam is None:
        lam = float(config.get("lam", 1.0)) if config is not None else 1.0
    with torch.no_grad():
        advantages, returns = turn_gae_core(token_level_rewards, values, response_mask, gamma, lam, bootstrap)
        mask = response_mask.to(advantages.dtype)
        advantages = verl_F.masked_whiten(advantages, mask) * mask
    return advantages, returns
