"""SORL policy losses: equivalences with verl, a slow per-row reference, Lemma 4.1, edge cases,
micro-batch invariance, and verl's own ``ppo_loss`` wrapper with a real ``ActorConfig``.

Every update runs as verl's engine runs it: inside a ``BatchCorrection`` whose optimizer step
applies the batch-level scale, so the gradients compared are the ones the optimizer would use."""

import math

import pytest
import torch
from omegaconf import OmegaConf
from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn

from sorl_verl.algos.config import LOSS_DEFAULTS, SorlLossOptions, SorlPolicyLossConfig, resolve_options
from sorl_verl.algos.correction import batch_correction
from sorl_verl.algos.losses import aggregation_weights, sorl_policy_loss

AGG_MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
SORL_LOSSES = ["turn_ppo", "s_ppo", "st_ppo", "so_ppo"]


def actor_config(loss_mode="st_ppo", global_batch_info=None, clip_ratio_c=3.0, **policy_loss):
    return OmegaConf.create(
        {
            "clip_ratio": 0.2,
            "clip_ratio_low": 0.2,
            "clip_ratio_high": 0.2,
            "clip_ratio_c": clip_ratio_c,
            "policy_loss": {"loss_mode": loss_mode, **policy_loss},
            "global_batch_info": global_batch_info or {},
        }
    )


def options(ratio_level="turn", normalization="relative", norm_scope="sequence", kappa=0.1, clip_ratio_c=3.0, tau=0.1):
    return SorlLossOptions(
        ratio_level=ratio_level,
        normalization=normalization,
        norm_scope=norm_scope,
        tau=tau,
        kappa=kappa,
        clip_ratio_low=0.2,
        clip_ratio_high=0.2,
        clip_ratio_c=clip_ratio_c,
    )


def random_batch(rows=5, length=12, spread=0.4, seed=0, mask_density=0.7, dtype=torch.float64):
    generator = torch.Generator().manual_seed(seed)
    mask = torch.rand(rows, length, generator=generator) < mask_density
    old = -torch.rand(rows, length, generator=generator, dtype=dtype) * 2
    new = old + spread * torch.randn(rows, length, generator=generator, dtype=dtype)
    advantages = torch.randn(rows, length, generator=generator, dtype=dtype)
    return old, new, advantages, mask


def run(loss_fn, old, new, advantages, mask, agg="token-mean", config=None, **kwargs):
    """Loss, the gradient the optimizer steps with (batch scale applied) and the metrics.

    As verl's engine: the loss inside a ``BatchCorrection`` whose optimizer step pre-hook scales
    the gradient; the correction's mini-batch metrics are merged into the loss's.
    """
    log_prob = new.clone().requires_grad_(True)
    optimizer = torch.optim.SGD([log_prob], lr=0.0)
    with batch_correction(optimizer) as corr:
        loss, metrics = _call(loss_fn, old, log_prob, advantages, mask, agg, config, **kwargs)
        loss.backward()
        optimizer.step()
    metrics.update({key: value.aggregate() for key, value in corr.metrics().items()})
    return loss.detach(), log_prob.grad, metrics


def _call(loss_fn, old, log_prob, advantages, mask, agg, config, **kwargs):
    return loss_fn(
        old_log_prob=old,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=mask,
        loss_agg_mode=agg,
        config=config,
        rollout_is_weights=None,
        **kwargs,
    )


def sorl(opts):
    def loss_fn(**kwargs):
        return sorl_policy_loss(**kwargs, loss_name="st_ppo", options=opts)

    return loss_fn


# ----------------------------------------------------------------------------- slow reference


def reference_turns(mask_row):
    turns, current = [], []
    for position, on in enumerate(mask_row):
        if on:
            current.append(position)
        elif current:
            turns.append(current)
            current = []
    if current:
        turns.append(current)
    return turns


def reference_scale(clipped_sq, kept_sq, tokens, opts):
    """The correction's rule in plain Python (sorl_verl/algos/correction.py's docstring)."""
    if opts.normalization == "none" or clipped_sq == 0:
        return 1.0
    c_tok = math.sqrt(clipped_sq / max(tokens, 1))
    if opts.normalization == "relative":
        return min(1.0, opts.tau * math.sqrt(kept_sq / max(tokens, 1)) / c_tok)
    return min(1.0, opts.kappa / c_tok)


