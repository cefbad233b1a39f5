"""Actor update time with the clipping-bias correction vs verl's ``vanilla`` loss, and the
exact (parameter-space) mode's cost and agreement with the token-space rule, on CPU.

    python benchmarks/bench_update.py [--repeats 9] [--threads 1]

One actor update as verl's engine runs it: zero grads, forward + loss + backward over
``--micro-batches`` micro-batches, gradient clipping, AdamW step, all inside a
:class:`~sorl_verl.algos.correction.BatchCorrection` (what the engine hook opens). Model: a
randomly initialised Qwen2 (``--hidden``, ``--layers``, vocabulary 4096), 16 trajectories of
64 prompt + 512 response tokens with 4 model turns each (observation spans between them), old
log-probs = current ones + N(0, 0.3) noise so that some tokens are clipped. Methods, timed back
to back on the same batch (order rotated per repeat; ratios are medians of per-repeat ratios):

* ``vanilla``: verl's PPO loss;
* ``st_ppo batch``: turn ratio + batch-level correction (the default);
* ``st_ppo sequence``: turn ratio + per-trajectory correction;
* ``st_ppo exact``: the batch scope plus the exact mode's parameter-space norms (two more
  backward passes per micro-batch).

Target: ``st_ppo batch`` / ``vanilla`` <= 1.05. On a real model the
loss is a far smaller share of an update than here, so the CPU ratio is an upper bound.

Then the agreement table: for several noise levels, one micro-batch, the token-space ratio
``C_tok / G_tok`` and the exact ``||grad removed|| / ||grad kept||``, and the scale each gives
with ``tau = 0.1``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from omegaconf import OmegaConf
from transformers import Qwen2Config, Qwen2ForCausalLM
from verl.trainer.ppo.core_algos import get_policy_loss_fn

import sorl_verl.algos  # noqa: F401  (registers the losses even without the entry point)
from sorl_verl.algos.config import resolve_options
from sorl_verl.algos.correction import batch_correction, correction_scale, exact_norms
from sorl_verl.algos.losses import clip_surrogates

TARGET = 1.05
ROWS, PROMPT, RESPONSE, TURNS, VOCAB = 16, 64, 512, 4, 4096


def make_model(hidden: int, layers: int) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=hidden * 3,
        num_hidden_layers=layers,
        num_attention_heads=max(hidden // 64, 1),
        num_key_value_heads=max(hidden // 64, 1),
        max_position_embeddings=PROMPT + RESPONSE,
        tie_word_embeddings=True,
    )
    config._attn_implementation = "eager"
    return Qwen2ForCausalLM(config)


def response_log_probs(model, input_ids: torch.Tensor) -> torch.Tensor:
    """``(rows, RESPONSE)`` log-probs of the response tokens under ``model``."""
    logits = model(input_ids=input_ids).logits[:, PROMPT - 1 : -1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, PROMPT:, None]).squeeze(-1)


def make_batch(model, noise: float, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, VOCAB, (ROWS, PROMPT + RESPONSE), generator=gen)
    span = RESPONSE // TURNS
    mask = (torch.arange(RESPONSE) % span) < span * 3 // 4  # each span: a model turn, then an observation
    mask = mask.expand(ROWS, RESPONSE).clone()
    with torch.no_grad():
        current = response_log_probs(model, input_ids)
    turn_noise = torch.randn(ROWS, TURNS, generator=gen).repeat_interleave(span, dim=1)
    old = current + noise * (turn_noise + torch.randn(ROWS, RESPONSE, generator=gen))
    reward = (torch.rand(ROWS, generator=gen) < 0.5).float().view(-1, 8)
    adv = ((reward - reward.mean(1, keepdim=True)) / (reward.std(1, keepdim=True) + 1e-6)).view(-1, 1)
    return input_ids, old, adv.expand(ROWS, RESPONSE).contiguous(), mask


def actor_config(loss_mode: str, scope: str, tokens: int):
    return OmegaConf.create(
        {
            "clip_ratio": 0.2,
            "clip_ratio_low": 0.2,
            "clip_ratio_high": 0.2,
            "clip_ratio_c": 3.0,
            "policy_loss": {"loss_mode": loss_mode, "norm_scope": scope},
            "global_batch_info": {"dp_size": 1, "batch_num_tokens": tokens, "global_batch_size": ROWS},
        }
    )


def actor_update(model, optimizer, batch, method: str, micro_batches: int) -> float:
    input_ids, old, adv, mask = batch
    loss_mode, scope = ("vanilla", "batch") if method == "vanilla" else ("st_ppo", method.split()[1])
    scope = "batch" if scope == "exact" else scope
    config = actor_config(loss_mode, scope, int(mask.sum()))
    loss_fn = get_policy_loss_fn(loss_mode)
    start = time.perf_counter()
    optimizer.zero_grad()
    with batch_correction(optimizer):
        for part in torch.arange(ROWS).chunk(micro_batches):
            log_prob = response_log_probs(model, input_ids[part])
            loss, _ = loss_fn(old[part], log_prob, adv[part], mask[part], "token-mean", config, None)
            if method.endswith("exact"):
                opts = resolve_options("st_ppo", config)
                removed, kept = clip_surrogates(
                    old[part], log_prob, adv[part], mask[part], "token-mean", opts, config.global_batch_info
                )
                exact_norms(removed, kept, model.parameters())
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    return time.perf_counter() - start


def agreement(model, noise_levels) -> list[tuple]:
    rows = []
    for noise in noise_levels:
        input_ids, old, adv, mask = make_batch(model, noise, seed=1)
        config = actor_config("st_ppo", "batch", int(mask.sum()))
        opts = resolve_options("st_ppo", config)
        with batch_correction() as corr:
            log_prob = response_log_probs(model, input_ids)
            loss, metrics = get_policy_loss_fn("st_ppo")(old, log_prob, adv, mask, "token-mean", config, None)
            removed, kept = clip_surrogates(old, log_prob, adv, mask, "token-mean", opts, config.global_batch_info)
            c_exact, g_exact = exact_norms(removed, kept, model.parameters())
        result = corr.finalize()
        one = torch.tensor(1.0, dtype=torch.float64)
        exact_scale = correction_scale(c_exact.square() * one, g_exact.square() * one, one, "relative", 0.1, 0.1)
        frac = metrics["actor/pg_clipfrac"] + metrics["actor/sorl/clipfrac_token_dual"]
        token_ratio = result["c_tok"] / max(result["g_tok"], 1e-30)
        exact_ratio = float(c_exact / g_exact.clamp(min=1e-30))
        rows.append((noise, frac, token_ratio, exact_ratio, result["norm_scale"], float(exact_scale)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model = make_model(args.hidden, args.layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0)  # lr 0: every repeat sees the same model
    batch = make_batch(model, noise=0.3)
    methods = ["vanilla", "st_ppo batch", "st_ppo sequence", "st_ppo exact"]
    for method in methods:  # warm-up
        actor_update(model, optimizer, batch, method, args.micro_batches)
    times = {m: [] for m in methods}
    for repeat in range(args.repeats):
        order = methods[repeat % len(methods) :] + methods[: repeat % len(methods)]
        measured = {m: actor_update(model, optimizer, batch, m, args.micro_batches) for m in order}
        for m in methods:
            times[m].append(measured[m])
    n_params = sum(p.numel() for p in model.parameters())
    print(
        f"actor update: Qwen2 {n_params / 1e6:.1f}M parameters, {ROWS} x ({PROMPT}+{RESPONSE}) tokens, "
        f"{args.micro_batches} micro-batches, torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{args.repeats} repeats"
    )
    print(f"{'method':<18}{'median s':>10}{'ratio vs vanilla':>18}")
    ratio_batch = None
    for m in methods:
        ratio = statistics.median(t / v for t, v in zip(times[m], times["vanilla"], strict=True))
        ratio_batch = ratio if m == "st_ppo batch" else ratio_batch
        print(f"{m:<18}{statistics.median(times[m]):>10.3f}{ratio:>18.3f}")
    print(f"target: st_ppo batch / vanilla <= {TARGET} -> {'met' if ratio_batch <= TARGET else 'MISSED'}")

    print("\nagreement, one micro-batch of 16 trajectories (tau = 0.1):")
    print(f"{'noise':>6}{'clipped':>9}{'C_tok/G_tok':>13}{'exact C/G':>11}{'s token':>9}{'s exact':>9}")
    for noise, frac, token_ratio, exact_ratio, s_token, s_exact in agreement(model, (0.02, 0.05, 0.1, 0.2, 0.4)):
        print(f"{noise:>6.2f}{frac:>9.1%}{token_ratio:>13.3f}{exact_ratio:>11.3f}{s_token:>9.3f}{s_exact:>9.3f}")


if __name__ == "__main__":
    main()
