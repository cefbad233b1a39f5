"""Atomic outputs: a failure (bad row, full disk, Ctrl-C) never leaves a half-written file or folder.

Everything that writes a result the user keeps (parquet, corpus, index, model, table, run files)
writes it beside its destination under a temporary name and renames it into place at the end.

A writer killed outright (SIGKILL, power loss) cannot clean up, so temporary names say who made
them, ``.{name}.{host}.{pid}.{random}.tmp`` (``.old`` for a folder being replaced), and the next
writer of the same destination removes the ones of this host whose process is gone: the pid is
dead, or it was reused (the file is older than that process). Temporaries of live writers, of
other hosts (a shared filesystem) and of other destinations are left alone.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_dir", "atomic_file", "default_cache_dir", "remove_stale_temporaries", "write_text_atomic"]


def _host() -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname())[:32] or "host"


def _temp_prefix(path: Path) -> str:
    return f".{path.name}.{_host()}.{os.getpid()}."


def _process_start_time(pid: int) -> float | None:
    """When ``pid`` started (seconds since the epoch), from Linux's /proc; None where unknown."""
    try:
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(
            int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime ")
        )
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _owner_gone(pid: int, created: float) -> bool:
    if pid == os.getpid():
        return False  # ours: another writer in this process may be using it
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # alive, another user's
    started = _process_start_time(pid)
    # 1 s of slack: /proc's start time has clock-tick resolution and btime whole seconds.
    return started is not None and created < started - 1.0


def remove_stale_temporaries(path: str | Path) -> list[Path]:
    """Remove the temporaries of ``path`` left by writers of this host that died; returns them."""
    path = Path(path)
    pattern = re.compile(re.escape(f".{path.name}.{_host()}.") + r"(\d+)\.[^.]+\.(?:tmp|old)$")
    removed = []
    try:
        siblings = list(path.parent.iterdir())
    except OSError:
        return removed
    for sibling in siblings:
        match = pattern.match(sibling.name)
        if match is None:
            continue
        try:
            created = sibling.lstat().st_mtime
        except OSError:
            continue
        if not _owner_gone(int(match.group(1)), created):
            continue
        if sibling.is_dir() and not sibling.is_symlink():
            shutil.rmtree(sibling, ignore_errors=True)
        else:
            sibling.unlink(missing_ok=True)
        removed.append(sibling)
    return removed


@contextmanager
def atomic_file(path: str | Path, mode: int = 0o644) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path``, else it is removed.

    The parent folder is created; an existing ``path`` stays untouched until the very end.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    fd, tmp_name = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.chmod(tmp, mode)  # mkstemp creates 0600
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; returns ``path``."""
    with atomic_file(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


@contextmanager
def atomic_dir(path: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``path``; on success it becomes ``path``.

    Refuses (``FileExistsError``) to replace an existing ``path`` unless ``overwrite``; with it, the
    old folder is moved aside and removed only once the new one is in place. On failure the
    temporary folder is removed and ``path`` is as it was.
    """
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} already exists (pass overwrite to replace it)")
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path)
    tmp = Path(tempfile.mkdtemp(prefix=_temp_prefix(path), suffix=".tmp", dir=path.parent))
    os.chmod(tmp, 0o755)  # mkdtemp creates 0700
    try:
        yield tmp
        if path.exists() and not overwrite:
            raise FileExistsError(f"{path} appeared while it was being built; not replacing it")
        replace_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def replace_dir(new: str | Path, path: str | Path) -> None:
    """Move the folder ``new`` to ``path`` (same file system), replacing ``path`` if it exists: the old
    folder is moved aside and removed only once the new one is in place, so two renames keep a complete
    folder at ``path`` except for an instant."""
    path = Path(path)
    if path.exists():
        old = Path(tempfile.mkdtemp(prefix=_temp_prefix(path), suffix=".old", dir=path.parent))
        os.replace(path, old / path.name)
        os.replace(new, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(new, path)


def default_cache_dir() -> Path:
    """Where sorl-verl keeps what it can rebuild (indexes of the embedded corpus, corpus offset tables,
    data sets exported from the hub): ``$SORL_VERL_CACHE``, else ``$XDG_CACHE_HOME/sorl_verl``, else
    ``~/.cache/sorl_verl``."""
    if os.environ.get("SORL_VERL_CACHE"):
        return Path(os.environ["SORL_VERL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "sorl_verl"
