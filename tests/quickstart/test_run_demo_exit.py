"""run_demo.sh stops its whole launch on SIGTERM, and `cleanup` does it after a SIGKILL.

The trainer is replaced by a stand-in (PYTHON points to a wrapper): it starts a "Ray daemon"
in its own session (as Ray's GCS and raylet are, out of reach of a process-group kill) and
sleeps. Every other Python step (cpu overrides, cleanup, progress filter) is the real one;
`prepare` is skipped by the wrapper, so no model is trained here.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "examples" / "quickstart" / "run_demo.sh"

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")

WRAPPER = """#!/usr/bin/env bash
case " $* " in
  *" sorl_verl.quickstart prepare "*)
    if [[ -n "${FAKE_PREPARE_SLEEP:-}" ]]; then echo "prepare $$" >>"$FAKE_LOG"; exec sleep 300; fi
    echo '{}'; exit 0 ;;
  *" verl.trainer.main_ppo "*)
    (setsid sleep 300 </dev/null >/dev/null 2>&1 & echo "daemon $!" >>"$FAKE_LOG")  # orphaned at once, like a daemon
    echo "trainer $$" >>"$FAKE_LOG"
    exec sleep 300 ;;
  *) exec "$REAL_PYTHON" "$@" ;;
esac
"""


def _alive(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_for(predicate, timeout: float) -> bool:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return predicate()


def _start(tmp_path: Path, lines: int = 2, **extra_env: str) -> tuple[subprocess.Popen, Path, Path]:
    wrapper = tmp_path / "python"
    wrapper.write_text(WRAPPER)
    wrapper.chmod(0o755)
    log = tmp_path / "fake.log"
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHON": str(wrapper), "REAL_PYTHON": sys.executable, "FAKE_LOG": str(log), **extra_env}
    env.pop("RAY_TMPDIR", None)
    launcher = subprocess.Popen(
        ["bash", str(DEMO), "grpo", "--out", str(run_dir)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    assert _wait_for(lambda: log.is_file() and len(log.read_text().splitlines()) == lines, 120), (
        "stand-in never started"
    )
    return launcher, run_dir, log


def _pids(log: Path) -> dict[str, int]:
    return {name: int(pid) for name, pid in (line.split() for line in log.read_text().splitlines())}


@contextlib.contextmanager
def launched(tmp_path: Path, lines: int = 2, **extra_env: str):
    """``(launcher, run_dir, pids)`` of a started demo; whatever a failed test leaves is killed."""
    launcher, run_dir, log = _start(tmp_path, lines, **extra_env)
    pids = _pids(log)
    try:
        yield launcher, run_dir, pids
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
        for pid in pids.values():
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_sigterm_stops_the_trainer_and_its_detached_daemons(tmp_path):
    with launched(tmp_path) as (launcher, run_dir, pids):
        ray_tmpdir = Path(json.loads((run_dir / "launch.json").read_text())["ray_tmpdir"])
        assert all(_alive(p) for p in pids.values()) and ray_tmpdir.is_dir()
        assert Path(f"/proc/{pids['daemon']}/stat").read_text().rsplit(")", 1)[1].split()[1] != str(pids["trainer"])
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=60) == 143
        assert _wait_for(lambda: not any(_alive(p) for p in pids.values()), 20), f"left running: {pids}"
        assert not (run_dir / "launch.json").exists()
        records = (run_dir / "launches.jsonl").read_text().splitlines()
        assert len(records) == 1 and '"how": "exit"' in records[0]
        assert not ray_tmpdir.exists()


@pytest.mark.slow
def test_cleanup_after_sigkill_of_the_launcher(tmp_path):
    with launched(tmp_path) as (launcher, run_dir, pids):
        os.killpg(launcher.pid, signal.SIGKILL)  # the launcher's group: launcher, trainer, filter
        launcher.wait(timeout=30)
        assert _wait_for(lambda: not _alive(pids["trainer"]), 10)
        assert _alive(pids["daemon"]), "the detached daemon should survive a process-group SIGKILL"
        done = subprocess.run(
            [sys.executable, "-m", "sorl_verl.quickstart", "cleanup", str(run_dir), "--grace", "5"],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        assert done.returncode == 0, done.stderr
        assert "stopped 1 process(es)" in done.stdout and "removed" in done.stdout
        assert _wait_for(lambda: not _alive(pids["daemon"]), 10)
        assert '"how": "cleanup after kill"' in (run_dir / "launches.jsonl").read_text()


@pytest.mark.slow
def test_sigterm_during_prepare_exits_at_once(tmp_path):
    with launched(tmp_path, lines=1, FAKE_PREPARE_SLEEP="1") as (launcher, run_dir, pids):
        started = time.time()
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=60) == 143
        assert time.time() - started < 30  # not after prepare's 300 s
        assert _wait_for(lambda: not _alive(pids["prepare"]), 20)
        assert '"how": "exit"' in (run_dir / "launches.jsonl").read_text()
