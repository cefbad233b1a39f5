"""The batch-level clipping-bias correction: the scale rule, verl's engine hook, and invariance
to the micro-batch split and the data-parallel size (two gloo ranks)."""

import math
import os
import socket
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

from sorl_verl.algos.correction import BatchCorrection, batch_correction, correction_scale, hook_installed
from sorl_verl.algos.losses import sorl_policy_loss

ROWS, LENGTH, FEATURES = 8, 12, 5


def problem(seed=0):
    """A tiny policy: log-probs linear in shared parameters, so every row's gradient reaches them."""
    gen = torch.Generator().manual_seed(seed)
    features = torch.randn(ROWS, LENGTH, FEATURES, generator=gen, dtype=torch.float64)
    old = -torch.rand(ROWS, LENGTH, generator=gen, dtype=torch.float64)
    advantages = torch.randn(ROWS, 1, generator=gen, dtype=torch.float64).expand(ROWS, LENGTH).contiguous()
    mask = torch.rand(ROWS, LENGTH, generator=gen) < 0.8
    mask[:, 5] = False  # an observation gap: two turns per row
    theta0 = 0.35 * torch.randn(FEATURES, generator=gen, dtype=torch.float64)
    return features, old, advantages, mask, theta0


def config(scope="batch", normalization="relative", tokens=None, dp_size=1, **extra):
    return OmegaConf.create(
        {
            "clip_ratio": 0.2,
            "clip_ratio_c": 3.0,
            "policy_loss": {"loss_mode": "st_ppo", "normalization": normalization, "norm_scope": scope, **extra},
            "global_batch_info": {"dp_size": dp_size, "batch_num_tokens": tokens, "global_batch_size": ROWS},
        }
    )


def update(theta, rows, micro_batches, cfg, features, old, advantages, mask, group=None, reduce=None):
    """One optimizer step as verl's engine runs it; returns (gradient used, correction metrics)."""
    optimizer = torch.optim.SGD([theta], lr=0.0)
    optimizer.zero_grad()
    with batch_correction(optimizer, group) as corr:
        for part in torch.tensor(rows).chunk(micro_batches):
            log_prob = old[part] + features[part] @ theta
            loss, _ = sorl_policy_loss(
                old[part], log_prob, advantages[part], mask[part], "token-mean", cfg, loss_name="st_ppo"
            )
            loss.backward()
        if reduce is not None:
            reduce(theta.grad)  # what FSDP's gradient reduce-scatter does (an average over ranks)
        optimizer.step()
    return theta.grad.clone(), corr.finalize()


def slow_reference(features, old, advantages, mask, theta0, tau=0.1):
    """Whole mini-batch in Python: s from per-token sums, gradient of s * token-mean surrogate."""
    theta = theta0.clone().requires_grad_(True)
    clipped_sq, kept_sq, tokens, loss = 0.0, 0.0, 0, 0.0
    n = int(mask.sum())
    for r in range(ROWS):
        turns, current = [], []
        for t in range(LENGTH):
            if mask[r, t]:
                current.append(t)
            elif current:
                turns, current = turns + [current], []
        turns += [current] if current else []
        for turn in turns:
            log_w = sum(old[r, t] + features[r, t] @ theta - old[r, t] for t in turn) / len(turn)
            w = torch.exp(log_w)
            for t in turn:
                a, wv = float(advantages[r, t]), float(w.detach())
                clipped = (a > 0 and wv > 1.2) or (a < 0 and (wv < 0.8 or wv > 3.0))
                surrogate = torch.maximum(-a * w, -a * torch.clamp(w, 0.8, 1.2))
                if a < 0:
                    surrogate = torch.minimum(surrogate, torch.tensor(-a * 3.0, dtype=torch.float64))
                loss = loss + surrogate / n
                term = (wv * a) ** 2
                clipped_sq, kept_sq = clipped_sq + term * clipped, kept_sq + term * (not clipped)
                tokens += 1
    scale = 1.0 if clipped_sq == 0 else min(1.0, tau * math.sqrt(kept_sq / clipped_sq))
    loss.backward()
    return scale * theta.grad, scale, math.sqrt(clipped_sq / tokens), math.sqrt(kept_sq / tokens)