def reference_loss(old, new, advantages, mask, agg, opts, global_batch_info=None):
    """Per row, per turn, per token in Python, with verl's own agg_loss giving the token weights.

    Returns ``(loss, gradient factor, row scales)``: the loss the SORL loss returns (row scales
    applied for the sequence scope) and the factor the batch scope applies to its gradient.
    """
    global_batch_info = global_batch_info or {}
    rows, length = mask.shape
    # c_t = d agg_loss / d loss_mat_t: verl's own aggregation, read off by autograd.
    probe = torch.zeros(rows, length, dtype=torch.float64, requires_grad=True)
    agg_loss(loss_mat=probe, loss_mask=mask, loss_agg_mode=agg, **global_batch_info).backward()
    token_weight = probe.grad
    # omega_t: the token's weight relative to token-mean (1 for token-mean).
    batch_tokens = global_batch_info.get("batch_num_tokens") or int(mask.sum())
    omega = token_weight * batch_tokens / global_batch_info.get("dp_size", 1)

    lo, hi, c = 1 - opts.clip_ratio_low, 1 + opts.clip_ratio_high, opts.clip_ratio_c
    row_losses, row_sums = [], []
    for row in range(rows):
        turns = reference_turns(mask[row].tolist())
        tokens = [t for turn in turns for t in turn]
        row_loss = new.new_zeros(())
        clipped_sq, kept_sq = 0.0, 0.0
        for turn in turns:
            for t in turn:
                if opts.ratio_level == "token":
                    members = [t]
                elif opts.ratio_level == "turn":
                    members = turn
                else:
                    members = tokens
                log_w = sum(new[row, u] - old[row, u] for u in members) / len(members)
                w = torch.exp(torch.clamp(log_w, -20, 20))
                a = advantages[row, t]
                surrogate = torch.maximum(-a * w, -a * torch.clamp(w, lo, hi))
                if a < 0:
                    surrogate = torch.minimum(surrogate, -a * c)
                row_loss = row_loss + token_weight[row, t] * surrogate
                wv = float(w.detach())
                is_clipped = (a > 0 and wv > hi) or (a < 0 and wv < lo) or (a < 0 and wv > c)
                term = (wv * float(a) * float(omega[row, t])) ** 2
                if is_clipped:
                    clipped_sq += term
                else:
                    kept_sq += term
        row_losses.append(row_loss)
        row_sums.append((clipped_sq, kept_sq, len(tokens)))
    if opts.norm_scope == "batch":
        totals = [sum(column) for column in zip(*row_sums, strict=True)]
        return sum(row_losses), reference_scale(*totals, opts), []
    row_scales = [reference_scale(*sums, opts) for sums in row_sums]
    total = sum(scale * row_loss for scale, row_loss in zip(row_scales, row_losses, strict=True))
    return total, 1.0, row_scales


def reference_run(old, new, advantages, mask, agg, opts, global_batch_info=None):
    """``(loss, gradient the optimizer uses, row scales or [batch scale])``."""
    log_prob = new.clone().requires_grad_(True)
    loss, factor, scales = reference_loss(old, log_prob, advantages, mask, agg, opts, global_batch_info)
    loss.backward()
    return loss.detach(), log_prob.grad * factor, scales or [factor]


# ----------------------------------------------------------------------------- tests


@pytest.mark.parametrize("agg", AGG_MODES)
def test_aggregation_weights_reproduce_verl_agg_loss(agg):
    old, new, advantages, mask = random_batch(rows=6, length=9, seed=3)
    mask[2] = False  # an all-masked row
    loss_mat = torch.randn(6, 9, dtype=torch.float64)
    for info in ({}, {"dp_size": 2, "batch_num_tokens": 40, "global_batch_size": 9, "loss_scale_factor": 16}):
        weights = aggregation_weights(mask, agg, **info).double()
        ours = (loss_mat * mask * weights[:, None]).sum()
        assert torch.isclose(ours, agg_loss(loss_mat, mask, agg, **info), rtol=1e-6), info


