"""Atomic outputs: a failure (bad row, full disk, Ctrl-C) never leaves a half-written file or folder.

Everything that writes a result the user keeps (parquet, corpus, index, model, table, run files)
writes it beside its destination under a temporary name and renames it into place at the end.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["atomic_dir", "atomic_file", "write_text_atomic"]


@contextmanager
def atomic_file(path: str | Path, mode: int = 0o644) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success it replaces ``path``, else it is removed.

    The parent folder is created; an existing ``path`` stays untouched until the very end.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
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
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    os.chmod(tmp, 0o755)  # mkdtemp creates 0700
    try:
        yield tmp
        if path.exists() and not overwrite:
            raise FileExistsError(f"{path} appeared while it was being built; not replacing it")
        if path.exists():
            # Two renames keep a complete folder at ``path`` except for an instant.
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.replace(path, old / path.name)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