def test_scale_rule_values_continuity_and_extremes():
    one = torch.tensor(1.0, dtype=torch.float64)
    # Nothing clipped: exactly 1 in every mode, whatever the thresholds.
    for mode in ("relative", "absolute", "none"):
        assert correction_scale(0 * one, 5 * one, 10 * one, mode, 1e-9, 1e-9).item() == 1.0
    # relative: min(1, tau * G / C); absolute: min(1, kappa / C_tok); counts cancel in relative.
    assert correction_scale(4 * one, 100 * one, 100 * one, "relative", 0.1, 0.1).item() == pytest.approx(0.5)
    assert correction_scale(4 * one, 1e4 * one, 1e4 * one, "relative", 0.1, 0.1).item() == pytest.approx(1.0)
    assert correction_scale(4 * one, 0 * one, 100 * one, "relative", 0.1, 0.1).item() == 0.0
    assert correction_scale(4 * one, 0 * one, 100 * one, "absolute", 0.1, 0.1).item() == pytest.approx(0.5)
    # One token crossing the clip moves s by at most a small bound (it was a jump to 1/C before).
    n = 10_000
    kept = torch.full((), float(n), dtype=torch.float64)  # u = 1 on every token
    for u in (1.2, 3.0):
        before = correction_scale(0 * one, kept, n * one, "relative", 0.1, 0.1)
        after = correction_scale(u**2 * one, kept - 1, n * one, "relative", 0.1, 0.1)
        assert before.item() == 1.0 and after.item() >= 1.0 - 1e-12
        after = correction_scale(u**2 * one, kept - 1, n * one, "absolute", 0.1, 0.1)
        assert 1.0 - after.item() <= u / (0.1 * math.sqrt(n))
    # Finite and within [0, 1] for extreme sums.
    sums = torch.tensor([0.0, 1e-300, 1.0, 1e300], dtype=torch.float64)
    for mode in ("relative", "absolute"):
        s = correction_scale(sums[:, None].expand(4, 4), sums[None, :].expand(4, 4), 7 * one, mode, 0.1, 0.1)
        assert torch.isfinite(s).all() and (s >= 0).all() and (s <= 1).all()


@pytest.mark.parametrize("log_ratio", [50.0, -50.0])
def test_extreme_log_ratios_give_a_finite_batch_scale(log_ratio):
    features, old, advantages, mask, _ = problem()
    theta = torch.zeros(FEATURES, dtype=torch.float64, requires_grad=True)
    shifted = old - log_ratio  # log_prob = old_shifted + log_ratio
    grad, result = update(
        theta, list(range(ROWS)), 2, config(tokens=int(mask.sum())), features, shifted, advantages, mask
    )
    assert torch.isfinite(grad).all() and all(math.isfinite(v) for k, v in result.items() if k != "norm_scale")
    assert 0.0 <= result["norm_scale"] <= 1.0


@pytest.mark.parametrize("micro_batches", [1, 4])
def test_batch_update_equals_slow_reference(micro_batches):
    features, old, advantages, mask, theta0 = problem()
    theta = theta0.clone().requires_grad_(True)
    grad, result = update(
        theta, list(range(ROWS)), micro_batches, config(tokens=int(mask.sum())), features, old, advantages, mask
    )
    ref_grad, ref_scale, c_tok, g_tok = slow_reference(features, old, advantages, mask, theta0)
    assert 0.0 < ref_scale < 1.0  # the problem clips enough for the scale to act
    assert result["norm_scale"] == pytest.approx(ref_scale, rel=1e-9)
    assert result["c_tok"] == pytest.approx(c_tok, rel=1e-9) and result["g_tok"] == pytest.approx(g_tok, rel=1e-9)
    assert torch.allclose(grad, ref_grad, rtol=1e-9, atol=1e-14)


