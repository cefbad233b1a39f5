"""Command line of the quick start's Python steps (``examples/quickstart/run_demo.sh`` calls them).

python -m sorl_verl.quickstart prepare RUN_DIR [--topk 2 --max-obs-length 96 ...]
python -m sorl_verl.quickstart prepare RUN_DIR --task math [--early-answer-fraction 0.7 --max-ops 2 ...]
python -m sorl_verl.quickstart report RUN_DIR [--algo so_grpo --started-at EPOCH_SECONDS]
... | python -m sorl_verl.quickstart progress RUN_DIR/train.log   (terminal filter of the trainer's output)
python -m sorl_verl.quickstart cleanup RUN_DIR   (after a launcher was killed with SIGKILL)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import fields
from pathlib import Path

# options that only one task's config has: ``dest`` -> flag
_TASK_OPTIONS = {
    "search": {
        "guess_fraction": "--guess-fraction",
        "topk": "--topk",
        "max_obs_length": "--max-obs-length",
        "include_wiki": "--no-wiki",
    },
    "math": {"early_answer_fraction": "--early-answer-fraction", "max_ops": "--max-ops"},
}


def _prepare_config(args: argparse.Namespace):
    """The task's prepare config with the options given on the command line; ValueError for another task's option."""
    if args.task == "math":
        from sorl_verl.quickstart.math_task import MathPrepareConfig as config_class
    else:
        from sorl_verl.quickstart.prepare import PrepareConfig as config_class
    foreign = [
        flag
        for task, options in _TASK_OPTIONS.items()
        if task != args.task
        for name, flag in options.items()
        if getattr(args, name, None) is not None
    ]
    if foreign:
        raise ValueError(f"{', '.join(foreign)}: not an option of the {args.task} task")
    cfg = config_class()
    sizes = dict(cfg.sizes)
    for split in ("sft", "train", "val"):
        value = getattr(args, f"n_{split}")
        if value is not None:
            sizes[split] = value
    cfg.sizes = sizes
    for f in fields(config_class):
        value = getattr(args, f.name, None)
        if f.name not in ("sizes", "task") and value is not None:
            setattr(cfg, f.name, value)
    return cfg


def _prepare(args: argparse.Namespace) -> None:
    cfg = _prepare_config(args)
    if args.task == "math":
        from sorl_verl.quickstart.math_task import prepare_math

        info = prepare_math(args.run_dir, cfg, show_progress=not args.quiet)
        print(json.dumps(info, indent=2))
        print(
            f"task: {info['problems']} problems; model: {info['n_params']:,} parameters; "
            f"SFT on {info['sft_examples']} demonstrations ({info['sft_early_examples']} answer early), "
            f"loss {info['sft_loss_first']:.2f} -> {info['sft_loss_last10']:.2f} "
            f"({info['task_seconds'] + info['model_seconds']:.0f} s)",
            file=sys.stderr,
        )
        return
    from sorl_verl.quickstart.prepare import prepare

    info = prepare(args.run_dir, cfg, show_progress=not args.quiet)
    print(json.dumps(info, indent=2))
    print(
        f"task: {info['facts']} facts; model: {info['n_params']:,} parameters; "
        f"SFT on {info['sft_examples']} demonstrations, loss {info['sft_loss_first']:.2f} -> {info['sft_loss_last10']:.2f} "
        f"({info['task_seconds'] + info['model_seconds']:.0f} s)",
        file=sys.stderr,
    )


def _report(args: argparse.Namespace) -> None:
    from sorl_verl.quickstart.summary import report_run

    text = report_run(args.run_dir, algo=args.algo, started_at=args.started_at)
    print(text)


def _cleanup(args: argparse.Namespace) -> None:
    from sorl_verl.quickstart.cleanup import cleanup

    print(cleanup(args.run_dir, from_launcher=args.from_launcher, grace_s=args.grace))


# Python's exception lines, also behind Ray's "(Actor pid=...) " prefix.
_ERROR_LINE = re.compile(r"(^|\) )(Traceback|[A-Za-z_.]*(Error|Exception):)")


def _progress(args: argparse.Namespace) -> None:
    import time

    from sorl_verl.quickstart.report import parse_console_line, progress_line

    started = time.time() if args.started_at is None else args.started_at
    with open(args.log, "a", encoding="utf-8") as log:
        for line in sys.stdin:
            log.write(line)
            log.flush()
            parsed = parse_console_line(line)
            if parsed is not None:
                print(progress_line(*parsed, time.time() - started), file=sys.stderr, flush=True)
            elif _ERROR_LINE.search(line) and "Warning" not in line:
                print(line.rstrip()[:300], file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sorl_verl.quickstart", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("prepare", help="steps 1-2: task (and index), tiny model, SFT warm start (skipped if done)")
    p.add_argument("run_dir", type=Path)
    p.add_argument(
        "--task", choices=("search", "math"), default="search", help="the quick start's task (default: search)"
    )
    for split in ("sft", "train", "val"):
        p.add_argument(f"--n-{split}", type=int, help=f"number of {split} facts (math: problems)")
    p.add_argument("--seed", type=int)
    p.add_argument(
        "--guess-fraction",
        type=float,
        help="demonstration mix: share of SFT demonstrations that answer at once with a wrong guess instead of searching",
    )
    p.add_argument("--topk", type=int, help="passages per search (must match the agent loop's)")
    p.add_argument("--max-obs-length", type=int, help="observation tokens kept (must match the agent loop's)")
    p.add_argument("--no-wiki", dest="include_wiki", action="store_const", const=False, help="KB documents only")
    p.add_argument(
        "--early-answer-fraction",
        type=float,
        help="math: share of the multi-step demonstrations' choices that answer after the first step (wrong)",
    )
    p.add_argument("--max-ops", type=int, help="math: operations per problem, 1 to this")
    p.add_argument("--hidden-size", type=int)
    p.add_argument("--num-layers", type=int)
    p.add_argument("--vocab-size", type=int)
    p.add_argument("--sft-steps", type=int)
    p.add_argument("--sft-batch-size", type=int)
    p.add_argument("--sft-lr", type=float)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_prepare)

    r = sub.add_parser("report", help="step 4: resolved config, plots, summary table of a run folder")
    r.add_argument("run_dir", type=Path)
    r.add_argument("--algo", default=None)
    r.add_argument("--started-at", type=float, default=None, help="epoch seconds at the start (for the wall time)")
    r.set_defaults(func=_report)

    g = sub.add_parser("progress", help="copy stdin to LOG, print one short line per logged trainer step")
    g.add_argument("log", type=Path)
    g.add_argument("--started-at", type=float, default=None)
    g.set_defaults(func=_progress)

    c = sub.add_parser(
        "cleanup",
        help="stop the trainer and Ray processes a killed launch left behind, remove its Ray temp folder, record its time",
    )
    c.add_argument("run_dir", type=Path)
    c.add_argument("--from-launcher", action="store_true", help=argparse.SUPPRESS)  # run_demo.sh's exit trap
    c.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL (default 10)")
    c.set_defaults(func=_cleanup)

    args = parser.parse_args(argv)
    try:
        args.func(args)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
