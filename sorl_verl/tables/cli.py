"""``python -m sorl_verl.tables RUN_DIR [RUN_DIR ...] --format markdown|latex|csv [--out FILE] [--plot FILE.png]``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sorl_verl.fileio import write_text_atomic
from sorl_verl.tables.runs import RunError, load_run
from sorl_verl.tables.table import FORMATS, build_table


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m sorl_verl.tables",
        description="Methods x datasets table (and curves) from sorl-verl / verl run folders. A run folder holds "
        "verl's FileLogger metrics*.jsonl and the resolved config (config.yaml or .hydra/config.yaml).",
    )
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run folders, one table row each")
    p.add_argument("--format", choices=sorted(FORMATS), default="markdown")
    p.add_argument(
        "--select",
        choices=["best", "last"],
        default="best",
        help="validation step per run: 'best' = highest mean over the run's datasets, 'last' = last (default: best)",
    )
    p.add_argument(
        "--digits", type=int, default=3, help="decimals in markdown/latex (default 3; csv keeps full precision)"
    )
    p.add_argument("--out", type=Path, help="write the table here instead of stdout")
    p.add_argument("--plot", type=Path, metavar="FILE.png", help="also write validation and stability curves")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        runs = [load_run(d) for d in args.runs]
    except RunError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for run in runs:
        if not run.validation:
            print(f"warning: {run.path}: no val-core/* metrics; its row is empty", file=sys.stderr)
    text = FORMATS[args.format](build_table(runs, select=args.select), digits=args.digits)
    if args.out:
        write_text_atomic(args.out, text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    if args.plot:
        from sorl_verl.tables.plot import plot_runs

        panels = plot_runs(runs, args.plot)
        print(f"wrote {args.plot} ({len(panels)} panels)", file=sys.stderr)
    return 0
