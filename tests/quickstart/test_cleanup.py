"""Cleanup after a killed quick-start launch: its processes (found by their RAY_TMPDIR) stop, its Ray
temp folder goes, its time is recorded; other processes are left alone."""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from sorl_verl.quickstart.cleanup import LAUNCH, cleanup, launch_processes, write_launch
from sorl_verl.quickstart.summary import read_launches

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc")

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def _spawn(env_extra: dict) -> subprocess.Popen:
    # a new session, like Ray's daemons: not a child of anything the cleanup could walk
    return subprocess.Popen(SLEEPER, env={**os.environ, **env_extra}, start_new_session=True)


def _dead_pid() -> int:
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    return int(done.stdout)


@pytest.fixture
def ray_tmpdir():
    path = tempfile.mkdtemp(prefix="ray_qs.")
    yield path
    if os.path.isdir(path):
        os.rmdir(path)


def _wait_gone(proc: subprocess.Popen, timeout: float = 10.0) -> bool:
    try:
        proc.wait(timeout=timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def test_cleanup_after_sigkill_stops_marked_processes_only(tmp_path, ray_tmpdir):
    ours = [_spawn({"RAY_TMPDIR": ray_tmpdir}) for _ in range(2)]
    stranger = _spawn({"RAY_TMPDIR": ray_tmpdir + "-other"})
    try:
        time.sleep(0.3)
        (tmp_path / "train.log").write_text("step:1\n")
        started = time.time() - 100
        write_launch(tmp_path, started, _dead_pid(), ray_tmpdir)
        assert set(launch_processes(ray_tmpdir)) >= {p.pid for p in ours}
        assert stranger.pid not in launch_processes(ray_tmpdir)

        message = cleanup(tmp_path, grace_s=5)

        assert all(_wait_gone(p) for p in ours), message
        assert stranger.poll() is None, "a process of another launch was stopped"
        assert not os.path.exists(ray_tmpdir)
        assert not (tmp_path / LAUNCH).exists()
        (record,) = read_launches(tmp_path)
        assert record["how"] == "cleanup after kill"
        # the launch ended when its logs were last written, not when cleanup ran
        assert record["ended_at"] == pytest.approx((tmp_path / "train.log").stat().st_mtime, abs=0.1)
        assert "stopped 2 process(es)" in message
    finally:
        for proc in (*ours, stranger):
            proc.kill()
            proc.wait()


def test_cleanup_without_launch_record_does_nothing(tmp_path):
    assert "nothing to clean up" in cleanup(tmp_path)
    assert read_launches(tmp_path) == []


def test_cleanup_refuses_while_the_launcher_runs(tmp_path, ray_tmpdir):
    launcher = _spawn({"RAY_TMPDIR": ray_tmpdir})
    try:
        write_launch(tmp_path, time.time(), launcher.pid, ray_tmpdir)
        with pytest.raises(ValueError, match=rf"pid {launcher.pid}\) is still running"):
            cleanup(tmp_path)
        assert launcher.poll() is None and (tmp_path / LAUNCH).exists()
        # a recycled pid (same number, another start time) is not the launcher
        info = json.loads((tmp_path / LAUNCH).read_text())
        (tmp_path / LAUNCH).write_text(json.dumps({**info, "launcher_start": info["launcher_start"] - 1}))
        assert "stopped 1 process(es)" in cleanup(tmp_path, grace_s=5)
        assert _wait_gone(launcher)
    finally:
        launcher.kill()
        launcher.wait()


def test_from_launcher_stops_descendants_and_records_now(tmp_path, ray_tmpdir):
    # a "launcher" whose child does not carry the marker: found as a descendant
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); time.sleep(120)",
        ],
        env={k: v for k, v in os.environ.items() if k != "RAY_TMPDIR"},
    )
    try:
        time.sleep(0.5)
        child = launch_processes(None, launcher_pid=launcher.pid)
        assert len(child) == 1
        write_launch(tmp_path, time.time() - 5, launcher.pid, ray_tmpdir)
        # the trap passes the launcher's pid through launch.json; the launcher itself is spared
        cleanup(tmp_path, from_launcher=True, grace_s=5)
        deadline = time.time() + 10
        while time.time() < deadline and Path(f"/proc/{child[0]}").exists():
            launcher.poll()  # reap nothing but keep the launcher alive
            time.sleep(0.1)
        state = (
            Path(f"/proc/{child[0]}/stat").read_text().rsplit(")", 1)[1].split()[0]
            if Path(f"/proc/{child[0]}").exists()
            else "gone"
        )
        assert state in ("gone", "Z")
        assert launcher.poll() is None
        (record,) = read_launches(tmp_path)
        assert record["how"] == "exit" and record["ended_at"] - record["started_at"] == pytest.approx(5, abs=3)
    finally:
        launcher.kill()
        launcher.wait()
