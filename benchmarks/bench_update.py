"""Actor update time with the clipping-bias correction vs verl's ``vanilla`` loss, and the
exact (parameter-space) mode's cost and agreement with the token-space rule.

    python benchmarks/bench_update.py [--repeats 9] [--threads 1]       # CPU, float32, toy model
    python benchmarks/bench_update.py --device cuda --dtype bfloat16 --attn sdpa \\
        --model qwen2-1.5b --layers 8 --rows 16 --prompt-len 256 --response-len 4096 --turns 8 \\
        --agreement-rows 4

One actor update as verl's engine runs it: zero grads, forward + loss + backward over
``--micro-batches`` micro-batches, gradient clipping, AdamW step, all inside a
:class:`~sorl_verl.algos.correction.BatchCorrection` (what the engine hook opens). Model: a
randomly initialised Qwen2, by default a toy one (``--hidden``, ``--layers``, vocabulary 4096),
or the shape of a released Qwen2 (``--model``; ``--layers`` still sets the depth). Batch: by
default 16 trajectories of 64 prompt + 512 response tokens with 4 model turns each (observation
spans between them), old log-probs = current ones + N(0, 0.3) noise so that some tokens are
clipped. ``--dtype bfloat16`` runs forward and backward under autocast with float32 parameters
and optimizer state, as verl's FSDP mixed precision does; log-probs are taken in float32.
Methods, timed back to back on the same batch (order rotated per repeat; ratios are medians of
per-repeat ratios):

* ``vanilla``: verl's PPO loss;
* ``st_ppo batch``: turn ratio + batch-level correction (the default);
* ``st_ppo sequence``: turn ratio + per-trajectory correction;
* ``st_ppo exact``: the batch scope plus the exact mode's parameter-space norms (two more
  backward passes per micro-batch).

Target: ``st_ppo batch`` / ``vanilla`` <= 1.05. On a real model the loss is a far smaller share
of an update than in the toy one, so the toy CPU ratio is an upper bound. On CUDA the peak
memory of one update of each method is printed too (``torch.cuda.max_memory_allocated`` above
what was allocated before it: model, optimizer state, batch and the previous update's gradients,
which the update's ``zero_grad`` frees).

Then the agreement table: for several noise levels, one micro-batch (``--agreement-rows``, all
rows by default), the token-space ratio ``C_tok / G_tok`` and the exact
``||grad removed|| / ||grad kept||``, and the scale each gives with ``tau = 0.1``.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from dataclasses import dataclass

import torch
from omegaconf import OmegaConf
from torch_device import add_device_args, cuda_peak_extra, describe, setup, timed
from transformers import Qwen2Config, Qwen2ForCausalLM
from verl.trainer.ppo.core_algos import get_policy_loss_fn

import sorl_verl.algos  # noqa: F401  (registers the losses even without the entry point)
from sorl_verl.algos.config import resolve_options
from sorl_verl.algos.correction import batch_correction, correction_scale, exact_norms
from sorl_verl.algos.losses import clip_surrogates

TARGET = 1.05
GROUP = 8  # trajectories per prompt group (GRPO-style advantages); fewer rows form one group
TOY_VOCAB = 4096
# Shapes of the released checkpoints' config.json (depth excepted: --layers); biases on q/k/v,
# tied embeddings, as in Qwen2.
MODELS = {
    "qwen2-0.5b": {"hidden_size": 896, "intermediate_size": 4864, "heads": 14, "kv_heads": 2, "vocab": 151936},
    "qwen2-1.5b": {"hidden_size": 1536, "intermediate_size": 8960, "heads": 12, "kv_heads": 2, "vocab": 151936},
}


@dataclass(frozen=True)
class Shape:
    rows: int
    prompt: int
    response: int
    turns: int


def make_model(
    hidden: int,
    layers: int,
    max_positions: int,
    model: str = "toy",
    attn: str = "eager",
    device: torch.device | str = "cpu",
) -> Qwen2ForCausalLM:
    """A randomly initialised Qwen2, float32, built on ``device``; ``hidden`` is used by ``toy`` only."""
    torch.manual_seed(0)
    if model == "toy":
        heads = max(hidden // 64, 1)
        dims = {"hidden_size": hidden, "intermediate_size": hidden * 3, "heads": heads, "kv_heads": heads}
        dims["vocab"] = TOY_VOCAB
    else:
        dims = MODELS[model]
    config = Qwen2Config(
        vocab_size=dims["vocab"],
        hidden_size=dims["hidden_size"],
        intermediate_size=dims["intermediate_size"],
        num_hidden_layers=layers,
        num_attention_heads=dims["heads"],
        num_key_value_heads=dims["kv_heads"],
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
    )
    config._attn_implementation = attn
    with torch.device(device):
        return Qwen2ForCausalLM(config)


def response_log_probs(model, input_ids: torch.Tensor, response: int) -> torch.Tensor:
    """``(rows, response)`` log-probs of the last ``response`` tokens of ``input_ids`` under ``model``."""
    logits = model(input_ids=input_ids).logits[:, -response - 1 : -1].float()
    return torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, -response:, None]).squeeze(-1)


def make_batch(model, noise: float, shape: Shape, autocast, seed: int = 0):
    """``(input_ids, old, adv, mask)`` on the model's device: ids ``(rows, prompt + response)``, the rest
    ``(rows, response)``; drawn on the CPU so that every device sees the same batch."""
    device = model.device
    rows, response, turns = shape.rows, shape.response, shape.turns
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, model.config.vocab_size, (rows, shape.prompt + response), generator=gen)
    span = response // turns
    mask = (torch.arange(response) % span) < span * 3 // 4  # each span: a model turn, then an observation
    mask = mask.expand(rows, response).clone()
    with torch.no_grad(), autocast():
        current = response_log_probs(model, input_ids.to(device), response).cpu()
    turn_noise = torch.randn(rows, turns, generator=gen).repeat_interleave(span, dim=1)
    turn_noise = torch.nn.functional.pad(turn_noise, (0, response - turn_noise.shape[1]))
    old = current + noise * (turn_noise + torch.randn(rows, response, generator=gen))
    reward = (torch.rand(rows, generator=gen) < 0.5).float().view(-1, min(rows, GROUP))
    adv = ((reward - reward.mean(1, keepdim=True)) / (reward.std(1, keepdim=True) + 1e-6)).view(-1, 1)
    batch = (input_ids, old, adv.expand(rows, response).contiguous(), mask)
    return tuple(t.to(device) for t in batch)


def actor_config(loss_mode: str, scope: str, tokens: int, rows: int):
    return OmegaConf.create(
        {
            "clip_ratio": 0.2,
            "clip_ratio_low": 0.2,
            "clip_ratio_high": 0.2,
            "clip_ratio_c": 3.0,
            "policy_loss": {"loss_mode": loss_mode, "norm_scope": scope},
            "global_batch_info": {"dp_size": 1, "batch_num_tokens": tokens, "global_batch_size": rows},
        }
    )


def actor_update(model, optimizer, batch, method: str, micro_batches: int, autocast) -> None:
    input_ids, old, adv, mask = batch
    rows, response = mask.shape
    loss_mode, scope = ("vanilla", "batch") if method == "vanilla" else ("st_ppo", method.split()[1])
    scope = "batch" if scope == "exact" else scope
    config = actor_config(loss_mode, scope, int(mask.sum()), rows)
    loss_fn = get_policy_loss_fn(loss_mode)
    optimizer.zero_grad()
    with batch_correction(optimizer):
        for part in torch.arange(rows, device=mask.device).chunk(micro_batches):
            with autocast():
                log_prob = response_log_probs(model, input_ids[part], response)
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


def agreement(model, noise_levels, shape: Shape, autocast) -> list[tuple]:
    rows = []
    for noise in noise_levels:
        input_ids, old, adv, mask = make_batch(model, noise, shape, autocast, seed=1)
        config = actor_config("st_ppo", "batch", int(mask.sum()), shape.rows)
        opts = resolve_options("st_ppo", config)
        with batch_correction() as corr:
            with autocast():
                log_prob = response_log_probs(model, input_ids, shape.response)
            loss, metrics = get_policy_loss_fn("st_ppo")(old, log_prob, adv, mask, "token-mean", config, None)
            removed, kept = clip_surrogates(old, log_prob, adv, mask, "token-mean", opts, config.global_batch_info)
            c_exact, g_exact = exact_norms(removed, kept, model.parameters())
        result = corr.finalize()
        one = torch.tensor(1.0, dtype=torch.float64)
        c_sq, g_sq = (x.square().cpu() * one for x in (c_exact, g_exact))
        exact_scale = correction_scale(c_sq, g_sq, one, "relative", 0.1, 0.1)
        frac = metrics["actor/pg_clipfrac"] + metrics["actor/sorl/clipfrac_token_dual"]
        token_ratio = result["c_tok"] / max(result["g_tok"], 1e-30)
        exact_ratio = float(c_exact / g_exact.clamp(min=1e-30))
        rows.append((noise, frac, token_ratio, exact_ratio, result["norm_scale"], float(exact_scale)))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("toy", *MODELS), default="toy")
    parser.add_argument("--hidden", type=int, default=None, help="toy model's hidden size (default 256)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--attn", choices=("eager", "sdpa"), default="eager", help="transformers attention")
    parser.add_argument("--rows", type=int, default=16, help=f"trajectories: a multiple of {GROUP}, or fewer")
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--response-len", type=int, default=512)
    parser.add_argument("--turns", type=int, default=4, help="model turns per response")
    parser.add_argument("--micro-batches", type=int, default=4)
    parser.add_argument(
        "--agreement-rows", type=int, default=None, help="rows of the agreement table's micro-batch (all)"
    )
    parser.add_argument("--repeats", type=int, default=9)
    add_device_args(parser)
    args = parser.parse_args()
    if args.model != "toy" and args.hidden is not None:
        parser.error("--hidden applies to --model toy only")
    agreement_rows = args.agreement_rows or args.rows
    if any(n > GROUP and n % GROUP for n in (args.rows, agreement_rows)) or agreement_rows > args.rows:
        parser.error(f"--rows and --agreement-rows: multiples of {GROUP} or fewer; --agreement-rows <= --rows")
    device, dtype = setup(args)
    shape = Shape(args.rows, args.prompt_len, args.response_len, args.turns)

    def autocast():
        if dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=dtype)

    max_positions = shape.prompt + shape.response
    model = make_model(args.hidden or 256, args.layers, max_positions, args.model, args.attn, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0)  # lr 0: every repeat sees the same model
    batch = make_batch(model, 0.3, shape, autocast)
    methods = ["vanilla", "st_ppo batch", "st_ppo sequence", "st_ppo exact"]

    def update(method: str) -> None:
        actor_update(model, optimizer, batch, method, args.micro_batches, autocast)

    for method in methods:  # warm-up (also creates the optimizer state)
        update(method)
    times = {m: [] for m in methods}
    for repeat in range(args.repeats):
        order = methods[repeat % len(methods) :] + methods[: repeat % len(methods)]
        measured = {m: timed(lambda m=m: update(m), device) for m in order}
        for m in methods:
            times[m].append(measured[m])
    peaks = {m: cuda_peak_extra(lambda m=m: update(m), device) for m in methods} if device.type == "cuda" else {}
    n_params = sum(p.numel() for p in model.parameters())
    print(describe(device, dtype))
    print(
        f"actor update: Qwen2 ({args.model}, {args.layers} layers, {args.attn} attention) {n_params / 1e6:.1f}M "
        f"parameters, {shape.rows} x ({shape.prompt}+{shape.response}) tokens, {shape.turns} turns, "
        f"{args.micro_batches} micro-batches, {args.repeats} repeats"
    )
    peak_head = f"{'peak extra GiB':>16}" if peaks else ""
    print(f"{'method':<18}{'median s':>10}{'ratio vs vanilla':>18}{peak_head}")
    ratio_batch = None
    for m in methods:
        ratio = statistics.median(t / v for t, v in zip(times[m], times["vanilla"], strict=True))
        ratio_batch = ratio if m == "st_ppo batch" else ratio_batch
        peak = f"{peaks[m] / 2**30:>16.2f}" if peaks else ""
        print(f"{m:<18}{statistics.median(times[m]):>10.3f}{ratio:>18.3f}{peak}")
    print(f"target: st_ppo batch / vanilla <= {TARGET} -> {'met' if ratio_batch <= TARGET else 'MISSED'}")

    agreement_shape = Shape(agreement_rows, shape.prompt, shape.response, shape.turns)
    print(f"\nagreement, one micro-batch of {agreement_rows} trajectories (tau = 0.1):")
    print(f"{'noise':>6}{'clipped':>9}{'C_tok/G_tok':>13}{'exact C/G':>11}{'s token':>9}{'s exact':>9}")
    for noise, frac, token_ratio, exact_ratio, s_token, s_exact in agreement(
        model, (0.02, 0.05, 0.1, 0.2, 0.4), agreement_shape, autocast
    ):
        print(f"{noise:>6.2f}{frac:>9.1%}{token_ratio:>13.3f}{exact_ratio:>11.3f}{s_token:>9.3f}{s_exact:>9.3f}")


if __name__ == "__main__":
    main()
