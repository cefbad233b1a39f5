"""Synthetic sweep: clip fraction vs the clipping-bias correction's scale, for each mode and scope.

    python benchmarks/sweep_correction.py            # markdown table on stdout
    python benchmarks/sweep_correction.py --csv out.csv --plot out.png

Batches of 64 trajectories x 4 assistant turns (10-40 tokens each, observation gaps between
them), with GRPO-style advantages (one standardized value per trajectory, groups of 8, binary
rewards) or GAE-style ones (per token, N(0, 1) around a per-trajectory offset). Log-ratios are
``lam * (turn drift + token noise)``; sweeping ``lam`` moves the clipped-token fraction from 0 to
~30%. For each batch the real loss (:func:`sorl_verl.algos.losses.sorl_policy_loss`) runs inside a
:class:`~sorl_verl.algos.correction.BatchCorrection` and the scale is read off it: ``batch`` scope
the mini-batch's ``s``, ``sequence`` scope the mean of the rows' ``s``. The former rule
(``relative`` with ``tau = 1``) is the first column. This is what chose the defaults
(``tau = 0.1``, ``kappa = 0.1``) until the stability benchmark measures them in training.
"""

from __future__ import annotations

import argparse
import csv
import sys

import torch

from sorl_verl.algos.config import SorlLossOptions
from sorl_verl.algos.correction import batch_correction
from sorl_verl.algos.losses import sorl_policy_loss

ROWS, TURNS, GROUP = 64, 4, 8
BINS = (0.0, 0.005, 0.01, 0.02, 0.03, 0.05, 0.08, 0.12, 0.16, 0.3)
VARIANTS = (  # (column name, normalization, scope, tau, kappa)
    ("relative tau=1 sequence (former rule)", "relative", "sequence", 1.0, 0.1),
    ("relative tau=0.1 batch (default)", "relative", "batch", 0.1, 0.1),
    ("relative tau=0.1 sequence", "relative", "sequence", 0.1, 0.1),
    ("relative tau=0.2 batch", "relative", "batch", 0.2, 0.1),
    ("absolute kappa=0.1 batch", "absolute", "batch", 0.1, 0.1),
)


def make_batch(gen: torch.Generator, advantages: str):
    """One synthetic mini-batch: ``(mask, base_log_ratio, advantages)``, each ``(ROWS, length)``."""
    lengths = torch.randint(10, 41, (ROWS, TURNS), generator=gen)
    gap = 8
    width = int((lengths + gap).sum(dim=1).max())
    mask = torch.zeros(ROWS, width)
    turn_of = torch.full((ROWS, width), -1, dtype=torch.long)
    for r in range(ROWS):
        pos = 0
        for k in range(TURNS):
            n = int(lengths[r, k])
            mask[r, pos : pos + n] = 1
            turn_of[r, pos : pos + n] = k
            pos += n + gap
    drift = torch.randn(ROWS, TURNS, generator=gen)
    base = drift.gather(1, turn_of.clamp(min=0)) * 0.5 + torch.randn(ROWS, width, generator=gen)
    if advantages == "grpo":
        reward = (torch.rand(ROWS, generator=gen) < 0.4).float().view(-1, GROUP)
        adv = ((reward - reward.mean(1, keepdim=True)) / (reward.std(1, keepdim=True) + 1e-6)).view(-1, 1)
        adv = adv.expand(ROWS, width).clone()
    else:
        adv = torch.randn(ROWS, 1, generator=gen) * 0.5 + torch.randn(ROWS, width, generator=gen)
    return mask, base * mask, adv * mask


def measure(mask, base, adv, lam: float, ratio_level: str, variant) -> tuple[float, float]:
    """``(clipped-token fraction, scale)`` of one batch under one variant."""
    _, normalization, scope, tau, kappa = variant
    opts = SorlLossOptions(ratio_level, normalization, scope, tau, kappa, 0.2, 0.2, 3.0)
    old = torch.zeros_like(base)
    new = (lam * base).requires_grad_()
    with batch_correction() as corr:
        loss, metrics = sorl_policy_loss(old, new, adv, mask, "token-mean", loss_name="st_ppo", options=opts)
        loss.backward()
    result = corr.finalize()
    frac = metrics["actor/pg_clipfrac"] + metrics["actor/sorl/clipfrac_token_dual"]
    scale = result["norm_scale"] if scope == "batch" else metrics["actor/sorl/norm_scale"]
    return frac, scale


def sweep(seeds: int = 3) -> tuple[list[dict], dict]:
    """Binned table rows, and every measured point per (advantages, ratio level) for the plot."""
    rows, raw = [], {}
    for advantages in ("grpo", "gae"):
        for ratio_level in ("token", "turn"):
            points = []  # (frac, [scale per variant])
            for seed in range(seeds):
                gen = torch.Generator().manual_seed(seed)
                mask, base, adv = make_batch(gen, advantages)
                for lam in torch.logspace(-2.5, 0, 40).tolist():
                    results = [measure(mask, base, adv, lam, ratio_level, v) for v in VARIANTS]
                    points.append((results[0][0], [s for _, s in results]))
            raw[advantages, ratio_level] = points
            for lo, hi in zip(BINS[:-1], BINS[1:], strict=True):
                inside = [s for f, s in points if lo <= f < hi] if lo > 0 else [s for f, s in points if f == 0]
                if not inside:
                    continue
                mean = torch.tensor(inside).mean(0).tolist()
                row = {"advantages": advantages, "ratio": ratio_level, "clipped": f"{lo:.1%}-{hi:.1%}" if lo else "0"}
                row.update({name: f"{m:.3f}" for (name, *_), m in zip(VARIANTS, mean, strict=True)})
                row["n"] = len(inside)
                rows.append(row)
    return rows, raw


def plot(raw: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(raw), figsize=(4.2 * len(raw), 3.6), sharey=True)
    for ax, ((advantages, ratio_level), points) in zip(axes, sorted(raw.items()), strict=True):
        points = sorted(points)
        fracs = [100 * f for f, _ in points]
        for k, (name, *_) in enumerate(VARIANTS):
            ax.plot(fracs, [scales[k] for _, scales in points], ".", ms=4, label=name)
        ax.set_xscale("symlog", linthresh=1.0)
        ax.set_xlabel("clipped tokens (%)")
        ax.set_title(f"{advantages} advantages, {ratio_level} ratio")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("scale s")
    axes[-1].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--csv", help="also write the table as CSV here")
    parser.add_argument("--plot", help="also draw every point (clip fraction vs scale) as a PNG here")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows, raw = sweep(args.seeds)
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(str(row[k]) for k in keys) + " |")
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=keys)
            writer.writeheader()
            writer.writerows(rows)
    if args.plot:
        plot(raw, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
