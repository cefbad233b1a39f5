"""Running a sweep: warm starts once per seed, one launcher call per run folder, skip and resume.

Layout of a sweep folder::

    sweep.json                    the grid of the last call and every run's status
    warm_start/seed-<N>/          task/, model/, prepare.json (python -m sorl_verl.quickstart prepare)
    warm_start/seed-<N>.log       its output (other tasks than search: warm_start/<task>-seed-<N>/)
    runs/[<task>__]<pressure>__<method>[__<arm>]__s<seed>/     (arm: T<turns>-<resets>, segment study)
        task -> ../../warm_start/seed-<N>/task      (symlinks: every method starts from one model)
        model -> ../../warm_start/seed-<N>/model
        prepare.json              copy (run_demo.sh's prepare step finds it and skips)
        stability_run.json        the run's settings and launches (written before the first launch)
        stability.log             the launcher's output, appended per launch
        ...                       what run_demo.sh writes: .hydra/, metrics-*.jsonl, checkpoints/, summary.*
        stability_done.json       completion marker, written atomically after the last step

A rerun skips folders with ``stability_done.json``; an unfinished folder is launched again with
the same ``--out`` and verl resumes from its latest checkpoint (``trainer.resume_mode=auto``).
A folder whose recorded settings differ from the requested ones is refused, never mixed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from sorl_verl.fileio import write_text_atomic
from sorl_verl.recipes import RECIPE_VARIABLES
from sorl_verl.stability.grid import DEFAULT_TASK, DONE_MARKER, RUN_RECORD, Budget, RunSpec, prepare_args, warm_seed

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "examples" / "quickstart" / "run_demo.sh"
RUN_LOG = "stability.log"
PREPARE_MARKER = "prepare.json"
WARM_LINKS = ("task", "model")


class SweepError(RuntimeError):
    """A sweep that cannot go on (settings conflict, failed warm start); the message names the folder."""


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise SweepError(f"{path}: unreadable ({e}); remove it (or its run folder) to start that run again") from None
    if not isinstance(data, dict):
        raise SweepError(f"{path}: expected a JSON object")
    return data


def _write_json(path: Path, data: dict) -> None:
    write_text_atomic(path, json.dumps(data, indent=2) + "\n")


# ---------------------------------------------------------------- run folder state


def run_dir(sweep_dir: Path, spec: RunSpec) -> Path:
    return sweep_dir / "runs" / spec.name


def warm_dir(sweep_dir: Path, seed: int, task: str = DEFAULT_TASK) -> Path:
    """The warm start of ``task`` and ``seed`` (the default task's keeps its earlier place)."""
    return sweep_dir / "warm_start" / (f"seed-{seed}" if task == DEFAULT_TASK else f"{task}-seed-{seed}")


def checkpoint_step(folder: Path) -> int:
    """verl's latest saved step in ``folder/checkpoints`` (0 when none)."""
    tracker = folder / "checkpoints" / "latest_checkpointed_iteration.txt"
    try:
        return int(tracker.read_text().strip())
    except (OSError, ValueError):
        return 0


def run_status(sweep_dir: Path, spec: RunSpec) -> str:
    """``finished``, ``partial`` (started, not finished) or ``new``."""
    folder = run_dir(sweep_dir, spec)
    if (folder / DONE_MARKER).is_file():
        return "finished"
    if (folder / RUN_RECORD).is_file():
        return "partial"
    return "new"


def check_record(folder: Path, spec: RunSpec) -> dict | None:
    """The folder's recorded run (None when new); :class:`SweepError` when its settings differ."""
    path = folder / RUN_RECORD
    if not path.is_file():
        return None
    record = _read_json(path)
    wanted = json.loads(json.dumps(spec.record()))
    differ = sorted(k for k in wanted if record.get(k) != wanted[k])
    if differ:
        details = "; ".join(f"{k}: recorded {record.get(k)!r}, asked {wanted[k]!r}" for k in differ)
        raise SweepError(
            f"{folder}: this run was started with other settings ({details}). Use another sweep folder, "
            "or remove this run folder to run it again with the new settings."
        )
    return record


def link_warm_start(folder: Path, warm: Path) -> None:
    """Symlink ``task/`` and ``model/`` of the seed's warm start into ``folder``, copy ``prepare.json``."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in WARM_LINKS:
        link, target = folder / name, warm / name
        relative = os.path.relpath(target, folder)
        if link.is_symlink():
            if os.readlink(link) == relative:
                continue
            link.unlink()
        elif link.exists():
            raise SweepError(f"{link}: exists and is not the warm start's link; remove the run folder to start over")
        link.symlink_to(relative, target_is_directory=True)
    marker = folder / PREPARE_MARKER
    if not marker.is_file():
        write_text_atomic(marker, (warm / PREPARE_MARKER).read_text(encoding="utf-8"))


def final_step_logged(folder: Path, steps: int) -> bool:
    """Whether the metrics files hold the last training step (verl logs it after its validation)."""
    from sorl_verl.tables.runs import find_metrics_files, read_metrics

    try:
        logged = read_metrics(find_metrics_files(folder))
    except ValueError:
        return False
    return any(step >= steps for step in logged)


# ---------------------------------------------------------------- launching


def launch_command(spec: RunSpec, folder: Path) -> list[str]:
    return ["bash", str(LAUNCHER), spec.algo, "--out", str(folder), *spec.overrides()]


def _stop(proc: subprocess.Popen) -> None:
    """Stop the launcher's process group like Ctrl-C would, then harder (Ray's workers included)."""
    for sig, wait in ((signal.SIGINT, 30), (signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


# Variables the launcher reads that the sweep never inherits from the caller's shell: an
# exported ACTOR_LR or STEPS would otherwise change some runs' budget unseen. Give them with --env.
_KEEP = {"PYTHON", "RAY_AUTH_MODE"}


def launcher_knobs() -> set[str]:
    """Names of the variables run_demo.sh and common.sh read with a default (``${NAME:-...}``: the lists
    ``LAUNCHER_VARIABLES`` and ``RECIPE_VARIABLES``, which tests check against the scripts), and the
    variables a task gives defaults to."""
    from sorl_verl.quickstart.tasks import LAUNCHER_VARIABLES, get_task, task_names

    names = set(RECIPE_VARIABLES | LAUNCHER_VARIABLES)
    for task in task_names():  # run_demo.sh takes these defaults from the task (quickstart defaults TASK)
        names.update(get_task(task).defaults)
    return names - _KEEP


def launch_env(spec: RunSpec, base: dict[str, str] | None = None) -> tuple[dict[str, str], list[str]]:
    """The launcher's environment for ``spec`` and the inherited knobs it dropped."""
    base = dict(os.environ if base is None else base)
    dropped = sorted(k for k in launcher_knobs() if k in base)
    for name in dropped:
        del base[name]
    env = {**base, **spec.env(), "RAY_AUTH_MODE": base.get("RAY_AUTH_MODE", "disabled")}
    env.setdefault("PYTHON", sys.executable)
    return env, dropped


