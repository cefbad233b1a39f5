"""SORL policy losses (arXiv 2511.20718; first version "ST-PPO"), registered into verl.

Read top to bottom: importance ratio (token / turn / sequence level) -> PPO clip with verl's
dual clip -> clipping-bias correction -> verl's ``agg_loss`` -> diagnostics.

What is the paper's and what is our reading:

* Paper (high confidence): the turn-level importance ratio ``w_k = exp(mean_{t in k}(log pi_t -
  log pi_old_t))``, the geometric mean of the turn's token ratios, used in the PPO clip in place
  of the token ratio; it is kept differentiable through the mean, so in the unclipped region the
  gradient of turn k is ``w_k * (sum_{t in k} A_t / |k|) * grad log pi(turn k)`` (Lemma 4.1).
  The variants Turn-PPO (turn ratio), S-PPO (token ratio + correction), ST-PPO (turn ratio +
  correction; later called SO-PPO) and SO-GRPO (SO-PPO with GRPO advantages).
* The clipping-bias correction (the paper's idea, our equations): :mod:`sorl_verl.algos.correction`.
  ``norm_scope=batch`` (default) leaves the loss unscaled and hands its sums to the mini-batch's
  :class:`~sorl_verl.algos.correction.BatchCorrection`, which scales the accumulated gradient
  before the optimizer step; ``norm_scope=sequence`` multiplies each row's terms by its own scale.
* Ours: a clipped token is one whose gradient the clip removes: ``A > 0`` and ``w > 1 + eps_high``,
  ``A < 0`` and ``w < 1 - eps_low``, or ``A < 0`` and ``w > clip_ratio_c`` (verl's dual clip). The
  log-ratio is clamped to ``[-20, 20]`` before ``exp`` as verl's ``vanilla`` does. The math runs
  in at least float32 (bf16 turn means would lose the ratio's precision; float64 stays float64).
"""

from __future__ import annotations

from typing import Any

import torch
from verl.trainer.ppo.core_algos import agg_loss, register_policy_loss

from sorl_verl.recipes import METRIC_PREFIX

from .config import SorlLossOptions, config_get, resolve_options
from .correction import CorrectionSums, active_correction, correction_scale, hook_installed
from .turns import TurnSegments, segment_turns

__all__ = [
    "LOG_RATIO_CLAMP",
    "METRIC_PREFIX",
    "NUM_TURN_INDEX_METRICS",
    "aggregation_weights",
    "compute_policy_loss_s_ppo",
    "compute_policy_loss_so_ppo",
    "compute_policy_loss_st_ppo",
    "compute_policy_loss_turn_ppo",
    "clip_bounds",
    "clip_surrogates",
    "importance_log_ratio",
    "sorl_policy_loss",
]

LOG_RATIO_CLAMP = 20.0
NUM_TURN_INDEX_METRICS = 8
# The keys of verl's ``global_batch_info`` that ``agg_loss`` divides by.
_AGG_COUNT_KEYS = ("dp_size", "batch_num_tokens", "global_batch_size", "loss_scale_factor")


def importance_log_ratio(
    token_log_ratio: torch.Tensor, turn_log_ratio_sum: torch.Tensor, level: str, segments: TurnSegments
) -> torch.Tensor:
    """Log importance ratio per token at the chosen level, differentiable.

    Args:
        token_log_ratio: ``(batch, response_len)`` float, ``log_prob - old_log_prob``.
        turn_log_ratio_sum: ``(num_turns,)``, ``segments.segment_sum(token_log_ratio)``.
        level: ``token`` (PPO), ``turn`` (mean over the token's turn) or ``sequence`` (mean over
            the row's masked tokens).
        segments: the turns of the response mask.

    Returns:
        ``(batch, response_len)``; off-mask entries are 0 for ``turn`` (any value is harmless there:
        the loss masks them).
    """
    if level == "token":
        return token_log_ratio
    lengths = segments.turn_lengths.to(turn_log_ratio_sum.dtype)
    if level == "turn":
        return segments.broadcast(turn_log_ratio_sum / lengths)
    if level == "sequence":
        row_sum = segments.per_row_sum(turn_log_ratio_sum)
        row_len = segments.per_row_sum(lengths).clamp(min=1.0)
        return (row_sum / row_len)[:, None].expand(segments.shape)
    raise ValueError(f"unknown ratio level {level!r}")


