"""SFT step time of the quick start's warm start: ``eager`` vs ``sdpa`` attention, side by side.

    python benchmarks/bench_sft.py [--tasks multihop medical] [--steps 20] [--seed 3] [--out DIR]

For each task played through the search loop (``sorl_verl/quickstart/tasks/_search_loop.py``): its knowledge base, tokenizer, tiny model and SFT demonstrations, built as
``prepare`` builds them (the task's defaults and ``--seed``; no SFT, no check). Then the same
``--steps`` batches (32 demonstrations drawn at random, as :func:`~sorl_verl.quickstart.sft.train_sft`
draws them) are trained from the same initial weights with each attention kernel: forward, masked
loss, backward, AdamW step. The kernels alternate in rounds of ``--steps / 4`` steps (ABAB...), so
both see the same load on a shared machine. One torch thread, as ``run_demo.sh`` prepares
(``PREPARE_THREADS=1``). Reported per task and kernel: the median seconds per step over the timed
rounds, the ratio eager / sdpa, the demonstrations' mean and padded token counts, and the largest
difference between the two kernels' losses on the first batch (the same function: it should be
float32 noise). The 1-minute load before and after is printed: read the figures side by side.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from sorl_verl.quickstart.tasks import get_task


def demonstrations(task_name: str, seed: int, folder: Path):
    """``(model_dir, examples, pad_id)`` of ``task_name``'s warm start at ``seed``, untrained."""
    from transformers import AutoTokenizer

    from sorl_verl.quickstart.prepare import untrained_model
    from sorl_verl.quickstart.sft import pad_token_id
    from sorl_verl.quickstart.tasks import _search_loop as loop

    cfg = get_task(task_name).config(seed=seed)
    spec = getattr(importlib.import_module(f"sorl_verl.quickstart.tasks.{task_name}"), "SPEC", None)
    if spec is None:
        raise SystemExit(f"bench_sft.py: task {task_name!r} is not played through the search loop (no SPEC)")
    items = loop.build_task(spec, folder / "task", cfg)
    inputs = loop.warm_start_inputs(spec, folder, items, cfg)
    model_dir = untrained_model(folder / "model", cfg, inputs.texts, inputs.extra_tokens)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return model_dir, inputs.make_examples(tokenizer), pad_token_id(tokenizer), cfg.sft_batch_size


def time_steps(model, optimizer, batches) -> list[float]:
    from sorl_verl.quickstart.sft import masked_lm_loss

    seconds = []
    for batch in batches:
        started = time.perf_counter()
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        loss = masked_lm_loss(logits, batch["input_ids"], batch["loss_mask"])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        seconds.append(time.perf_counter() - started)
    return seconds


def bench_task(task_name: str, steps: int, seed: int, folder: Path) -> dict:
    from sorl_verl.quickstart.sft import SFT_ATTENTION, collate, load_causal_lm, masked_lm_loss

    model_dir, examples, pad_id, batch_size = demonstrations(task_name, seed, folder)
    generator = torch.Generator().manual_seed(seed)
    picks = [torch.randint(len(examples), (batch_size,), generator=generator).tolist() for _ in range(steps + 1)]
    batches = [collate([examples[i] for i in pick], pad_id) for pick in picks]
    warmup, timed = batches[0], batches[1:]
    models = {name: load_causal_lm(model_dir, name).train() for name in SFT_ATTENTION}
    with torch.no_grad():
        losses = {
            name: float(masked_lm_loss(m(input_ids=warmup["input_ids"], attention_mask=warmup["attention_mask"]).logits,
                                       warmup["input_ids"], warmup["loss_mask"]))
            for name, m in models.items()
        }  # fmt: skip
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=3e-3) for name, m in models.items()}
    for name in SFT_ATTENTION:  # one untimed step each: allocator and kernel warm-up
        time_steps(models[name], optimizers[name], [warmup])
    rounds = 4
    per_round = max(1, len(timed) // rounds)
    seconds: dict[str, list[float]] = {name: [] for name in SFT_ATTENTION}
    for r in range(rounds):
        chunk = timed[r * per_round : (r + 1) * per_round]
        order = SFT_ATTENTION if r % 2 == 0 else tuple(reversed(SFT_ATTENTION))
        for name in order:
            seconds[name] += time_steps(models[name], optimizers[name], chunk)
    lengths = [len(e.input_ids) for e in examples]
    padded = statistics.mean(b["input_ids"].numel() / batch_size for b in timed)
    medians = {name: statistics.median(s) for name, s in seconds.items()}
    return {
        "task": task_name,
        "examples": len(examples),
        "mean_tokens": statistics.mean(lengths),
        "padded_tokens": padded,
        **{f"{name}_s": medians[name] for name in SFT_ATTENTION},
        "ratio": medians["eager"] / medians["sdpa"],
        "loss_diff": abs(losses["eager"] - losses["sdpa"]),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=["multihop", "medical"])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="keep the built tasks here (default: a temp folder)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print("load before: {:.2f} {:.2f} {:.2f}; torch threads 1".format(*os.getloadavg()))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = args.out or Path(tmp)
        for name in args.tasks:
            rows.append(bench_task(name, args.steps, args.seed, root / name))
    print(
        "| task | demonstrations | mean tokens | padded tokens per row | eager s/step | sdpa s/step | eager / sdpa | loss difference |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['task']} | {r['examples']} | {r['mean_tokens']:.0f} | {r['padded_tokens']:.0f} | {r['eager_s']:.3f} | "
              f"{r['sdpa_s']:.3f} | {r['ratio']:.2f}x | {r['loss_diff']:.1e} |")  # fmt: skip
    print("load after: {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
