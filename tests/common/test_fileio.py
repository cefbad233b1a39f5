import pytest

from sorl_verl.fileio import atomic_dir, atomic_file, write_text_atomic


def test_atomic_file_replaces_only_on_success(tmp_path):
    target = tmp_path / "sub" / "out.txt"
    write_text_atomic(target, "old")
    with pytest.raises(RuntimeError):
        with atomic_file(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("disk full")
    assert target.read_text() == "old"
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.txt"]  # no temp file left
    write_text_atomic(target, "new")
    assert target.read_text() == "new"
    assert oct(target.stat().st_mode & 0o777) == oct(0o644)


def test_atomic_dir_refuses_overwrite_and_cleans_up(tmp_path):
    target = tmp_path / "index"
    with atomic_dir(target) as tmp:
        (tmp / "a").write_text("1")
    assert (target / "a").read_text() == "1"
    with pytest.raises(FileExistsError):
        with atomic_dir(target):
            pass
    with pytest.raises(ValueError):
        with atomic_dir(target, overwrite=True) as tmp:
            (tmp / "b").write_text("2")
            raise ValueError("bad row")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index"]
    assert sorted(p.name for p in target.iterdir()) == ["a"]
    with atomic_dir(target, overwrite=True) as tmp:
        (tmp / "b").write_text("2")
    assert sorted(p.name for p in target.iterdir()) == ["b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["index"]  # the old folder is gone too


def test_atomic_dir_does_not_replace_a_folder_that_appeared_meanwhile(tmp_path):
    target = tmp_path / "index"
    with pytest.raises(FileExistsError, match="appeared"):
        with atomic_dir(target) as tmp:
            (tmp / "mine").write_text("1")
            target.mkdir()
            (target / "theirs").write_text("2")
    assert sorted(p.name for p in target.iterdir()) == ["theirs"]


def test_temporaries_of_a_killed_writer_are_removed_by_the_next_one(tmp_path):
    """SIGKILL during a write leaves the temp file; the next write of the same target removes it."""
    import signal
    import subprocess
    import sys

    target = tmp_path / "out.parquet"
    script = (
        "import sys, time\n"
        "from sorl_verl.fileio import atomic_file\n"
        "with atomic_file(sys.argv[1]) as tmp:\n"
        "    tmp.write_bytes(b'x' * 1000)\n"
        "    print(tmp.name, flush=True)\n"
        "    time.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script, str(target)], stdout=subprocess.PIPE, text=True)
    leftover = tmp_path / proc.stdout.readline().strip()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert leftover.exists() and leftover.name.startswith(".out.parquet.") and leftover.name.endswith(".tmp")
    other = tmp_path / leftover.name.replace(".out.parquet.", ".other.parquet.")  # another target's: kept
    other.write_text("x")
    write_text_atomic(target, "new")
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out.parquet", other.name])


def test_live_and_reused_pids(tmp_path):
    """A live writer's temporary stays; one whose pid now belongs to a younger process goes."""
    import os
    import time

    from sorl_verl.fileio import _host, remove_stale_temporaries

    target = tmp_path / "index"
    parent = os.getppid()  # alive, and started before this test
    live = tmp_path / f".index.{_host()}.{parent}.abc123.tmp"
    live.mkdir()
    reused = tmp_path / f".index.{_host()}.{parent}.def456.tmp"
    reused.write_text("x")
    old = time.time() - 10 * 365 * 86400  # older than any running process: made by an earlier owner of the pid
    os.utime(reused, (old, old))
    foreign = tmp_path / f".index.otherhost.{parent}.ghi789.tmp"  # another host on a shared filesystem
    foreign.write_text("x")
    old_style = tmp_path / ".index.k2j3h4g5.tmp"  # written before names said who made them: unknown owner
    old_style.write_text("x")
    assert remove_stale_temporaries(target) == [reused]
    assert live.exists() and foreign.exists() and old_style.exists()
    with atomic_dir(target) as tmp:
        assert tmp.name.startswith(f".index.{_host()}.{os.getpid()}.")
