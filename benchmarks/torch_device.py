"""Device, dtype, timing and peak-memory helpers shared by the torch benchmarks.

``bench_losses.py`` and ``bench_update.py`` import this module by name: a script's own folder is
first on ``sys.path``, so it needs no package. Not named ``bench_*``: ``make bench`` runs those.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Callable

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def add_device_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="float32")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")


def setup(args: argparse.Namespace) -> tuple[torch.device, torch.dtype]:
    """Apply ``--threads`` and check ``--device``; returns ``(device, dtype)``."""
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda: torch sees no CUDA device")
    return torch.device(args.device), DTYPES[args.dtype]


def describe(device: torch.device, dtype: torch.dtype) -> str:
    """The command line and what ran it, for the head of a benchmark's output."""
    if device.type == "cuda":
        where = f"{torch.cuda.get_device_name(device)}, CUDA {torch.version.cuda}"
    else:
        where = f"cpu, {torch.get_num_threads()} threads"
    command = shlex.join(["python", *sys.argv])
    return f"$ {command}\ntorch {torch.__version__}, {where}, {str(dtype).removeprefix('torch.')}"


def timed(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds ``fn()`` takes, the device's queued work included.

    On CUDA the queue is drained first (earlier work must not count) and the time is read from
    events around the call, which include any host gaps ``fn`` causes (``.item()`` syncs).
    """
    if device.type != "cuda":
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    torch.cuda.synchronize(device)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    fn()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1e3


def cuda_peak_extra(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes allocated on ``device`` during ``fn()`` above what was allocated before it."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before