@pytest.mark.parametrize("ratio_level", ["token", "turn", "sequence"])
@pytest.mark.parametrize("normalization", ["relative", "absolute", "none"])
@pytest.mark.parametrize("scope", ["batch", "sequence"])
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_matches_slow_reference_value_and_gradient(ratio_level, normalization, scope, agg):
    opts = options(ratio_level, normalization, scope, kappa=0.3, tau=0.5)
    for seed in range(3):
        old, new, advantages, mask = random_batch(rows=4, length=11, spread=0.5, seed=seed)
        loss, grad, metrics = run(sorl(opts), old, new, advantages, mask, agg)
        ref_loss, ref_grad, scales = reference_run(old, new, advantages, mask, agg, opts)
        assert torch.isclose(loss.double(), ref_loss, rtol=1e-5, atol=1e-7)
        assert torch.allclose(grad, ref_grad, rtol=1e-5, atol=1e-7)
        if scope == "sequence":
            scales = [s for s, row in zip(scales, mask, strict=True) if row.any()]
        if normalization != "none" or scope == "batch":
            assert metrics["actor/sorl/norm_scale"] == pytest.approx(sum(scales) / len(scales))
            assert metrics["actor/sorl/norm_scale_min"] == pytest.approx(min(scales))


@pytest.mark.parametrize("scope", ["batch", "sequence"])
def test_reference_comparison_sees_clipping_and_scaling(scope):
    """The reference tests above are only meaningful if clipping and s < 1 do happen there."""
    for normalization in ("relative", "absolute"):
        opts = options("turn", normalization, scope, kappa=0.3, tau=0.5)
        for seed in range(3):
            old, new, advantages, mask = random_batch(rows=4, length=11, spread=0.5, seed=seed)
            _, _, scales = reference_run(old, new, advantages, mask, "token-mean", opts)
            _, _, metrics = run(sorl(opts), old, new, advantages, mask)
            assert metrics["actor/sorl/clipfrac_turn"] > 0
            assert min(scales) < 1.0, (normalization, seed)


def test_lemma_4_1_gradient_form_in_unclipped_region():
    """Unclipped: the gradient on every token of turn k is c * (-w_k * mean_{t in k} A_t)."""
    old, new, advantages, mask = random_batch(rows=3, length=14, spread=0.02, seed=5)
    loss, grad, metrics = run(
        get_policy_loss_fn("turn_ppo"), old, new, advantages, mask, config=actor_config("turn_ppo")
    )
    assert metrics["actor/sorl/clipfrac_turn"] == 0.0
    c = 1.0 / mask.sum()
    for row in range(mask.shape[0]):
        for turn in reference_turns(mask[row].tolist()):
            w_k = torch.exp((new[row, turn] - old[row, turn]).mean())
            expected = -c * w_k * advantages[row, turn].mean()
            assert torch.allclose(grad[row, turn], expected.expand(len(turn)), rtol=1e-9)
    assert torch.all(grad[~mask] == 0)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_one_turn_per_sequence_equals_verl_gspo(agg):
    """Turn ratio over a single turn is GSPO's sequence ratio; with per-sequence advantages
    (GRPO) the gradients agree too (GSPO's stop-gradient form and our mean have the same
    gradient when A is constant over the sequence)."""
    from verl.workers.config import ActorConfig

    generator = torch.Generator().manual_seed(11)
    rows, length = 6, 10
    lengths = torch.randint(1, length + 1, (rows,), generator=generator)
    mask = torch.arange(length)[None, :] < lengths[:, None]  # one turn per row
    old = -torch.rand(rows, length, generator=generator, dtype=torch.float64)
    new = old + 0.4 * torch.randn(rows, length, generator=generator, dtype=torch.float64)
    advantages = torch.randn(rows, 1, generator=generator, dtype=torch.float64).expand(rows, length).contiguous()
    gspo_config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1)
    gspo_loss, gspo_grad, _ = run(get_policy_loss_fn("gspo"), old, new, advantages, mask, agg, config=gspo_config)
    for loss_mode in ("turn_ppo", "st_ppo"):
        config = actor_config(loss_mode, normalization="none", clip_ratio_c=1e9)  # GSPO has no dual clip
        loss, grad, metrics = run(get_policy_loss_fn(loss_mode), old, new, advantages, mask, agg, config=config)
        assert metrics["actor/pg_clipfrac"] > 0  # clipping is exercised
        assert torch.isclose(loss.double(), gspo_loss, rtol=1e-9)
        assert torch.allclose(grad, gspo_grad, rtol=1e-9, atol=1e-12)
    # The sequence ratio equals GSPO's ratio for any number of turns.
    multi_turn_mask = mask.clone()
    multi_turn_mask[:, 1] = False
    gspo_loss, _, _ = run(get_policy_loss_fn("gspo"), old, new, advantages, multi_turn_mask, agg, config=gspo_config)
    seq_opts = options("sequence", "none", clip_ratio_c=1e9)
    loss, _, _ = run(sorl(seq_opts), old, new, advantages, multi_turn_mask, agg)
    assert torch.isclose(loss.double(), gspo_loss, rtol=1e-9)


