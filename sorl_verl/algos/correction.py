"""Clipping-bias correction: the scale ``s`` that shrinks an update whose clip threw much away.

What is the paper's and what is ours:

* Paper (abstract, reviewers' wording; the body is not public): the update is normalized by the
  L2 norm of the clipping-bias term ``C(theta) = sum_{clipped t} w_t A_t grad log pi_t``, the part
  of the importance-sampled policy gradient that PPO's clip removes, which "down-weights
  unreliable, highly off-policy samples"; nothing changes when nothing is clipped.
* Ours, the norms: each ``grad log pi_t`` is taken as a unit direction, so a token contributes
  ``u_t = omega_t |w_t A_t r_t|`` (ratio, advantage, rollout-correction weight, and ``omega_t`` the
  weight verl's ``agg_loss`` gives the token relative to ``token-mean``: 1 for ``token-mean``).
  ``C_tok = sqrt(sum_{clipped} u_t^2 / N)`` and ``G_tok = sqrt(sum_{kept} u_t^2 / N)`` over the
  ``N`` tokens of the scope: per-token root mean squares, so neither the token count nor the
  data-parallel size changes them, and runs compare.
* Ours, the rule (the paper's exact equation is not available to us):

  - ``relative`` (default): ``s = min(1, tau * G_tok / C_tok)``: the update shrinks once what the
    clip removed exceeds ``tau`` times what it kept. ``tau = 0.1`` by default: for tokens of
    similar size the scale starts to move at about 1% of tokens clipped and is about 0.5 at 4-5%
    (the synthetic sweep in ``benchmarks/sweep_correction.py``; docs/algorithms.md). The former
    rule, ``tau = 1``, acted only past ~50% clipped: S-PPO was vanilla PPO in practice.
  - ``absolute``: ``s = min(1, kappa / C_tok)``, in advantage units (``kappa = 0.1``).
  - ``none``: ``s = 1``.

  Both are continuous in the log-ratios (``C_tok`` and ``G_tok`` move by one token's ``u_t`` when
  it crosses the clip; ``s`` is Lipschitz in them away from ``C_tok = 0``), equal 1 when nothing
  is clipped, and never enlarge a step. (``literal``, ``s = 1 / C``, was removed: it jumps from
  1 to ``1/C`` when one token crosses the clip and enlarges steps when ``C < 1``.)
* Ours, the scope:

  - ``batch`` (default; the reviewers' reading): ``C`` and ``G`` over the whole mini-batch, every
    micro-batch and every data-parallel rank, and one ``s`` multiplies the accumulated gradient
    right before the optimizer step, so the update is the same for any micro-batch split and any
    DP size. It scales the whole update, entropy and KL-loss terms included: the regularizers keep
    their weight relative to the policy gradient (the update is normalized, as the paper says).
  - ``sequence`` (the abstract's "down-weights samples"): one ``s`` per trajectory from its own
    tokens, multiplying that trajectory's policy-gradient terms inside the loss. Like verl's
    rollout-correction weights, it leaves the entropy and KL-loss terms as they are (they carry
    no importance ratio).

How the batch scope reaches verl 0.9.1: a registered loss only sees one micro-batch, and the
scale is known only after the last one. The narrowest hook is verl's ``BaseEngine.train_batch``
(zero grads, forward/backward over the micro-batches, optimizer step: one optimizer step per
mini-batch for every engine; verl 0.9 has no public hook around it). :func:`install` wraps it,
once, in every process that imports verl's engine module, and only on a verl version it was
written for (0.9.x, :mod:`sorl_verl._verl_version`): the wrapper opens a
:class:`BatchCorrection` for the call; SORL losses add their sums to it; a step pre-hook on the
engine's optimizer (torch's public ``register_step_pre_hook``, so after verl's gradient clipping,
which therefore cannot absorb the scale; ``actor/grad_norm`` is the norm before the scale)
all-reduces the sums, computes ``s`` and multiplies every gradient by it. The wrapper then adds
the mini-batch's metrics to verl's. The ``sequence`` scope needs no hook for the update itself.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch

from sorl_verl._verl_version import PATCHABLE_VERL, installed_verl, verl_patchable
from sorl_verl.recipes import METRIC_PREFIX

__all__ = [
    "DEFAULT_KAPPA",
    "DEFAULT_TAU",
    "ENGINE_MODULE",
    "METRIC_NAMES",
    "NORMALIZATION_MODES",
    "NORM_SCOPES",
    "BatchCorrection",
    "CorrectionSums",
    "active_correction",
    "batch_correction",
    "correction_scale",
    "exact_norms",
    "install",
]

_logger = logging.getLogger("sorl_verl")

NORMALIZATION_MODES = ("relative", "absolute", "none")
NORM_SCOPES = ("batch", "sequence")
DEFAULT_TAU = 0.1
DEFAULT_KAPPA = 0.1
ENGINE_MODULE = "verl.workers.engine.base"
# Added to verl's metrics once per optimizer step (mini-batch); see BatchCorrection.metrics.
METRIC_NAMES = ("c_tok", "g_tok", "norm_scale", "norm_scale_min", "scaled_step_frac", "scaled_row_frac")


def correction_scale(
    clipped_sq: torch.Tensor, kept_sq: torch.Tensor, tokens: torch.Tensor, mode: str, tau: float, kappa: float
) -> torch.Tensor:
    """The scale ``s`` from sums over a scope's tokens (elementwise; no gradient needed).

    Args:
        clipped_sq: ``sum u_t^2`` over clipped tokens, any shape (``()`` for a batch, ``(rows,)``).
        kept_sq: ``sum u_t^2`` over kept tokens, same shape.
        tokens: token count ``N`` per entry, same shape (0 allowed).
        mode: ``relative`` | ``absolute`` | ``none``.
        tau, kappa: thresholds of ``relative`` and ``absolute``.

    Returns:
        ``s`` in ``[0, 1]``, same shape and dtype as ``clipped_sq``: exactly 1 where nothing is
        clipped, finite always.
    """
    ones = torch.ones_like(clipped_sq)
    if mode == "none":
        return ones
    n = tokens.to(clipped_sq.dtype).clamp(min=1.0)
    c_tok = (clipped_sq / n).sqrt()
    if mode == "relative":
        g_tok = (kept_sq / n).sqrt()
        bound = tau * g_tok  # s = min(1, tau G / C) = bound / max(bound, C); G = 0 < C gives s = 0
        scale = bound / torch.maximum(bound, c_tok).clamp(min=torch.finfo(c_tok.dtype).tiny)
    elif mode == "absolute":
        scale = kappa / c_tok.clamp(min=kappa)
    else:
        raise ValueError(f"unknown normalization mode {mode!r}; known: {NORMALIZATION_MODES}")
    return torch.where(clipped_sq > 0, scale, ones)


@dataclass
class CorrectionSums:
    """Sums over tokens that one loss call adds to a :class:`BatchCorrection` (detached).

    ``totals`` is ``(4,)`` float64: tokens, ``sum u^2`` clipped, ``sum u^2`` kept, rows.
    ``row_scale_min`` and ``rows_scaled`` are for the ``sequence`` scope (1 and 0 otherwise).
    """

    totals: torch.Tensor
    row_scale_min: float | torch.Tensor = 1.0
    rows_scaled: float | torch.Tensor = 0.0


class BatchCorrection:
    """Collects the sums of one mini-batch and applies the batch-level scale before the step.

    Used by the verl hook (:func:`install`) and directly by tests and benchmarks::

        with batch_correction(optimizer, mode="relative", tau=0.1) as corr:
            for micro_batch in mini_batch:
                loss, _ = sorl_policy_loss(...)   # norm_scope=batch adds its sums to ``corr``
                loss.backward()
            optimizer.step()                      # the pre-hook scales the gradients first
        corr.metrics()

    The mode and thresholds come from the first loss call that adds sums (all calls of one
    mini-batch share the actor config). ``expected_tokens`` (verl's global ``batch_num_tokens``)
    checks that the sums over all ranks cover exactly the mini-batch (a multiple of it when
    sequence-parallel ranks hold the same rows).
    """

    def __init__(self, optimizer: torch.optim.Optimizer | None = None, group=None) -> None:
        self.optimizer = optimizer
        self.group = group
        self.scope: str | None = None
        self.mode = "none"
        self.tau = DEFAULT_TAU
        self.kappa = DEFAULT_KAPPA
        self.expected_tokens: float | None = None
        self._totals: torch.Tensor | None = None
        self._row_scale_min: list = []
        self._rows_scaled: list = []
        self._result: dict[str, float] | None = None
        self.scale: float = 1.0
        self.applied = False
        self._handle = None
        self._token: contextvars.Token | None = None

    @property
    def used(self) -> bool:
        return self._totals is not None

    def add(
        self, sums: CorrectionSums, *, scope: str, mode: str, tau: float, kappa: float, expected_tokens=None
    ) -> None:
        """Record one loss call's sums (called by the loss, with gradients enabled)."""
        if self._result is not None:
            raise RuntimeError("sorl_verl: a loss added clipping statistics after the optimizer step of its mini-batch")
        if self.scope is None:
            self.scope, self.mode, self.tau, self.kappa = scope, mode, tau, kappa
        elif (scope, mode, tau, kappa) != (self.scope, self.mode, self.tau, self.kappa):
            raise RuntimeError(
                "sorl_verl: loss calls of one mini-batch disagree on the clipping-bias correction options"
            )
        if expected_tokens is not None:
            self.expected_tokens = float(expected_tokens)
        totals = sums.totals.detach().to(torch.float64)
        self._totals = totals if self._totals is None else self._totals + totals
        self._row_scale_min.append(sums.row_scale_min)
        self._rows_scaled.append(sums.rows_scaled)

    def _reduce(self) -> tuple[torch.Tensor, float, float]:
        """Sums over every micro-batch and rank: ``(totals, row scale min, rows scaled)``."""
        totals = self._totals.clone()
        mins = torch.as_tensor([float(x) for x in self._row_scale_min], dtype=torch.float64).min()
        rows_scaled = torch.as_tensor([float(x) for x in self._rows_scaled], dtype=torch.float64).sum()
        extra = torch.stack([rows_scaled, -mins]).to(totals.device)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            if torch.distributed.get_world_size(self.group) > 1:
                torch.distributed.all_reduce(totals, group=self.group)
                rows_scaled_t = extra[:1].clone()
                torch.distributed.all_reduce(rows_scaled_t, group=self.group)
                neg_min = extra[1:].clone()
                torch.distributed.all_reduce(neg_min, op=torch.distributed.ReduceOp.MAX, group=self.group)
                extra = torch.cat([rows_scaled_t, neg_min])
        if self.expected_tokens:
            replication = totals[0].item() / self.expected_tokens
            if replication < 0.5 or abs(replication - round(replication)) > 1e-6:
                raise RuntimeError(
                    f"sorl_verl: the clipping statistics cover {totals[0].item():.0f} tokens over all ranks, "
                    f"but the mini-batch has {self.expected_tokens:.0f}: a loss call was missed or counted twice"
                )
            totals = totals / round(replication)  # sequence-parallel ranks hold the same rows
            extra[0] = extra[0] / round(replication)
        return totals, -extra[1].item(), extra[0].item()

    def finalize(self) -> dict[str, float]:
        """Reduce the sums once and compute the scale and metrics (idempotent)."""
        if self._result is not None or not self.used:
            return self._result or {}
        totals, row_scale_min, rows_scaled = self._reduce()
        tokens, clipped_sq, kept_sq, rows = totals.unbind()
        n = tokens.clamp(min=1.0)
        if self.scope == "batch":
            self.scale = float(correction_scale(clipped_sq, kept_sq, tokens, self.mode, self.tau, self.kappa))
            scale_mean = scale_min = self.scale
            row_frac = step_scaled = float(self.scale < 1.0)
        else:  # sequence: the loss already applied one scale per row
            scale_min = row_scale_min
            row_frac = rows_scaled / max(rows.item(), 1.0)
            scale_mean = float("nan")  # reported by the loss (mean over its rows)
            step_scaled = float(rows_scaled > 0)
        self._result = {
            "c_tok": math.sqrt(clipped_sq.item() / n.item()),
            "g_tok": math.sqrt(kept_sq.item() / n.item()),
            "norm_scale": scale_mean,
            "norm_scale_min": scale_min,
            "scaled_step_frac": step_scaled,
            "scaled_row_frac": row_frac,
        }
        return self._result

    def apply(self, params) -> None:
        """Finalize, then multiply every gradient in ``params`` by the batch-level scale."""
        self.finalize()
        if self.scope != "batch" or self.applied:
            return
        self.applied = True
        if self.scale == 1.0:
            return
        with torch.no_grad():
            for p in params:
                if p.grad is not None:
                    p.grad.mul_(self.scale)

    def _pre_step_hook(self, optimizer, args, kwargs) -> None:
        if self.used:
            self.apply(p for group in optimizer.param_groups for p in group["params"])

    def metrics(self) -> dict:
        """verl ``Metric`` objects for this mini-batch (mean over steps; ``norm_scale_min`` a true min).

        In the ``sequence`` scope ``norm_scale`` (mean over rows) comes from the loss itself.
        """
        from verl.utils.metric import AggregationType, Metric

        result = self.finalize()
        out = {}
        for name, value in result.items():
            if name == "norm_scale" and self.scope != "batch":
                continue
            aggregation = AggregationType.MIN if name.endswith("_min") else AggregationType.MEAN
            out[METRIC_PREFIX + name] = Metric(aggregation=aggregation, value=float(value))
        return out

    def __enter__(self) -> BatchCorrection:
        self._token = _ACTIVE.set(self)
        if self.optimizer is not None:
            self._handle = self.optimizer.register_step_pre_hook(self._pre_step_hook)
        return self

    def __exit__(self, *exc) -> None:
        if self._handle is not None:
            self._handle.remove()
        _ACTIVE.reset(self._token)


# Not on verl's objects: verl 0.9 hands a policy loss only tensors and the actor config, whose per-step
# dict it splats into agg_loss (no room for another key), and its distillation loss passes another config.
_ACTIVE: contextvars.ContextVar[BatchCorrection | None] = contextvars.ContextVar("sorl_verl_correction", default=None)


def active_correction() -> BatchCorrection | None:
    """The innermost open :class:`BatchCorrection` of this context (thread, task), if any."""
    return _ACTIVE.get()


@contextmanager
def batch_correction(optimizer: torch.optim.Optimizer | None = None, group=None) -> Iterator[BatchCorrection]:
    """Open a :class:`BatchCorrection` for one mini-batch (what the verl hook does per step)."""
    with BatchCorrection(optimizer, group) as corr:
        yield corr


def exact_norms(removed: torch.Tensor, kept: torch.Tensor, params) -> tuple[torch.Tensor, torch.Tensor]:
    """Parameter-space norms ``(||grad removed||, ||grad kept||)``: the exact-mode ablation.

    ``removed`` and ``kept`` come from :func:`sorl_verl.algos.losses.clip_surrogates`; each costs
    one more backward pass over the model (the graph is retained for the update's own backward).
    Plain (unsharded) parameters only: verl's FSDP engines shard them, so the trainer uses the
    token-space norms and this function serves benchmarks and ablations
    (``benchmarks/bench_update.py`` measures its cost and its agreement with the token-space rule).
    Summed over micro-batches, the per-micro-batch gradients must be added before the norm is
    taken; for one micro-batch the norms are exact.
    """
    params = [p for p in params if p.requires_grad]
    norms = []
    for surrogate in (removed, kept):
        if not surrogate.requires_grad:
            norms.append(surrogate.new_zeros(()))
            continue
        grads = torch.autograd.grad(surrogate, params, retain_graph=True, allow_unused=True)
        squares = [g.double().square().sum() for g in grads if g is not None]
        norms.append(torch.stack(squares).sum().sqrt() if squares else surrogate.new_zeros((), dtype=torch.float64))
    return norms[0], norms[1]


def _wrap_train_batch(original):
    @functools.wraps(original)
    def train_batch(self, data, loss_function):
        group = None
        get_group = getattr(self, "get_data_parallel_group", None)
        if callable(get_group):
            group = get_group()
        with BatchCorrection(getattr(self, "optimizer", None), group) as corr:
            outputs = original(self, data, loss_function)
        if corr.used:
            metrics = outputs.get("metrics") if isinstance(outputs, dict) else None
            extra = corr.metrics()  # every rank: may all-reduce if the optimizer step was skipped
            if metrics is not None:
                metrics.update(extra)
        return outputs

    train_batch._sorl_original = original
    return train_batch


def _patch_engine(module) -> None:
    if not verl_patchable():
        _logger.warning(
            "sorl_verl: the batch-level clipping-bias correction hooks verl's BaseEngine.train_batch, "
            "written for verl %s; installed verl is %s: not installed (norm_scope=batch will refuse to run)",
            PATCHABLE_VERL,
            installed_verl(),
        )
        return
    engine = module.BaseEngine
    if not hasattr(engine.train_batch, "_sorl_original"):
        engine.train_batch = _wrap_train_batch(engine.train_batch)


def hook_installed() -> bool:
    """Whether verl's engine module is imported and its ``train_batch`` carries the hook."""
    import sys

    module = sys.modules.get(ENGINE_MODULE)
    return module is not None and hasattr(module.BaseEngine.train_batch, "_sorl_original")


def install() -> None:
    """Wrap verl's ``BaseEngine.train_batch`` as soon as verl imports it (idempotent)."""
    from sorl_verl._import_hooks import call_after_import

    call_after_import(ENGINE_MODULE, _patch_engine)