def launch_run(spec: RunSpec, folder: Path) -> int:
    """Run ``run_demo.sh`` for ``spec`` into ``folder``; its output is appended to ``stability.log``."""
    env, _ = launch_env(spec)
    with open(folder / RUN_LOG, "a", encoding="utf-8") as log:
        log.write(f"\n===== launch {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(launch_command(spec, folder))}\n")
        log.flush()
        # Own process group: an interrupt stops the launcher and its Ray cluster, nothing else.
        proc = subprocess.Popen(
            launch_command(spec, folder),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO,
            start_new_session=True,
        )
        try:
            return proc.wait()
        except BaseException:
            _stop(proc)
            raise


def finish_report(spec: RunSpec, folder: Path) -> None:
    """The quick start's report of a run whose trainer had finished (a launch killed while reporting)."""
    subprocess.run(
        [sys.executable, "-m", "sorl_verl.quickstart", "report", str(folder), "--algo", spec.method],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )


def prepare_warm_start(
    sweep_dir: Path, seed: int, budget: Budget, log: Callable[[str], None], task: str = DEFAULT_TASK
) -> Path:
    """``python -m sorl_verl.quickstart prepare`` into the task's and seed's cache folder (skipped when done)."""
    seed = warm_seed(seed, budget)
    warm = warm_dir(sweep_dir, seed, task)
    if (warm / PREPARE_MARKER).is_file():
        return warm
    warm.parent.mkdir(parents=True, exist_ok=True)
    log_path = warm.parent / f"{warm.name}.log"
    cmd = [sys.executable, "-m", "sorl_verl.quickstart", "prepare", str(warm), *prepare_args(seed, budget, task)]
    log(f"warm start, {task} seed {seed}: python {' '.join(cmd[1:])} (log: {log_path})")
    started = time.time()
    # torch threads as run_demo.sh's prepare step (PREPARE_THREADS, default 1): the sum order of
    # SFT, hence the warm start's bits, depends on the thread count
    env = {**os.environ, "OMP_NUM_THREADS": dict(budget.env).get("PREPARE_THREADS", "1")}
    with open(log_path, "a", encoding="utf-8") as out:
        done = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, env=env, check=False)
    if done.returncode != 0 or not (warm / PREPARE_MARKER).is_file():
        tail = log_path.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-5:]
        raise SweepError(
            f"warm start for {task} seed {seed} failed (status {done.returncode}); see {log_path}:\n" + "\n".join(tail)
        )
    log(f"warm start, {task} seed {seed}: ready in {time.time() - started:.0f} s")
    return warm


