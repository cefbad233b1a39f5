"""Stop what a quick-start launch left running, and record the launch's wall time.

``run_demo.sh`` writes ``RUN_DIR/launch.json`` when it starts (its pid and its private Ray
temp folder, which it exports as ``RAY_TMPDIR``) and calls :func:`cleanup` from its exit
trap, so an ordinary exit, an error, Ctrl-C, SIGTERM or SIGHUP stops the trainer and every
Ray process of the launch. A launcher killed with SIGKILL runs no trap; then

    python -m sorl_verl.quickstart cleanup RUN_DIR

does the same afterwards. Which processes belong to the launch (ours, not a broad name):

- the launcher's descendants (while it lives), and
- every process whose environment holds the launch's ``RAY_TMPDIR`` (a fresh
  ``mktemp`` folder): the trainer, Ray's GCS, raylet, dashboard and worker processes all
  inherit it from the launcher, while other Ray clusters on the machine do not have it.

They get SIGTERM, then SIGKILL after a grace period; the Ray temp folder is removed; the
launch is appended to ``launches.jsonl`` (its end: now, or for a launcher that is gone the
last time the run folder's logs were written), so the summary's wall time covers it.
Linux only (``/proc``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time
from pathlib import Path

from sorl_verl.fileio import write_text_atomic

LAUNCH = "launch.json"


def start_ticks(pid: int) -> int | None:
    """The process's start time (clock ticks since boot, ``/proc/PID/stat`` field 22); None if gone.

    With the pid it identifies a process: a recycled pid has another start time.
    """
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def write_launch(run_dir: Path, started_at: float, launcher_pid: int, ray_tmpdir: str) -> None:
    """Record a starting launch, as ``run_demo.sh`` does (it writes the same JSON from bash)."""
    info = {
        "started_at": started_at,
        "launcher_pid": launcher_pid,
        "launcher_start": start_ticks(launcher_pid),
        "ray_tmpdir": ray_tmpdir,
    }
    write_text_atomic(Path(run_dir) / LAUNCH, json.dumps(info) + "\n")


def _environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone, or not ours to read
        return b""


def _children_map() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...; comm may contain spaces and parentheses
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def launch_processes(
    ray_tmpdir: str | None, launcher_pid: int | None = None, exclude: set[int] = frozenset()
) -> list[int]:
    """Pids of the launch: descendants of ``launcher_pid`` and holders of ``RAY_TMPDIR=ray_tmpdir``."""
    found: set[int] = set()
    if launcher_pid is not None:
        children = _children_map()
        stack = list(children.get(launcher_pid, []))
        while stack:
            pid = stack.pop()
            if pid not in found:
                found.add(pid)
                stack.extend(children.get(pid, []))
    if ray_tmpdir:
        marker = f"RAY_TMPDIR={ray_tmpdir}".encode()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and marker in _environ(int(entry.name)).split(b"\0"):
                found.add(int(entry.name))
    skip = set(exclude) | {os.getpid(), os.getppid()}
    if launcher_pid is not None:
        skip.add(launcher_pid)
    return sorted(found - skip)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is dead for our purpose
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stop_processes(pids: list[int], grace_s: float = 10.0) -> dict[str, int]:
    """SIGTERM ``pids``, wait up to ``grace_s``, SIGKILL the rest; returns counts."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + grace_s
    left = [p for p in pids if _alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [p for p in left if _alive(p)]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return {"terminated": len(pids) - len(left), "killed": len(left)}


def _last_write(run_dir: Path) -> float | None:
    times = [p.stat().st_mtime for p in (run_dir / "train.log", *run_dir.glob("metrics*.jsonl")) if p.is_file()]
    return max(times) if times else None


def cleanup(run_dir: str | os.PathLike, from_launcher: bool = False, grace_s: float = 10.0) -> str:
    """Stop the launch recorded in ``RUN_DIR/launch.json``; returns what was done, in words.

    ``from_launcher``: called by the launcher's own exit trap (the launch ends now). Else
    the launcher must be gone (a live one is stopped with ``kill PID``, which runs its trap).
    """
    from sorl_verl.quickstart.summary import record_launch

    run_dir = Path(run_dir)
    path = run_dir / LAUNCH
    if not path.is_file():
        return f"{run_dir}: no {LAUNCH}: nothing to clean up (the last launch ended cleanly)"
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        started, launcher, ray_tmpdir = float(info["started_at"]), int(info["launcher_pid"]), str(info["ray_tmpdir"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{path}: not a launch record ({e})") from None
    same_process = info.get("launcher_start") in (None, start_ticks(launcher))
    if not from_launcher and _alive(launcher) and same_process:
        raise ValueError(f"{run_dir}: its launcher (pid {launcher}) is still running; stop it with `kill {launcher}`")
    pids = launch_processes(ray_tmpdir, launcher_pid=launcher if from_launcher else None)
    counts = stop_processes(pids, grace_s=grace_s) if pids else {"terminated": 0, "killed": 0}
    # only a folder that mktemp made for a quick start (never a user's RAY_TMPDIR)
    removed = Path(ray_tmpdir).name.startswith("ray_qs.") and Path(ray_tmpdir).is_dir()
    if removed:
        shutil.rmtree(ray_tmpdir, ignore_errors=True)
    ended = time.time() if from_launcher else (_last_write(run_dir) or started)
    record_launch(run_dir, started, max(started, ended), how="exit" if from_launcher else "cleanup after kill")
    path.unlink(missing_ok=True)
    return (
        f"{run_dir}: stopped {len(pids)} process(es) of the launch ({counts['terminated']} on SIGTERM, "
        f"{counts['killed']} on SIGKILL); Ray temp folder {'removed' if removed else 'not found'}: {ray_tmpdir}"
    )
