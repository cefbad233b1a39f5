"""Forward+backward time of the SORL losses relative to verl's ``vanilla`` PPO loss.

    python benchmarks/bench_losses.py                      # CPU, float32, 64 x 4096
    python benchmarks/bench_losses.py --device cuda --dtype bfloat16 --rows 256 --response-len 8192

Batch: 64 rows x 4096 response tokens by default, about 8 model turns per row separated by
observation spans (mask 0), float32 on the CPU by default, token-mean aggregation. Each repeat
times ``vanilla``, ``st_ppo`` and ``s_ppo`` back to back on the same inputs (order rotated per
repeat), and the ratios are the medians over repeats. Peak extra memory is the peak of the bytes
allocated during one fwd+bwd call above what existed before it: on the CPU from torch's memory
profiler (allocation and free events replayed in time order), on CUDA from
``torch.cuda.max_memory_allocated``; the inputs themselves are not counted.

Timing runs on one torch thread by default: on a shared 2-core CI machine, multi-threaded
element-wise kernels measure the neighbours' load more than the losses (``--threads`` changes it).
On CUDA each call is timed with events after draining the queue (``torch_device.timed``).

Target: st_ppo / vanilla and s_ppo / vanilla <= 1.3 (turn segmentation may cost at most 30%).
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
from omegaconf import OmegaConf
from torch_device import add_device_args, cuda_peak_extra, describe, setup, timed
from verl.trainer.ppo.core_algos import get_policy_loss_fn

import sorl_verl.algos  # noqa: F401  (registers the losses even without the entry point)
from sorl_verl.algos.correction import batch_correction

TARGET = 1.3


def make_batch(
    rows: int,
    response_len: int,
    turns: int,
    seed: int = 0,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
):
    """Random log-probs and advantages with ``turns`` model turns per row, observations between.

    Drawn on the CPU (the same values on every device), then moved: three ``(rows, response_len)``
    tensors of ``dtype`` and a boolean response mask, on ``device``.
    """
    generator = torch.Generator().manual_seed(seed)
    span = response_len // turns
    position = torch.arange(response_len)
    observation_len = torch.randint(span // 8, span // 3, (rows, 1), generator=generator)
    response_mask = (position % span) < (span - observation_len)  # each span: turn then observation
    old_log_prob = -torch.rand(rows, response_len, generator=generator) * 2
    log_prob = old_log_prob + 0.3 * torch.randn(rows, response_len, generator=generator)
    advantages = torch.randn(rows, 1, generator=generator).expand(rows, response_len).contiguous()
    floats = (t.to(device=device, dtype=dtype) for t in (old_log_prob, log_prob, advantages))
    return (*floats, response_mask.to(device))


def actor_config(loss_mode: str):
    return OmegaConf.create(
        {
            "clip_ratio": 0.2,
            "clip_ratio_low": 0.2,
            "clip_ratio_high": 0.2,
            "clip_ratio_c": 3.0,
            "policy_loss": {"loss_mode": loss_mode},
            "global_batch_info": {},
        }
    )


def fwd_bwd(loss_mode: str, batch) -> Callable[[], None]:
    """One forward+backward of ``loss_mode``, ready to call: the input copy and config are made here."""
    old_log_prob, log_prob, advantages, response_mask = batch
    log_prob = log_prob.clone().requires_grad_(True)
    config = actor_config(loss_mode)
    loss_fn = get_policy_loss_fn(loss_mode)

    def run() -> None:
        with batch_correction() as corr:  # what verl's engine hook opens per mini-batch
            loss, _ = loss_fn(
                old_log_prob=old_log_prob,
                log_prob=log_prob,
                advantages=advantages,
                response_mask=response_mask,
                loss_agg_mode="token-mean",
                config=config,
                rollout_is_weights=None,
            )
            loss.backward()
            corr.finalize()  # the batch scale (the default scope), as before the optimizer step

    return run


def peak_extra_memory(loss_mode: str, batch, device: torch.device) -> int:
    """Peak bytes allocated by one fwd+bwd call (its input copy included) above what existed before it.

    On the CPU, torch's profiler attributes allocations to the op that made them
    (``self_cpu_memory_usage``) and reports frees as ``[memory]`` events; replaying both in time
    order gives the peak.
    """
    if device.type == "cuda":
        return cuda_peak_extra(lambda: fwd_bwd(loss_mode, batch)(), device)
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, profile_memory=True) as profile:
        fwd_bwd(loss_mode, batch)()
    timeline = []
    for event in profile.events():
        usage = event.cpu_memory_usage if event.name == "[memory]" else event.self_cpu_memory_usage
        if usage:
            timeline.append((event.time_range.start, usage))
    timeline.sort(key=lambda item: item[0])
    current = peak = 0
    for _, usage in timeline:
        current += usage
        peak = max(peak, current)
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--response-len", type=int, default=4096)
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--warmups", type=int, default=1, help="untimed calls of each loss first")
    add_device_args(parser)
    args = parser.parse_args()
    device, dtype = setup(args)

    batch = make_batch(args.rows, args.response_len, args.turns, device=device, dtype=dtype)
    losses = ["vanilla", "st_ppo", "s_ppo"]
    for _ in range(args.warmups):
        for name in losses:
            fwd_bwd(name, batch)()
    times = {name: [] for name in losses}
    ratios = {name: [] for name in losses[1:]}
    for repeat in range(args.repeats):
        order = losses[repeat % 3 :] + losses[: repeat % 3]
        measured = {name: timed(fwd_bwd(name, batch), device) for name in order}
        for name in losses:
            times[name].append(measured[name])
        for name in ratios:
            ratios[name].append(measured[name] / measured["vanilla"])

    mask = batch[3]
    print(describe(device, dtype))
    print(
        f"batch {args.rows} x {args.response_len}, {int(mask.sum())} masked tokens, ~{args.turns} turns/row, "
        f"{args.repeats} repeats"
    )
    print(f"{'loss':<10}{'median ms':>12}{'ratio vs vanilla':>18}{'peak extra MiB':>20}")
    all_ok = True
    for name in losses:
        median_ms = statistics.median(times[name]) * 1e3
        ratio = statistics.median(ratios[name]) if name in ratios else 1.0
        memory_mib = peak_extra_memory(name, batch, device) / 2**20
        print(f"{name:<10}{median_ms:>12.2f}{ratio:>18.2f}{memory_mib:>20.1f}")
        if name in ratios:
            all_ok &= ratio <= TARGET
    print(f"target: ratio <= {TARGET} -> {'met' if all_ok else 'MISSED'}")


if __name__ == "__main__":
    main()