def test_each_scope_gives_a_gradient_parallel_per_row_to_the_uncorrected_one():
    """The correction only rescales: per row, the corrected gradient is a non-negative multiple."""
    features, old, advantages, mask, theta0 = problem()
    tokens = int(mask.sum())
    for scope in ("batch", "sequence"):
        for r in range(ROWS):
            grads = []
            for normalization in ("none", "relative"):
                theta = theta0.clone().requires_grad_(True)
                optimizer = torch.optim.SGD([theta], lr=0.0)
                with batch_correction(optimizer):
                    # the row alone, with the batch's other rows in the same correction
                    for part, keep in ((torch.arange(ROWS) != r, False), (torch.tensor([r]), True)):
                        log_prob = old[part] + features[part] @ theta
                        loss, _ = sorl_policy_loss(
                            old[part], log_prob, advantages[part], mask[part], "token-mean",
                            config(scope, normalization, tokens), loss_name="st_ppo",
                        )  # fmt: skip
                        if keep:
                            theta.grad = None
                            loss.backward()
                        else:
                            loss.detach()
                    optimizer.step()
                grads.append(theta.grad.clone())
            plain, corrected = grads
            if plain.abs().max() == 0:
                continue
            k = (corrected @ plain) / (plain @ plain)
            assert k >= 0 and torch.allclose(corrected, k * plain, rtol=1e-9, atol=1e-14), (scope, r)


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _dp_worker(rank, world, port, out_path):
    """One data-parallel rank (run in its own process by the test below)."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        features, old, advantages, mask, theta0 = problem()
        rows = list(range(ROWS))[rank::world]
        theta = theta0.clone().requires_grad_(True)

        def average(grad):
            dist.all_reduce(grad)
            grad /= world

        cfg = config(tokens=int(mask.sum()), dp_size=world)
        torch.save(update(theta, rows, 2, cfg, features, old, advantages, mask, reduce=average), out_path)
    finally:
        dist.destroy_process_group()


_LAUNCH = (
    "import importlib.util, sys; spec = importlib.util.spec_from_file_location('dp_test', sys.argv[1]); "
    "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
    "m._dp_worker(int(sys.argv[2]), 2, int(sys.argv[3]), sys.argv[4])"
)


def test_two_gloo_ranks_give_the_single_rank_update(tmp_path):
    features, old, advantages, mask, theta0 = problem()
    theta = theta0.clone().requires_grad_(True)
    single, single_result = update(
        theta, list(range(ROWS)), 4, config(tokens=int(mask.sum())), features, old, advantages, mask
    )
    assert single_result["norm_scale"] < 1.0
    port = str(_free_port())
    procs = [
        subprocess.Popen([sys.executable, "-c", _LAUNCH, __file__, str(rank), port, str(tmp_path / f"{rank}.pt")])
        for rank in (0, 1)
    ]
    assert [proc.wait(timeout=300) for proc in procs] == [0, 0]
    for rank in (0, 1):
        grad, result = torch.load(tmp_path / f"{rank}.pt", weights_only=False)
        assert torch.allclose(grad, single, rtol=1e-9, atol=1e-14), rank
        for key in ("norm_scale", "c_tok", "g_tok", "norm_scale_min"):
            assert result[key] == pytest.approx(single_result[key], rel=1e-9), key


def test_missing_or_double_counted_micro_batches_are_refused():
    features, old, advantages, mask, theta0 = problem()
    theta = theta0.clone().requires_grad_(True)
    with pytest.raises(RuntimeError, match="cover .* tokens"):
        update(theta, list(range(ROWS // 2)), 1, config(tokens=int(mask.sum())), features, old, advantages, mask)
    corr = BatchCorrection()
    with pytest.raises(RuntimeError, match="norm_scope=batch"):
        log_prob = (old + features @ theta0).requires_grad_()
        sorl_policy_loss(old, log_prob, advantages, mask, "token-mean", config(tokens=1), loss_name="st_ppo")
    assert not corr.used


def test_forward_only_calls_add_nothing():
    features, old, advantages, mask, theta0 = problem()
    with batch_correction() as corr, torch.no_grad():
        sorl_policy_loss(old, old + features @ theta0, advantages, mask, "token-mean", config(), loss_name="st_ppo")
    assert not corr.used


class _TinyEngine:
    """Just enough of verl's BaseEngine for its own ``train_batch`` (the hooked one) to run."""

    def __init__(self, theta, micro_batches):
        self.theta = theta
        self.optimizer = torch.optim.SGD([theta], lr=0.0)
        self.micro_batches = micro_batches

    def optimizer_zero_grad(self):
        self.optimizer.zero_grad()

    def forward_backward_batch(self, data, loss_function, forward_only=False):
        for part in torch.arange(ROWS).chunk(self.micro_batches):
            loss = loss_function(part)
            loss.backward()
        return {"metrics": {}}

    def optimizer_step(self):
        grad_norm = torch.nn.utils.clip_grad_norm_([self.theta], max_norm=1e9)
        self.optimizer.step()
        return grad_norm.item()

    def is_mp_src_rank_with_outputs(self):
        return True

    def get_data_parallel_group(self):
        return None  # no process group: a single rank


