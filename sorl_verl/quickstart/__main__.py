"""Command line of the quick start's Python steps (``examples/quickstart/run_demo.sh`` calls them).

python -m sorl_verl.quickstart prepare RUN_DIR [--topk 2 --max-obs-length 96 ...]
python -m sorl_verl.quickstart prepare RUN_DIR --task math|multihop|medical [--demo-mix 0.7 --max-ops 2 ...]
python -m sorl_verl.quickstart defaults TASK     (launcher variables' defaults, as shell lines)
python -m sorl_verl.quickstart launcher TASK     (the task's launcher script)
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


def _prepare_config(args: argparse.Namespace):
    """The task's prepare config with the options given on the command line; ValueError for another task's option."""
    from sorl_verl.quickstart.tasks import get_task, task_names

    task = get_task(args.task)
    own = {o.field for o in task.options}
    foreign = sorted(
        {
            o.flag
            for name in task_names()
            if name != task.name
            for o in get_task(name).options
            if o.field not in own and getattr(args, o.field, None) is not None
        }
    )
    if foreign:
        raise ValueError(f"{', '.join(foreign)}: not an option of the {task.name} task")
    cfg = task.config()
    sizes = dict(cfg.sizes)
    for split in ("sft", "train", "val"):
        value = getattr(args, f"n_{split}")
        if value is not None:
            sizes[split] = value
    cfg.sizes = sizes
    for f in fields(task.config):
        value = getattr(args, f.name, None)
        if f.name not in ("sizes", "task") and value is not None:
            setattr(cfg, f.name, value)
    if args.demo_mix is not None:
        setattr(cfg, task.demo_mix, args.demo_mix)
    return cfg


def _prepare(args: argparse.Namespace) -> None:
    from sorl_verl.quickstart.tasks import get_task

    task = get_task(args.task)
    info = task.prepare(args.run_dir, _prepare_config(args), show_progress=not args.quiet)
    print(json.dumps(info, indent=2))
    print(task.report(info), file=sys.stderr)


def _defaults(args: argparse.Namespace) -> None:
    """Shell lines that give each launcher variable of the task its default unless it is set."""
    import shlex

    from sorl_verl.quickstart.tasks import get_task

    for name, value in get_task(args.task).defaults.items():
        print(f"{name}=${{{name}:-{shlex.quote(value)}}}")


def _launcher(args: argparse.Namespace) -> None:
    from sorl_verl.quickstart.tasks import get_task

    print(get_task(args.task).launcher_path)


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
    from sorl_verl.quickstart.tasks import DEFAULT_TASK, UnknownTask, get_task, task_names

    names = task_names()
    parser = argparse.ArgumentParser(prog="python -m sorl_verl.quickstart", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for command, func, text in (
        ("defaults", _defaults, "shell lines giving the task's launcher variables their defaults (run_demo.sh)"),
        ("launcher", _launcher, "the path of the task's launcher script (make demo TASK=...)"),
    ):
        d = sub.add_parser(command, help=text)
        d.add_argument("task", help=", ".join(names))
        d.set_defaults(func=func)

    p = sub.add_parser("prepare", help="steps 1-2: task (and index), tiny model, SFT warm start (skipped if done)")
    p.add_argument("run_dir", type=Path)
    p.add_argument(
        "--task", default=DEFAULT_TASK, help=f"the quick start's task: {', '.join(names)} (default: {DEFAULT_TASK})"
    )
    for split in ("sft", "train", "val"):
        p.add_argument(f"--n-{split}", type=int, help=f"number of {split} facts (math: problems)")
    p.add_argument("--seed", type=int)
    p.add_argument(
        "--demo-mix",
        type=float,
        help="demonstration mix: share of the demonstrated choices that stop early (the task's own field)",
    )
    options: dict[str, tuple] = {}  # flag -> (option, tasks that have it)
    for name in names:
        for o in get_task(name).options:
            options.setdefault(o.flag, (o, []))[1].append(name)
    for o, tasks in options.values():
        text = f"{o.help} ({', '.join(tasks)})"
        if o.type is bool:  # a flag that turns a default-on setting off
            p.add_argument(o.flag, dest=o.field, action="store_const", const=False, help=text)
        else:
            p.add_argument(o.flag, dest=o.field, type=o.type, help=text)
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
    except UnknownTask as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