@pytest.mark.parametrize("agg", AGG_MODES)
def test_one_token_turns_equal_verl_vanilla(agg):
    old, new, advantages, _ = random_batch(rows=5, length=12, spread=0.8, seed=2)
    mask = torch.zeros(5, 12, dtype=torch.bool)
    mask[:, ::2] = True  # every turn is a single token
    mask[1] = False
    config = actor_config("turn_ppo")
    vanilla_loss, vanilla_grad, vanilla_metrics = run(
        get_policy_loss_fn("vanilla"), old, new, advantages, mask, agg, config=config
    )
    loss, grad, metrics = run(get_policy_loss_fn("turn_ppo"), old, new, advantages, mask, agg, config=config)
    assert vanilla_metrics["actor/pg_clipfrac_lower"] > 0  # the dual clip is exercised
    assert torch.isclose(loss.double(), vanilla_loss, rtol=1e-9)
    assert torch.allclose(grad, vanilla_grad, rtol=1e-9, atol=1e-12)
    for key in ("actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl"):
        assert metrics[key] == pytest.approx(vanilla_metrics[key])


def test_token_level_without_normalization_equals_vanilla_on_multi_turn_masks():
    old, new, advantages, mask = random_batch(rows=5, length=12, spread=0.8, seed=4)
    vanilla = run(get_policy_loss_fn("vanilla"), old, new, advantages, mask, config=actor_config())
    ours = run(
        get_policy_loss_fn("s_ppo"), old, new, advantages, mask, config=actor_config("s_ppo", normalization="none")
    )
    assert torch.isclose(ours[0].double(), vanilla[0], rtol=1e-9)
    assert torch.allclose(ours[1], vanilla[1], rtol=1e-9, atol=1e-12)


def test_normalization_none_equals_turn_ppo():
    old, new, advantages, mask = random_batch(spread=0.8, seed=6)
    turn_ppo = run(get_policy_loss_fn("turn_ppo"), old, new, advantages, mask, config=actor_config("turn_ppo"))
    for loss_mode in ("st_ppo", "so_ppo"):
        config = actor_config(loss_mode, normalization="none")
        ours = run(get_policy_loss_fn(loss_mode), old, new, advantages, mask, config=config)
        assert torch.equal(ours[0], turn_ppo[0])
        assert torch.equal(ours[1], turn_ppo[1])
    # ... and the defaults (batch scope) scale the same gradient down on the same clipped batch.
    st_ppo = run(get_policy_loss_fn("st_ppo"), old, new, advantages, mask, config=actor_config("st_ppo"))
    scale = st_ppo[2]["actor/sorl/norm_scale"]
    assert scale < 1.0 and st_ppo[2]["actor/sorl/scaled_step_frac"] == 1.0
    assert torch.equal(st_ppo[0], turn_ppo[0])  # the loss value is before the batch scale
    assert torch.allclose(st_ppo[1], scale * turn_ppo[1], rtol=1e-12)


@pytest.mark.parametrize("normalization", ["relative", "absolute"])
@pytest.mark.parametrize("ratio_level", ["token", "turn", "sequence"])
@pytest.mark.parametrize("scope", ["batch", "sequence"])
def test_nothing_clipped_means_no_change(normalization, ratio_level, scope):
    old, new, advantages, mask = random_batch(spread=0.01, seed=8)
    plain = run(sorl(options(ratio_level, "none", scope)), old, new, advantages, mask)
    normalized = run(sorl(options(ratio_level, normalization, scope, kappa=1e-6, tau=1e-6)), old, new, advantages, mask)
    assert normalized[2]["actor/sorl/clipfrac_turn"] == 0.0
    assert normalized[2]["actor/sorl/norm_scale"] == 1.0 == normalized[2]["actor/sorl/norm_scale_min"]
    assert normalized[2]["actor/sorl/c_tok"] == 0.0 and normalized[2]["actor/sorl/scaled_step_frac"] == 0.0
    assert torch.equal(normalized[0], plain[0])
    assert torch.equal(normalized[1], plain[1])


