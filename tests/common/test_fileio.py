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