def clip_bounds(advantages: torch.Tensor, opts: SorlLossOptions) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``[lower, upper]`` bounds on the ratio that reproduce PPO clip + dual clip.

    ``max(-A w, -A clip(w, 1-eps_low, 1+eps_high))``, then for ``A < 0`` ``min(., -A c)``, equals
    ``-A * clamp(w, lower, upper)`` with ``[0, 1+eps_high]`` for ``A > 0`` and
    ``[1-eps_low, c]`` for ``A < 0`` (``A = 0`` contributes nothing either way). One clamp with
    tensor bounds is cheaper than verl's max/min/where chain, forward and backward.

    Args:
        advantages: ``(batch, response_len)`` float.

    Returns:
        ``(lower, upper)``, both ``(batch, response_len)`` in the dtype of ``advantages``.
    """
    negative = advantages < 0
    lower = negative.to(advantages.dtype).mul_(1.0 - opts.clip_ratio_low)
    upper = torch.where(
        negative, advantages.new_tensor(opts.clip_ratio_c), advantages.new_tensor(1.0 + opts.clip_ratio_high)
    )
    return lower, upper


def aggregation_weights(
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens: int | None = None,
    global_batch_size: int | None = None,
    loss_scale_factor: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Per-row weight ``c`` that verl's ``agg_loss`` gives each masked token: ``(batch,)`` of ``dtype``.

    ``agg_loss(loss_mat, mask, mode, **global_batch_info) == sum_t c_row(t) * loss_mat_t * mask_t``
    (tested against verl). Divisions are guarded: an empty batch gives finite weights.
    """
    row_tokens = response_mask.sum(dim=-1, dtype=dtype)
    if loss_agg_mode == "token-mean":
        total = row_tokens.sum() if batch_num_tokens is None else row_tokens.new_tensor(float(batch_num_tokens))
        return (dp_size / total.clamp(min=1.0)).expand_as(row_tokens)
    if loss_agg_mode == "token-sum":
        return torch.full_like(row_tokens, float(dp_size))
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean"):
        if global_batch_size is None:
            rows = (row_tokens > 0).sum().to(row_tokens.dtype).clamp(min=1.0)
        else:
            rows = row_tokens.new_tensor(float(global_batch_size)).clamp(min=1.0)
        weights = (dp_size / rows).expand_as(row_tokens)
        if loss_agg_mode == "seq-mean-token-sum-norm":
            horizon = loss_scale_factor if loss_scale_factor is not None else response_mask.shape[-1]
            weights = weights / float(horizon)
        elif loss_agg_mode == "seq-mean-token-mean":
            weights = weights / (row_tokens + 1e-8)
        return weights
    raise ValueError(f"actor_rollout_ref.actor.loss_agg_mode={loss_agg_mode!r} is not supported by agg_loss")