def test_scale_modes_on_a_hand_made_row():
    """One row, two turns: turn 0 clipped (w = e^0.5 > 1.2, A = 1), turn 1 kept (w = 1, A = 0.1)."""
    mask = torch.tensor([[1, 1, 0, 1, 1]], dtype=torch.bool)
    old = torch.zeros(1, 5, dtype=torch.float64)
    new = torch.tensor([[0.5, 0.5, 0.0, 0.0, 0.0]], dtype=torch.float64)
    advantages = torch.tensor([[1.0, 1.0, 0.0, 0.1, 0.1]], dtype=torch.float64)
    c_tok = math.sqrt(2 * math.exp(1.0) / 4)  # per-token RMS over the row's 4 tokens
    g_tok = math.sqrt(2 * 0.1**2 / 4)
    expected = {"relative": 0.1 * g_tok / c_tok, "absolute": 0.5 / c_tok, "none": 1.0}
    for scope in ("batch", "sequence"):
        for mode, scale in expected.items():
            _, _, metrics = run(sorl(options("turn", mode, scope, kappa=0.5, tau=0.1)), old, new, advantages, mask)
            assert metrics["actor/sorl/c_tok"] == pytest.approx(c_tok)
            assert metrics["actor/sorl/g_tok"] == pytest.approx(g_tok)
            assert metrics["actor/sorl/norm_scale"] == pytest.approx(scale), (scope, mode)
    assert all(0 < scale <= 1 for scale in expected.values())  # never enlarges a step


def test_old_equals_new_gives_ratio_one_and_no_clipping():
    old, _, advantages, mask = random_batch(seed=9)
    for loss_mode in SORL_LOSSES:
        loss, grad, metrics = run(
            get_policy_loss_fn(loss_mode), old, old, advantages, mask, config=actor_config(loss_mode)
        )
        assert metrics["actor/sorl/turn_ratio_min"] == 1.0 == metrics["actor/sorl/turn_ratio_max"]
        assert metrics["actor/pg_clipfrac"] == 0.0 and metrics["actor/sorl/clipfrac_turn"] == 0.0
        assert metrics["actor/sorl/norm_scale"] == 1.0
        assert torch.isclose(loss.double(), -(advantages * mask).sum() / mask.sum())


def test_all_masked_rows_and_empty_batch_stay_finite():
    old, new, advantages, mask = random_batch(seed=10)
    mask[1] = False
    mask[3] = False
    for loss_mode in SORL_LOSSES:
        loss, grad, metrics = run(
            get_policy_loss_fn(loss_mode), old, new, advantages, mask, config=actor_config(loss_mode)
        )
        assert torch.isfinite(loss) and torch.isfinite(grad).all()
        assert torch.all(grad[1] == 0) and torch.all(grad[3] == 0)
        assert all(math.isfinite(value) for value in metrics.values())
    empty = torch.zeros_like(mask)
    for agg in AGG_MODES:
        loss, grad, metrics = run(get_policy_loss_fn("st_ppo"), old, new, advantages, empty, agg, config=actor_config())
        assert loss.item() == 0.0 and torch.all(grad == 0)
        assert all(math.isfinite(value) for value in metrics.values())


def test_extreme_log_ratios_stay_finite():
    old, _, advantages, mask = random_batch(rows=6, length=16, seed=12)
    signs = torch.where(torch.rand(6, 16) < 0.5, -1.0, 1.0).double()
    new = old + 50.0 * signs
    for loss_mode in SORL_LOSSES:
        for normalization in ("relative", "absolute", "none"):
            config = actor_config(loss_mode, normalization=normalization)
            loss, grad, metrics = run(get_policy_loss_fn(loss_mode), old, new, advantages, mask, config=config)
            assert torch.isfinite(loss) and torch.isfinite(grad).all(), (loss_mode, normalization)
            assert all(math.isfinite(value) for value in metrics.values())