def test_verl_engine_train_batch_carries_the_hook():
    from verl.workers.engine.base import BaseEngine

    assert hook_installed()
    features, old, advantages, mask, theta0 = problem()
    engine_cls = type("Engine", (_TinyEngine, BaseEngine), {})
    cfg = config(tokens=int(mask.sum()))

    def loss_function(part):
        log_prob = old[part] + features[part] @ engine.theta
        return sorl_policy_loss(
            old[part], log_prob, advantages[part], mask[part], "token-mean", cfg, loss_name="st_ppo"
        )[0]

    ref_grad, ref_scale, _, _ = slow_reference(features, old, advantages, mask, theta0)
    for micro_batches in (1, 4):
        engine = engine_cls(theta0.clone().requires_grad_(True), micro_batches)
        outputs = BaseEngine.train_batch(engine, data=TensorDict({}, batch_size=[]), loss_function=loss_function)
        metrics = {key: value.aggregate() for key, value in outputs["metrics"].items() if key.startswith("actor/sorl/")}
        assert metrics["actor/sorl/norm_scale"] == pytest.approx(ref_scale, rel=1e-9)
        assert metrics["actor/sorl/norm_scale_min"] == pytest.approx(ref_scale, rel=1e-9)
        assert metrics["actor/sorl/scaled_step_frac"] == 1.0
        assert torch.allclose(engine.theta.grad, ref_grad, rtol=1e-9, atol=1e-14)
        assert outputs["metrics"]["grad_norm"] > 0


def test_batch_scope_scales_entropy_and_kl_terms_with_the_update_and_sequence_scope_does_not():
    """Batch scope: the whole gradient (policy + regularizers) is multiplied by s. Sequence scope:
    only the policy-gradient rows are; a regularizer added to the loss keeps its gradient."""
    features, old, advantages, mask, theta0 = problem()
    tokens = int(mask.sum())

    def grads(scope, normalization, with_regularizer):
        theta = theta0.clone().requires_grad_(True)
        optimizer = torch.optim.SGD([theta], lr=0.0)
        with batch_correction(optimizer) as corr:
            log_prob = old + features @ theta
            loss, _ = sorl_policy_loss(
                old, log_prob, advantages, mask, "token-mean", config(scope, normalization, tokens), loss_name="st_ppo"
            )
            if with_regularizer:  # what verl adds: entropy_coeff * entropy, kl_coef * kl (here any function of theta)
                loss = loss + 0.3 * (log_prob * mask).square().sum() / tokens
            loss.backward()
            optimizer.step()
        return theta.grad.clone(), corr.finalize()

    pg_none, _ = grads("batch", "none", False)
    full_none, _ = grads("batch", "none", True)
    regularizer = full_none - pg_none
    full_batch, result = grads("batch", "relative", True)
    assert result["norm_scale"] < 1.0
    assert torch.allclose(full_batch, result["norm_scale"] * full_none, rtol=1e-9)
    pg_seq, _ = grads("sequence", "relative", False)
    full_seq, _ = grads("sequence", "relative", True)
    assert torch.allclose(full_seq - pg_seq, regularizer, rtol=1e-9, atol=1e-14)