def sorl_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    loss_name: str,
    options: SorlLossOptions | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The SORL clipped surrogate with clipping-triggered normalization.

    Args:
        old_log_prob, log_prob, advantages: ``(batch, response_len)``; any float dtype.
        response_mask: ``(batch, response_len)``, bool or 0/1.
        loss_agg_mode: verl's aggregation mode, passed to ``agg_loss``.
        config: the actor config (verl ``ActorConfig`` or a DictConfig): clip ratios,
            ``policy_loss`` options, ``global_batch_info``.
        rollout_is_weights: optional ``(batch, response_len)`` rollout-correction weights.
        loss_name: which registered variant (its defaults apply to unset options).
        options: resolved options; overrides what ``config`` says (tests and benchmarks).

    Returns:
        ``(loss, metrics)``: scalar loss (float32, or float64 for float64 inputs) and python floats under ``actor/sorl/...`` plus
        verl's usual ``actor/pg_clipfrac``, ``actor/ppo_kl``, ``actor/pg_clipfrac_lower``.
    """
    opts = options if options is not None else resolve_options(loss_name, config)
    global_batch_info = _global_batch_info(config)
    mask = response_mask.bool()
    segments = segment_turns(mask)

    # 1. Importance ratio (the paper's turn level keeps the gradient through the turn mean).
    dtype = torch.promote_types(log_prob.dtype, torch.float32)  # bf16/fp16 -> fp32, fp64 stays
    token_log_ratio = log_prob.to(dtype) - old_log_prob.to(dtype)
    turn_log_ratio_sum = segments.segment_sum(token_log_ratio)
    log_w = importance_log_ratio(token_log_ratio, turn_log_ratio_sum, opts.ratio_level, segments)
    ratio = torch.exp(log_w.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))

    # 2. PPO clip + dual clip, as one clamp with per-token bounds.
    adv = advantages.to(dtype)
    lower, upper = clip_bounds(adv, opts)
    clipped_ratio = torch.clamp(ratio, lower, upper)
    rollout_w = None if rollout_is_weights is None else rollout_is_weights.to(dtype)

    # 3. Clipping-bias correction: which tokens lost their gradient, and the row scale if any.
    clip = _clip_masks(ratio.detach(), adv, lower, upper, mask)
    row_scale, scale_metrics = _correction(
        ratio.detach(), adv, rollout_w, clip, mask, loss_agg_mode, global_batch_info, opts
    )

    # 4. The surrogate, aggregated by verl: -A * clip(w) (* rollout weight) (* row scale).
    with torch.no_grad():
        loss_weight = -adv if rollout_w is None else -adv * rollout_w
        if row_scale is not None:
            loss_weight = loss_weight * row_scale[:, None]
    pg_losses = clipped_ratio * loss_weight
    if mask.any():
        loss = agg_loss(loss_mat=pg_losses, loss_mask=mask, loss_agg_mode=loss_agg_mode, **global_batch_info)
    else:  # agg_loss would divide 0 by 0 for an all-masked micro-batch without global counts
        loss = (pg_losses * 0.0).sum()

    metrics = _diagnostics(segments, turn_log_ratio_sum.detach(), clip)
    metrics.update(scale_metrics)
    return loss, metrics


def clip_surrogates(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str,
    options: SorlLossOptions,
    global_batch_info: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Differentiable ``(removed, kept)``: the importance-sampled surrogate ``-w A`` summed with
    verl's aggregation weights over the clipped tokens and over the kept ones.

    ``grad removed`` is the clipping-bias term ``C(theta)`` in parameter space (what the clip
    threw away) and ``grad kept`` the policy gradient the clip kept: the exact-mode ablation
    (:func:`sorl_verl.algos.correction.exact_norms`) backpropagates each once more.
    """
    info = global_batch_info or {}
    mask = response_mask.bool()
    segments = segment_turns(mask)
    dtype = torch.promote_types(log_prob.dtype, torch.float32)
    token_log_ratio = log_prob.to(dtype) - old_log_prob.to(dtype)
    log_w = importance_log_ratio(token_log_ratio, segments.segment_sum(token_log_ratio), options.ratio_level, segments)
    ratio = torch.exp(log_w.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    adv = advantages.to(dtype)
    lower, upper = clip_bounds(adv, options)
    clip = _clip_masks(ratio.detach(), adv, lower, upper, mask)
    surrogate = -adv * ratio
    return tuple(
        agg_loss(loss_mat=surrogate * clip[which], loss_mask=mask, loss_agg_mode=loss_agg_mode, **info)
        for which in ("clipped", "kept")
    )


def _global_batch_info(config: Any) -> dict:
    return dict(config_get(config, "global_batch_info") or {})


@torch.no_grad()
def _clip_masks(
    ratio: torch.Tensor, adv: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor, mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """``(batch, response_len)`` bool masks: tokens clipped at the upper, lower and dual bound, kept."""
    above = (ratio > upper) & (adv != 0) & mask
    clipped_lower = (ratio < lower) & mask
    clipped = above | clipped_lower
    return {
        "upper": above & (adv > 0),
        "lower": clipped_lower,
        "dual": above & (adv < 0),
        "clipped": clipped,
        "kept": mask & ~clipped,
    }


def _correction(
    ratio: torch.Tensor,
    adv: torch.Tensor,
    rollout_w: torch.Tensor | None,
    clip: dict[str, torch.Tensor],
    mask: torch.Tensor,
    loss_agg_mode: str,
    global_batch_info: dict,
    opts: SorlLossOptions,
) -> tuple[torch.Tensor | None, dict[str, float]]:
    """Sums of ``u_t^2`` (see :mod:`.correction`) per row; the row scale for ``norm_scope=sequence``.

    Returns ``(row_scale or None, metrics)``: ``row_scale`` is ``(batch,)`` for the sequence scope
    (ones for ``none``), else None (the batch scope scales the gradient after the last
    micro-batch). The sums go to the open :class:`~.correction.BatchCorrection`, if any, when
    gradients are enabled (a forward-only call is not part of an update).
    """
    in_update = torch.is_grad_enabled()  # checked before no_grad below
    with torch.no_grad():
        return _correction_no_grad(ratio, adv, rollout_w, clip, mask, loss_agg_mode, global_batch_info, opts, in_update)


def _correction_no_grad(ratio, adv, rollout_w, clip, mask, loss_agg_mode, global_batch_info, opts, in_update):
    counts = {key: global_batch_info[key] for key in _AGG_COUNT_KEYS if key in global_batch_info}
    row_weights = aggregation_weights(mask, loss_agg_mode, **counts, dtype=ratio.dtype)  # (batch,)
    row_tokens = mask.sum(dim=-1).to(ratio.dtype)
    batch_tokens = float(global_batch_info.get("batch_num_tokens") or row_tokens.sum().item())
    omega = row_weights * (batch_tokens / float(counts.get("dp_size", 1)))  # 1 for token-mean
    u_sq = (ratio * adv).square()
    if rollout_w is not None:
        u_sq = u_sq * rollout_w.square()
    clipped_sq = (u_sq * clip["clipped"]).sum(dim=-1) * omega.square()  # (batch,)
    kept_sq = (u_sq * clip["kept"]).sum(dim=-1) * omega.square()

    rows = (row_tokens > 0).to(ratio.dtype)
    row_scale, metrics = None, {}
    row_scale_min, rows_scaled = 1.0, 0.0
    if opts.norm_scope == "sequence":
        row_scale = correction_scale(clipped_sq, kept_sq, row_tokens, opts.normalization, opts.tau, opts.kappa)
        metrics[METRIC_PREFIX + "norm_scale"] = ((row_scale * rows).sum() / rows.sum().clamp(min=1.0)).item()
        row_scale_min = torch.where(rows > 0, row_scale, torch.ones_like(row_scale)).min()
        rows_scaled = ((row_scale < 1) & (rows > 0)).sum()

    corr = active_correction()
    if in_update and ratio.numel():
        if corr is None and opts.norm_scope == "batch" and opts.normalization != "none":
            raise RuntimeError(
                "norm_scope=batch scales the gradient of the whole mini-batch before the optimizer step: "
                "it needs verl's BaseEngine.train_batch hook (installed by sorl_verl on verl 0.9.1; "
                f"installed now: {hook_installed()}) or an open sorl_verl.algos.correction.batch_correction(). "
                "Outside them use actor_rollout_ref.actor.policy_loss.norm_scope=sequence."
            )
        if corr is not None:
            totals = torch.stack([row_tokens.sum(), clipped_sq.sum(), kept_sq.sum(), rows.sum()])
            corr.add(
                CorrectionSums(totals, row_scale_min, rows_scaled),
                scope=opts.norm_scope,
                mode=opts.normalization,
                tau=opts.tau,
                kappa=opts.kappa,
                expected_tokens=global_batch_info.get("batch_num_tokens"),
            )
    return row_scale, metrics


# Per-turn clip counts are packed into one float64 bincount: upper + lower * 2^17 + dual * 2^34
# stays exact below 2^53 while a turn has fewer than 2^17 tokens (longer turns: three bincounts).
_PACK = float(2**17)


@torch.no_grad()
def _per_turn_clip_counts(
    segments: TurnSegments, upper: torch.Tensor, lower: torch.Tensor, dual: torch.Tensor
) -> torch.Tensor:
    """``(3, num_turns)`` float64 counts of upper / lower / dual clipped tokens per turn."""
    size = segments.num_turns + 1
    if segments.shape[-1] < _PACK:
        packed = upper.double().add_(lower, alpha=_PACK).add_(dual, alpha=_PACK * _PACK)
        total = torch.bincount(segments.scatter_index, weights=packed.view(-1), minlength=size)[:-1]
        dual_count = torch.floor(total / (_PACK * _PACK))
        rest = total - dual_count * (_PACK * _PACK)
        lower_count = torch.floor(rest / _PACK)
        return torch.stack([rest - lower_count * _PACK, lower_count, dual_count])
    return torch.stack(
        [
            torch.bincount(segments.scatter_index, weights=flags.double().view(-1), minlength=size)[:-1]
            for flags in (upper, lower, dual)
        ]
    )


@torch.no_grad()
def _diagnostics(
    segments: TurnSegments, turn_log_ratio_sum: torch.Tensor, clip: dict[str, torch.Tensor]
) -> dict[str, float]:
    """Clip and ratio metrics of one loss call; every call returns the same keys (verl's dp reduction needs that).

    Turn-level fractions are averaged over turns (each turn counts once, whatever its length).
    ``clipfrac_turn_idx_k`` is the clipped-token fraction of the k-th turns of the rows, 0 when
    no row has a k-th turn. ``turn_ratio_*`` is the turn-level ratio whatever level the loss uses.
    The correction's norms and scale per mini-batch come from :mod:`.correction`.
    """
    counts = _per_turn_clip_counts(segments, clip["upper"], clip["lower"], clip["dual"]).float()
    lengths = segments.turn_lengths.float()
    num_tokens = lengths.sum().clamp(min=1.0)
    num_turns = max(segments.num_turns, 1)
    num_rows = (segments.turns_per_row > 0).sum().clamp(min=1).float()
    token_fraction = counts.sum(dim=1) / num_tokens  # upper, lower, dual
    turn_fraction = (counts / lengths).sum(dim=1) / num_turns
    any_clipped = counts.sum(dim=0)

    bins = NUM_TURN_INDEX_METRICS
    in_range = (segments.turn_index < bins).float()
    bin_index = segments.turn_index.clamp(max=bins - 1)
    by_index = lengths.new_zeros(2, bins)
    by_index[0].index_add_(0, bin_index, any_clipped * in_range)
    by_index[1].index_add_(0, bin_index, lengths * in_range)
    clipfrac_by_index = by_index[0] / by_index[1].clamp(min=1.0)

    turn_ratio = torch.exp((turn_log_ratio_sum.float() / lengths).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    if segments.num_turns == 0:
        turn_ratio = lengths.new_ones(1)
    values = {
        "clipfrac_token_upper": token_fraction[0],
        "clipfrac_token_lower": token_fraction[1],
        "clipfrac_token_dual": token_fraction[2],
        "clipfrac_turn_upper": turn_fraction[0],
        "clipfrac_turn_lower": turn_fraction[1],
        "clipfrac_turn": (any_clipped / lengths).sum() / num_turns,
        "turn_ratio_mean": turn_ratio.mean(),
        "turn_ratio_min": turn_ratio.min(),
        "turn_ratio_max": turn_ratio.max(),
        "turns_per_seq": segments.turns_per_row.sum().float() / num_rows,
    }
    values.update({f"clipfrac_turn_idx_{k + 1}": clipfrac_by_index[k] for k in range(bins)})
    names = list(values)
    numbers = torch.stack([values[name] for name in names] + [-turn_log_ratio_sum.float().sum() / num_tokens]).tolist()
    metrics = {METRIC_PREFIX + name: value for name, value in zip(names, numbers[:-1], strict=True)}
    # verl's usual keys, so dashboards built for vanilla PPO keep working.
    metrics["actor/pg_clipfrac"] = numbers[0] + numbers[1]
    metrics["actor/pg_clipfrac_lower"] = numbers[2]
    metrics["actor/ppo_kl"] = numbers[-1]
    return metrics


def _registered_variant(name: str, doc: str):
    """Register ``name`` as a verl policy loss: :func:`sorl_policy_loss` with that name's defaults."""

    def loss_fn(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        loss_agg_mode="token-mean",
        config=None,
        rollout_is_weights=None,
    ):
        return sorl_policy_loss(
            old_log_prob,
            log_prob,
            advantages,
            response_mask,
            loss_agg_mode,
            config,
            rollout_is_weights,
            loss_name=name,
        )

    loss_fn.__name__ = loss_fn.__qualname__ = f"compute_policy_loss_{name}"
    loss_fn.__doc__ = doc
    return register_policy_loss(name)(loss_fn)


compute_policy_loss_turn_ppo = _registered_variant(
    "turn_ppo", "Turn-PPO: PPO clip on the turn-level ratio, no normalization (paper's variant)."
)
compute_policy_loss_s_ppo = _registered_variant(
    "s_ppo", "S-PPO: token-level ratio + clipping-triggered normalization (paper's variant)."
)
compute_policy_loss_st_ppo = _registered_variant(
    "st_ppo", "ST-PPO: turn-level ratio + clipping-triggered normalization (paper's main variant)."
)
compute_policy_loss_so_ppo = _registered_variant(
    "so_ppo", "SO-PPO: the later paper's name for ST-PPO (same defaults). SO-GRPO = this + adv_estimator=grpo."
)