# ---------------------------------------------------------------- the sweep


@dataclass
class Outcome:
    name: str
    status: str  # finished | skipped | failed
    seconds: float = 0.0
    detail: str = ""


def _fmt_minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


def write_manifest(sweep_dir: Path, specs: list[RunSpec], args: dict) -> None:
    """``sweep.json``: the grid of this call, every run's settings and status."""
    path = sweep_dir / "sweep.json"
    previous = _read_json(path) if path.is_file() else {}
    # a whole-episode run's (a segment arm's steps are rescaled: each run's are listed below)
    budget = next((s.budget for s in specs if s.arm is None), specs[0].budget)
    manifest = {
        "created": previous.get("created", time.strftime("%Y-%m-%dT%H:%M:%S")),
        "updated": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "launcher": str(LAUNCHER.relative_to(REPO)),
        "call": args,
        "grid": {
            "pressures": {s.pressure.name: asdict(s.pressure) for s in specs},
            "methods": list(dict.fromkeys(s.method for s in specs)),
            "seeds": list(dict.fromkeys(s.seed for s in specs)),
            "tasks": list(dict.fromkeys(s.task for s in specs)),
            "budget": asdict(budget),
            # the segment study's arms (their budgets: each run's steps below)
            **({"arms": list(dict.fromkeys(s.arm_name for s in specs))} if any(s.arm for s in specs) else {}),
        },
        "runs": [
            {
                "name": s.name,
                "task": s.task,
                "pressure": s.pressure.name,
                "method": s.method,
                "seed": s.seed,
                **({"arm": s.arm_name, "steps": s.budget.steps} if s.arm else {}),
                "status": run_status(sweep_dir, s),
            }
            for s in specs
        ],
    }
    _write_json(path, manifest)


