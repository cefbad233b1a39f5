"""``python -m sorl_verl.stability {run,report} [--out SWEEP_DIR] ...``: the off-policy stability benchmark.

    python -m sorl_verl.stability run --quick                 # the ~30-minute subset
    python -m sorl_verl.stability run                         # every pressure x method x 3 seeds
    python -m sorl_verl.stability run --pressures reuse_8x8 --methods grpo so_grpo --seeds 1 2
    python -m sorl_verl.stability run --task multihop --pressures reuse_8x8   # another task family
    python -m sorl_verl.stability run --dry-run               # list the runs and their status
    python -m sorl_verl.stability run --task multihop --segment-turns 1 2 --resets sync staggered   # the segment study
    python -m sorl_verl.stability report                      # table and figures of the finished runs

``make stability ARGS="--quick"`` is ``run`` with those arguments. A second call skips finished
runs and resumes unfinished ones; docs/stability.md explains the axes and the figures of merit.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from sorl_verl.stability.grid import (
    DEFAULT_METHODS,
    DEFAULT_PRESSURES,
    DEFAULT_SEEDS,
    DEFAULT_TASK,
    METHODS,
    PRESSURES,
    QUICK,
    RESETS,
    SEGMENT_DEFAULT_METHODS,
    SEGMENT_DEFAULT_PRESSURES,
    SEGMENT_METHODS,
    Budget,
    build_grid,
    check_task,
    search_loop_tasks,
)

DEFAULT_OUT = Path("runs/stability")


def _env_pair(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.isidentifier():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m sorl_verl.stability", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run the sweep (skips finished runs, resumes unfinished ones), then report")
    r.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"sweep folder (default {DEFAULT_OUT})")
    r.add_argument("--pressures", nargs="+", choices=list(PRESSURES), help=f"default: {' '.join(DEFAULT_PRESSURES)}")
    r.add_argument(
        "--task",
        nargs="+",
        type=_task,
        default=[DEFAULT_TASK],
        metavar="TASK",
        help=f"the quick start's task family: {', '.join(search_loop_tasks())} (default {DEFAULT_TASK}; several: one grid each)",
    )
    r.add_argument(
        "--methods",
        nargs="+",
        choices=list(METHODS),
        help=f"default: {' '.join(DEFAULT_METHODS)} (all: {' '.join(METHODS)})",
    )
    r.add_argument("--seeds", nargs="+", type=int, help=f"default: {' '.join(map(str, DEFAULT_SEEDS))}")
    r.add_argument(
        "--quick",
        action="store_true",
        help=f"the ~30-minute subset: pressures {' '.join(QUICK['pressures'])}, methods {' '.join(QUICK['methods'])}, "
        f"seed {' '.join(map(str, QUICK['seeds']))} (explicit --pressures/--methods/--seeds win)",
    )
    budget = Budget()
    r.add_argument("--steps", type=int, default=budget.steps, help=f"training steps per run (default {budget.steps})")
    r.add_argument(
        "--test-freq", type=int, default=budget.test_freq, help=f"validate every N steps (default {budget.test_freq})"
    )
    r.add_argument(
        "--trajectories",
        type=int,
        default=budget.trajectories,
        help=f"trajectories per step, every method (default {budget.trajectories})",
    )
    r.add_argument(
        "--group-size",
        type=int,
        default=budget.group_size,
        help=f"samples per prompt, critic-free methods (default {budget.group_size})",
    )
    r.add_argument(
        "--prepare-args",
        default="",
        help="extra options of the warm start (python -m sorl_verl.quickstart prepare), e.g. '--n-val 128 --sft-steps 300'",
    )
    r.add_argument(
        "--env",
        type=_env_pair,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="extra run_demo.sh variable (repeatable)",
    )
    r.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Hydra override for every run (repeatable)",
    )
    r.add_argument(
        "--dry-run", action="store_true", help="list the runs, their status and the first pending command; run nothing"
    )
    r.add_argument(
        "--keep-going", action="store_true", help="go on after a failed run (default: stop; the next call resumes it)"
    )
    r.add_argument("--no-report", action="store_true", help="skip the table and figures at the end")
    s = r.add_argument_group(
        "segment study (docs/stability.md#the-segment-study)",
        "arms: whole episodes and segment mode with T turns per segment for each reset schedule; every arm "
        "trains about the same number of model turns (a T arm runs max(1, L/T) times the steps and validation "
        "interval)",
    )
    s.add_argument(
        "--segment-turns",
        nargs="+",
        type=int,
        metavar="T",
        help=f"turns per segment, one arm per T and reset; methods default to {' '.join(SEGMENT_DEFAULT_METHODS)} "
        f"(those that can: {' '.join(SEGMENT_METHODS)}), pressures to {' '.join(SEGMENT_DEFAULT_PRESSURES)}",
    )
    s.add_argument(
        "--resets",
        nargs="+",
        choices=list(RESETS),
        help=f"reset schedules of the segment arms (default: {' '.join(RESETS)})",
    )
    s.add_argument("--no-whole", action="store_true", help="no whole-episode arm (the segment arms only)")
    s.add_argument(
        "--episode-turns",
        type=float,
        metavar="L",
        help="model turns a whole episode trains per trajectory, the budget rule's plan (default: the task's "
        "figure, e.g. 3.5 for multihop)",
    )
    r.add_argument(
        "--archive",
        type=Path,
        metavar="CSV",
        help="a stability_runs.csv kept across sittings (e.g. docs/figures/stability/stability_runs.csv): its runs "
        "count as finished, and each run finished now is merged into it at once",
    )

    p = sub.add_parser("report", help="table (markdown, CSV) and figures of a sweep folder's finished runs")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"sweep folder (default {DEFAULT_OUT})")
    p.add_argument(
        "--archive",
        type=Path,
        nargs="+",
        default=[],
        metavar="CSV",
        help="stability_runs.csv of earlier sittings (e.g. docs/figures/stability/stability_runs.csv): their "
        "runs join the table and the validation figure unless the sweep folder has a finished run of that name",
    )
    return parser


def _grid(args: argparse.Namespace):
    quick = QUICK if args.quick else {}
    segments = args.segment_turns is not None
    if not segments:
        given = [
            flag
            for flag, value in (
                ("--resets", args.resets),
                ("--no-whole", args.no_whole),
                ("--episode-turns", args.episode_turns),
            )
            if value not in (None, False)
        ]
        if given:
            raise ValueError(f"{' and '.join(given)} need --segment-turns (the segment study)")
    else:  # the study's defaults win over --quick's
        quick = {**quick, "pressures": SEGMENT_DEFAULT_PRESSURES, "methods": SEGMENT_DEFAULT_METHODS}
    budget = Budget(
        steps=args.steps,
        test_freq=args.test_freq,
        trajectories=args.trajectories,
        group_size=args.group_size,
        prepare_args=tuple(shlex.split(args.prepare_args)),
        env=tuple(args.env),
        overrides=tuple(args.override),
    )
    return build_grid(
        pressures=args.pressures or quick.get("pressures", DEFAULT_PRESSURES),
        methods=args.methods or quick.get("methods", DEFAULT_METHODS),
        seeds=args.seeds or quick.get("seeds", DEFAULT_SEEDS),
        budget=budget,
        tasks=args.task,
        segment_turns=args.segment_turns or (),
        resets=args.resets or RESETS,
        whole=not args.no_whole,
        episode_turns=args.episode_turns,
    )


def _task(text: str) -> str:
    try:
        return check_task(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _dry_run(out: Path, specs, archive: Path | None = None) -> None:
    from sorl_verl.stability.grid import warm_seed
    from sorl_verl.stability.sweep import (
        archived_names,
        checkpoint_step,
        launch_command,
        run_dir,
        run_status,
        warm_dir,
    )

    archived = archived_names(archive)
    specs_left = [s for s in specs if s.name not in archived]
    for i, spec in enumerate(specs, start=1):
        status = run_status(out, spec)
        if status != "finished" and spec.name in archived:
            status = "finished (archive)"
        elif status == "partial":
            status = f"partial (checkpoint at step {checkpoint_step(run_dir(out, spec))})"
        steps = f", {spec.budget.steps} steps, validation every {spec.budget.test_freq}" if spec.arm else ""
        print(f"[{i}/{len(specs)}] {spec.name}: {status}{steps}")
    pending = [s for s in specs_left if run_status(out, s) != "finished"]
    warm = sorted({(s.task, warm_seed(s.seed, s.budget)) for s in pending})
    warm = [f"{task} seed {seed}" for task, seed in warm if not (warm_dir(out, seed, task) / "prepare.json").is_file()]
    if warm:
        print(f"warm starts to prepare: {', '.join(warm)} (several minutes each)")
    print(f"{len(pending)} of {len(specs)} runs left")
    if pending:
        spec = pending[0]
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in spec.env().items())
        print(f"first pending run:\n  {env} \\\n  {shlex.join(launch_command(spec, run_dir(out, spec)))}")


def _report(out: Path, archives: list[Path] | tuple[Path, ...] = ()) -> int:
    from sorl_verl.stability.analysis import ArchiveError
    from sorl_verl.stability.report import write_report

    if not (out / "runs").is_dir():
        print(
            f"error: {out}: no runs/ folder (is it a sweep folder? run `python -m sorl_verl.stability run --out {out}`)",
            file=sys.stderr,
        )
        return 2
    try:
        info = write_report(out, archives)
    except ArchiveError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for note in info["notes"]:
        print(f"note: {note}", file=sys.stderr)
    if info["runs"]:
        print(info["markdown"])
        print(f"{info['runs']} runs -> " + ", ".join(info["written"].values()), file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "report":
        return _report(args.out, args.archive)
    from sorl_verl.stability.sweep import SweepError, run_sweep

    try:
        specs = _grid(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.dry_run:
        try:
            _dry_run(args.out, specs, args.archive)
        except SweepError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    call = {"argv": sys.argv[1:] if argv is None else list(argv)}
    try:
        outcomes = run_sweep(args.out, specs, call=call, keep_going=args.keep_going, archive=args.archive)
    except SweepError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; the next call resumes the unfinished run", file=sys.stderr)
        return 130
    failed = [o for o in outcomes if o.status == "failed"]
    ran = [o for o in outcomes if o.status == "finished"]
    print(
        f"this call: {len(ran)} runs finished, {len(failed)} failed, {sum(o.status == 'skipped' for o in outcomes)} skipped",
        file=sys.stderr,
    )
    if not args.no_report:
        _report(args.out, [args.archive] if args.archive and args.archive.is_file() else [])
    return 1 if failed or len(outcomes) < len(specs) else 0