def test_bf16_inputs_are_finite_and_close_to_float32():
    old, new, advantages, mask = random_batch(rows=6, length=32, spread=0.3, seed=13, dtype=torch.float32)
    for loss_mode in SORL_LOSSES:
        config = actor_config(loss_mode)
        ref_loss, ref_grad, _ = run(get_policy_loss_fn(loss_mode), old, new, advantages, mask, config=config)
        loss, grad, _ = run(
            get_policy_loss_fn(loss_mode), old.bfloat16(), new.bfloat16(), advantages.bfloat16(), mask, config=config
        )
        assert loss.dtype == torch.float32 and grad.dtype == torch.bfloat16
        assert torch.isfinite(loss) and torch.isfinite(grad.float()).all()
        # bf16 has ~3 significant digits; the inputs themselves are rounded.
        assert torch.isclose(loss, ref_loss, rtol=0.05, atol=0.02)
        assert torch.allclose(grad.float(), ref_grad, rtol=0.1, atol=0.1 * ref_grad.abs().max().item())


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("loss_mode", SORL_LOSSES)
def test_micro_batch_split_invariance_with_global_batch_info(agg, loss_mode):
    """As verl's actor does: global_batch_info holds the mini-batch's token and sequence counts,
    each micro-batch's loss is backpropagated, and the gradients add up."""
    old, new, advantages, mask = random_batch(rows=8, length=12, spread=0.6, seed=14)
    mask[5] = False
    info = {"dp_size": 1, "batch_num_tokens": int(mask.sum()), "global_batch_size": 8, "loss_scale_factor": None}
    for scope in ("batch", "sequence"):
        config = actor_config(loss_mode, global_batch_info=info, norm_scope=scope)
        loss_fn = get_policy_loss_fn(loss_mode)
        full_loss, full_grad, metrics = run(loss_fn, old, new, advantages, mask, agg, config=config)
        assert metrics["actor/pg_clipfrac"] > 0
        if loss_mode != "turn_ppo" and scope == "batch":
            assert metrics["actor/sorl/norm_scale"] < 1.0  # the batch scale is exercised
        for split in ([3, 5], [1, 2, 2, 3], [8]):
            log_prob = new.clone().requires_grad_(True)
            optimizer = torch.optim.SGD([log_prob], lr=0.0)
            total = 0.0
            with batch_correction(optimizer) as corr:
                for part_old, part_new, part_adv, part_mask in zip(
                    old.split(split), log_prob.split(split), advantages.split(split), mask.split(split), strict=True
                ):
                    loss, _ = _call(loss_fn, part_old, part_new, part_adv, part_mask, agg, config)
                    loss.backward()
                    total += loss.detach()
                optimizer.step()
            assert torch.isclose(torch.as_tensor(total).double(), full_loss.double(), rtol=1e-6), split
            assert torch.allclose(log_prob.grad, full_grad, rtol=1e-6, atol=1e-12), split
            for key in ("c_tok", "g_tok", "norm_scale_min", "scaled_row_frac"):
                assert corr.metrics()[f"actor/sorl/{key}"].aggregate() == pytest.approx(metrics[f"actor/sorl/{key}"])


def test_metrics_have_the_documented_names_and_ranges():
    old, new, advantages, mask = random_batch(rows=6, length=40, spread=0.6, seed=15, mask_density=0.8)
    _, _, metrics = run(get_policy_loss_fn("st_ppo"), old, new, advantages, mask, config=actor_config())
    expected = {
        "clipfrac_token_upper",
        "clipfrac_token_lower",
        "clipfrac_token_dual",
        "clipfrac_turn_upper",
        "clipfrac_turn_lower",
        "clipfrac_turn",
        "c_tok",
        "g_tok",
        "norm_scale",
        "norm_scale_min",
        "scaled_step_frac",
        "scaled_row_frac",
        "turn_ratio_mean",
        "turn_ratio_min",
        "turn_ratio_max",
        "turns_per_seq",
    } | {f"clipfrac_turn_idx_{k}" for k in range(1, 9)}
    assert {key.removeprefix("actor/sorl/") for key in metrics if key.startswith("actor/sorl/")} == expected
    assert {"actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl"} <= set(metrics)
    for key, value in metrics.items():
        if "clipfrac" in key:
            assert 0.0 <= value <= 1.0, key
    assert (
        metrics["actor/sorl/turn_ratio_min"]
        <= metrics["actor/sorl/turn_ratio_mean"]
        <= metrics["actor/sorl/turn_ratio_max"]
    )
    turns = [len(reference_turns(row)) for row in mask.tolist()]
    assert metrics["actor/sorl/turns_per_seq"] == pytest.approx(sum(turns) / sum(t > 0 for t in turns))
    # Per-turn-index clip fractions against a direct count.
    ratio_first_turn = []
    log_ratio = new - old
    for row in range(6):
        turn = reference_turns(mask[row].tolist())[0]
        w = math.exp(float(log_ratio[row, turn].mean()))
        for t in turn:
            a = float(advantages[row, t])
            ratio_first_turn.append((a > 0 and w > 1.2) or (a < 0 and (w < 0.8 or w > 3.0)))
    assert metrics["actor/sorl/clipfrac_turn_idx_1"] == pytest.approx(sum(ratio_first_turn) / len(ratio_first_turn))