def run_sweep(
    sweep_dir: Path,
    specs: list[RunSpec],
    *,
    call: dict | None = None,
    keep_going: bool = False,
    launch: Callable[[RunSpec, Path], int] = launch_run,
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
    archive: Path | None = None,
) -> list[Outcome]:
    """Run every spec not finished yet, in order; returns one outcome per spec.

    ``launch`` runs one run folder and returns its exit status (tests pass a fake). A failed run
    stops the sweep unless ``keep_going``; it is resumed by the next call either way.

    ``archive``: a ``stability_runs.csv`` kept in the repository (run folders are not). A run named
    in it counts as finished and is skipped; each run finished here is merged into it at once
    (:func:`update_archive`), so a sweep spans sittings on fresh checkouts. Runs are matched by
    name (task, pressure, method, seed): the archive does not record the budget.
    """
    sweep_dir = Path(sweep_dir)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    for spec in specs:  # refuse a settings conflict before spending minutes on anything
        check_record(run_dir(sweep_dir, spec), spec)
    archived = archived_names(archive)
    write_manifest(sweep_dir, specs, call or {})

    def done(spec: RunSpec) -> bool:
        return spec.name in archived or run_status(sweep_dir, spec) == "finished"

    todo = [s for s in specs if not done(s)]
    log(f"sweep {sweep_dir}: {len(specs)} runs, {len(specs) - len(todo)} finished, {len(todo)} to run")
    if todo and launch is launch_run:
        dropped = launch_env(todo[0])[1]
        if dropped:
            log(
                f"note: ignoring {', '.join(dropped)} from the environment (same budget for every run; use --env NAME=VALUE)"
            )

    outcomes: list[Outcome] = []
    spent: list[float] = []  # wall seconds of the runs finished in this call (the ETA's basis)
    total = len(specs)
    for i, spec in enumerate(specs, start=1):
        folder = run_dir(sweep_dir, spec)
        arm = f" {spec.arm.name}" if spec.arm else ""
        head = f"[{i}/{total}] {spec.task} {spec.pressure.name} {spec.method}{arm} seed {spec.seed}"
        if run_status(sweep_dir, spec) == "finished":
            outcomes.append(Outcome(spec.name, "skipped", detail="finished earlier"))
            log(f"{head}: finished earlier, skipped")
            continue
        if spec.name in archived:
            outcomes.append(Outcome(spec.name, "skipped", detail="in the archive"))
            log(f"{head}: in {archive}, skipped")
            continue
        warm = prepare_warm_start(sweep_dir, spec.seed, spec.budget, log, spec.task)
        record = check_record(folder, spec)
        link_warm_start(folder, warm)
        if record is None:
            record = {**spec.record(), "launches": []}
        resume_at = checkpoint_step(folder)
        trained = resume_at >= spec.budget.steps and final_step_logged(folder, spec.budget.steps)
        left = len([s for s in specs[i - 1 :] if not done(s)])
        eta = f", {left} runs left" + (f", ETA {_fmt_minutes(sum(spent) / len(spent) * left)}" if spent else "")
        if trained:
            note = f" (trained to step {resume_at} earlier: report only)"
        else:
            note = f" (resume from step {resume_at})" if resume_at else ""
        log(f"{head}: start{note}{eta}")

        started = time.time()
        rc: int | str = "interrupted"
        try:
            if trained:
                finish_report(spec, folder)  # trainer done, killed before the end: only the report was missing
                rc = 0
            else:
                _write_json(folder / RUN_RECORD, record)  # before the launch: the folder is now this run's
                rc = launch(spec, folder)
        finally:  # an interrupted launch counts in the run's wall time too
            seconds = time.time() - started
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started))
            record["launches"].append({"started": stamp, "seconds": round(seconds, 1), "status": rc})
            _write_json(folder / RUN_RECORD, record)

        complete = rc == 0 and final_step_logged(folder, spec.budget.steps)
        if complete:
            wall = sum(launch["seconds"] for launch in record["launches"])
            _write_json(
                folder / DONE_MARKER,
                {
                    "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
                    "steps": spec.budget.steps,
                    "wall_seconds": round(wall, 1),
                    "launches": len(record["launches"]),
                },
            )
            spent.append(seconds)
            outcomes.append(Outcome(spec.name, "finished", seconds))
            log(f"{head}: finished in {_fmt_minutes(seconds)}{_score_note(folder)}")
            if archive is not None:
                update_archive(sweep_dir, archive)
        else:
            why = f"exit status {rc}" if rc else f"step {spec.budget.steps} not in its metrics"
            outcomes.append(Outcome(spec.name, "failed", seconds, why))
            log(f"{head}: FAILED after {_fmt_minutes(seconds)} ({why}); see {folder / RUN_LOG}")
        write_manifest(sweep_dir, specs, call or {})
        if not complete and not keep_going:
            log("stopping (give --keep-going to go on after a failed run); the next call resumes it")
            break
    return outcomes


def archived_names(archive: Path | None) -> set[str]:
    """Names of the runs in an archive ``stability_runs.csv`` (none when it does not exist yet)."""
    if archive is None or not Path(archive).is_file():
        return set()
    from sorl_verl.stability.analysis import ArchiveError, archived_results

    try:
        return {r.name for r in archived_results(Path(archive))}
    except ArchiveError as e:
        raise SweepError(str(e)) from None


def update_archive(sweep_dir: Path, archive: Path) -> None:
    """Merge the sweep folder's finished runs into ``archive`` (rewritten atomically; its other rows kept)."""
    from sorl_verl.stability.analysis import load_results, runs_csv

    archive = Path(archive)
    results, _ = load_results(sweep_dir, [archive] if archive.is_file() else [])
    archive.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(archive, runs_csv(results))  # the rows only: the figures wait for the report


def _score_note(folder: Path) -> str:
    """`, validation 0.148 -> 0.461` from the run's metrics, or nothing."""
    from sorl_verl.tables.plot import mean_validation_curve
    from sorl_verl.tables.runs import RunError, load_run

    try:
        _, scores = mean_validation_curve(load_run(folder))
    except RunError:
        return ""
    return f", validation {scores[0]:.3f} -> {scores[-1]:.3f}" if scores else ""