def test_options_resolution_defaults_and_errors():
    from verl.workers.config import ActorConfig, PolicyLossConfig

    for name, defaults in LOSS_DEFAULTS.items():
        plain = ActorConfig(
            strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, policy_loss=PolicyLossConfig(loss_mode=name)
        )
        opts = resolve_options(name, plain)
        assert (opts.ratio_level, opts.normalization) == (defaults["ratio_level"], defaults["normalization"])
        assert (opts.clip_ratio_low, opts.clip_ratio_high, opts.clip_ratio_c) == (0.2, 0.2, 3.0)
    custom = SorlPolicyLossConfig(loss_mode="so_ppo", ratio_level="sequence", normalization="absolute", kappa=0.5)
    opts = resolve_options(
        "so_ppo", ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, policy_loss=custom)
    )
    assert (opts.ratio_level, opts.normalization, opts.kappa) == ("sequence", "absolute", 0.5)
    assert (opts.norm_scope, opts.tau) == ("batch", 0.1)  # the defaults
    with pytest.raises(ValueError, match="policy_loss.normalization"):
        SorlPolicyLossConfig(loss_mode="st_ppo", normalization="bogus")
    with pytest.raises(ValueError, match="normalization='literal' was removed: .*absolute"):
        SorlPolicyLossConfig(loss_mode="st_ppo", normalization="literal")
    with pytest.raises(ValueError, match="norm_scope='micro_batch' was removed"):
        resolve_options("st_ppo", actor_config(norm_scope="micro_batch"))
    for bad in (0.0, -1.0, float("nan"), float("inf"), "0.1"):
        with pytest.raises(ValueError, match="tau must be a finite number > 0"):
            SorlPolicyLossConfig(loss_mode="st_ppo", tau=bad)
    with pytest.raises(ValueError, match="policy_loss.ratio_level"):
        resolve_options("st_ppo", actor_config(ratio_level="word"))
    with pytest.raises(ValueError, match="kappa"):
        SorlPolicyLossConfig(loss_mode="st_ppo", kappa=0.0)
    with pytest.raises(ValueError, match="needs the actor config"):
        resolve_options("st_ppo", None)


def test_rollout_correction_weights_apply_as_in_vanilla():
    old, new, advantages, mask = random_batch(spread=0.8, seed=16)
    weights = torch.rand(mask.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 2

    def with_weights(loss_mode, config):
        log_prob = new.clone().requires_grad_(True)
        loss, metrics = get_policy_loss_fn(loss_mode)(
            old_log_prob=old,
            log_prob=log_prob,
            advantages=advantages,
            response_mask=mask,
            loss_agg_mode="token-mean",
            config=config,
            rollout_is_weights=weights,
        )
        loss.backward()
        return loss.detach(), log_prob.grad, metrics

    vanilla = with_weights("vanilla", actor_config())
    ours = with_weights("s_ppo", actor_config("s_ppo", normalization="none"))
    assert torch.isclose(ours[0].double(), vanilla[0], rtol=1e-9)
    assert torch.allclose(ours[1], vanilla[1], rtol=1e-9, atol=1e-12)

    # The weights also enter the norms: doubling every weight doubles both norms.
    def norms():
        with batch_correction() as corr:
            with_weights("st_ppo", actor_config())
        return corr.finalize()

    base = norms()
    assert base["c_tok"] > 0 and base["g_tok"] > 0
    weights = weights * 2
    doubled = norms()
    assert doubled["c_tok"] == pytest.approx(2 * base["c_tok"])
    assert doubled["g_tok"] == pytest.approx(2 * base["g_tok"])
