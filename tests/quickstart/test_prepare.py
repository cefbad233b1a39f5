"""Steps 1-2 end to end at a tiny size: files, rows, index, single-token names, the demonstration mix,
idempotence, and the refusal to reuse a folder prepared with other settings."""

import dataclasses
import json

import pandas as pd
import pytest

from sorl_verl.quickstart.prepare import PrepareConfig, PrepareMismatch, prepare
from sorl_verl.quickstart.task import Fact, made_up_words


def read_facts(path):
    return [Fact(**json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines()]


def tiny_config(**changes) -> PrepareConfig:
    """A task and model small enough for a test: no Wikipedia, a 1-layer model, 3 SFT steps."""
    settings = dict(
        sizes={"sft": 40, "train": 12, "val": 8},
        include_wiki=False,
        hidden_size=32,
        num_layers=1,
        vocab_size=300,
        sft_steps=3,
        sft_batch_size=4,
        guess_fraction=0.25,
    )
    return PrepareConfig(**{**settings, **changes})


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    cfg = tiny_config()
    info = prepare(run_dir, cfg, show_progress=False)
    return run_dir, cfg, info


def test_files_and_rows(prepared):
    run_dir, cfg, info = prepared
    assert info["facts"] == {"sft": 40, "train": 12, "val": 8}
    facts = read_facts(run_dir / "task" / "facts.jsonl")
    for split, n in (("train", 12), ("val", 8)):
        rows = pd.read_parquet(run_dir / "task" / f"{split}.parquet")
        assert len(rows) == n
        assert set(rows["agent_name"]) == {"search_r1"}
        split_facts = [f for f in facts if f.split == split]
        assert [list(r["ground_truth"]["target"]) for r in rows["reward_model"]] == [[f.value] for f in split_facts]
        assert [r["split"] for r in rows["extra_info"]] == [split] * n
    meta = json.loads((run_dir / "task" / "index" / "meta.json").read_text())
    assert meta["method"] == "bm25" and meta["num_docs"] == len(facts)  # no wiki: the facts only
    assert (run_dir / "model" / "model.safetensors").is_file()
    recorded = json.loads((run_dir / "prepare.json").read_text())
    assert recorded["sft_examples"] == 40 and recorded["sft_guess_examples"] == 10
    assert recorded["sft_search_choice_taught"] == 30
    assert recorded["config"]["guess_fraction"] == 0.25


def test_made_up_words_are_single_tokens(prepared):
    from transformers import AutoTokenizer

    run_dir, _, _ = prepared
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "model")
    words = made_up_words(read_facts(run_dir / "task" / "facts.jsonl"))
    for word in words:
        assert len(tokenizer.encode(word, add_special_tokens=False)) == 1, word
    for tag in ("<search>", "</search>", "<answer>", "</answer>", "<information>", "</information>"):
        assert len(tokenizer.encode(tag, add_special_tokens=False)) == 1, tag


def test_prepare_is_skipped_when_done(prepared):
    run_dir, cfg, info = prepared
    stamp = (run_dir / "model" / "model.safetensors").stat().st_mtime_ns
    assert prepare(run_dir, cfg, show_progress=False) == info
    assert (run_dir / "model" / "model.safetensors").stat().st_mtime_ns == stamp


@pytest.mark.parametrize(
    "change",
    [
        {"topk": 2},
        {"max_obs_length": 32},
        {"seed": 7},
        {"guess_fraction": 0.5},
        {"sizes": {"sft": 40, "train": 12, "val": 9}},
        {"sft_attention": "sdpa"},
    ],
)
def test_prepare_refuses_other_settings(prepared, change):
    run_dir, cfg, _ = prepared
    stamp = (run_dir / "prepare.json").read_bytes()
    other = dataclasses.replace(cfg, **change)
    name = next(iter(change))
    with pytest.raises(PrepareMismatch, match=rf"prepared with other settings \({name}: prepared .*, asked"):
        prepare(run_dir, other, show_progress=False)
    assert (run_dir / "prepare.json").read_bytes() == stamp


def test_a_record_made_before_the_sft_attention_setting_reads_as_eager(prepared, tmp_path):
    # folders prepared before sft_attention existed were made with eager attention: still valid for
    # that recipe, refused for another, naming the setting
    import shutil

    from sorl_verl.quickstart.prepare import LEGACY_SETTINGS

    run_dir, cfg, _ = prepared
    old = tmp_path / "old"
    shutil.copytree(run_dir, old)
    record = json.loads((old / "prepare.json").read_text())
    for key in LEGACY_SETTINGS:
        del record["config"][key]
    (old / "prepare.json").write_text(json.dumps(record))
    assert cfg.sft_attention == "eager"
    assert prepare(old, cfg, show_progress=False)["facts"] == record["facts"]
    with pytest.raises(PrepareMismatch, match=r"sft_attention: prepared 'eager', asked 'sdpa'"):
        prepare(old, dataclasses.replace(cfg, sft_attention="sdpa"), show_progress=False)


def test_prepare_refuses_a_record_without_config(tmp_path):
    (tmp_path / "prepare.json").write_text('{"facts": 3}\n')
    with pytest.raises(PrepareMismatch, match="not a prepare record"):
        prepare(tmp_path, PrepareConfig(), show_progress=False)


def test_cli_reports_a_mismatch_as_an_error(prepared, capsys):
    from sorl_verl.quickstart.__main__ import main

    run_dir, cfg, _ = prepared
    with pytest.raises(SystemExit) as exit_info:
        main(["prepare", str(run_dir), "--topk", "3", "--quiet"])
    assert str(exit_info.value.code).startswith(f"error: {run_dir / 'prepare.json'}: this run folder was prepared")


def test_config_defaults_match_the_launcher_defaults():
    """A warm start prepared without the variables (the stability sweep's cache) must match run_demo.sh's."""
    import re
    from pathlib import Path

    from sorl_verl.quickstart.tasks import get_task, task_names

    for name in task_names():
        task = get_task(name)
        cfg = task.config()
        if "DEMO_MIX" in task.defaults:
            assert float(task.defaults["DEMO_MIX"]) == getattr(cfg, task.demo_mix), name
        for var, field in (("TOPK", "topk"), ("MAX_OBS_LENGTH", "max_obs_length")):
            if var in task.defaults:
                assert int(task.defaults[var]) == getattr(cfg, field), (name, var)
    assert get_task("search").config is PrepareConfig
    # run_demo.sh takes the values from the task, not from defaults of its own
    script = (Path(__file__).resolve().parents[2] / "examples" / "quickstart" / "run_demo.sh").read_text()
    for var in get_task("search").defaults:
        assert not re.search(rf"^{var}=", script, re.M), var


def test_copy_accuracy_is_recorded_and_a_weak_warm_start_warns(prepared, capsys):
    from sorl_verl.quickstart.prepare import SFT_RETRIES, warn_weak_warm_start

    _, _, info = prepared
    assert 0.0 <= info["copy_accuracy"] <= 1.0
    assert info["copy_accuracy"] < 0.5  # 3 SFT steps of a 1-layer model learn no copying
    # a weak warm start is redone from a fresh initialization, and the better attempt is kept
    per_attempt = info["copy_accuracy_per_attempt"]
    assert info["sft_attempts"] == 1 + SFT_RETRIES == len(per_attempt)
    assert info["copy_accuracy"] == max(per_attempt) == per_attempt[info["sft_attempt_kept"] - 1]
    assert warn_weak_warm_start(info)
    assert "copy_accuracy" in capsys.readouterr().err
    assert not warn_weak_warm_start({**info, "copy_accuracy": 0.97})
    assert not warn_weak_warm_start({"config": {}})  # a warm start prepared before the check


def test_a_warm_start_that_copies_is_kept_at_the_first_attempt(tmp_path, monkeypatch):
    import sorl_verl.quickstart.prepare as prep

    seeds = []
    build = prep.build_warm_start
    monkeypatch.setattr(
        prep, "build_warm_start", lambda run_dir, cfg, *a, **k: seeds.append(cfg.seed) or build(run_dir, cfg, *a, **k)
    )
    monkeypatch.setattr(prep, "copy_accuracy", lambda *a, **k: 0.9)
    info = prepare(tmp_path / "run", tiny_config(sizes={"sft": 8, "train": 4, "val": 4}, seed=7), show_progress=False)
    assert seeds == [7] and info["sft_attempts"] == 1 and info["copy_accuracy"] == 0.9
    assert info["config"]["seed"] == 7


def test_a_retry_worse_than_the_first_attempt_is_dropped(tmp_path, monkeypatch):
    import torch

    import sorl_verl.quickstart.prepare as prep

    cfg = tiny_config(sizes={"sft": 8, "train": 4, "val": 4}, seed=7)
    monkeypatch.setattr(prep, "retry_beside_first", lambda: False)
    monkeypatch.setattr(prep, "copy_accuracy", lambda *a, **k: 0.9)
    alone = prepare(tmp_path / "alone", cfg, show_progress=False)  # the first attempt only
    checks = iter([0.5, 0.1])
    monkeypatch.setattr(prep, "copy_accuracy", lambda *a, **k: next(checks))
    info = prepare(tmp_path / "run", cfg, show_progress=False)
    assert info["copy_accuracy_per_attempt"] == [0.5, 0.1] and info["sft_attempts"] == 2
    assert info["sft_attempt_kept"] == 1 and info["copy_accuracy"] == 0.5
    assert info["sft_loss_last10"] == alone["sft_loss_last10"]
    a, b = model_tensors(tmp_path / "alone" / "model"), model_tensors(tmp_path / "run" / "model")
    assert all(torch.equal(a[k], b[k]) for k in a)  # the first attempt's model, not the retry's
    assert not (tmp_path / "run" / prep.RETRY_DIR).exists()


def model_tensors(model_dir):
    from safetensors.torch import load_file

    return load_file(str(model_dir / "model.safetensors"))


def test_the_retry_trained_beside_the_first_attempt_gives_the_serial_warm_start(tmp_path, monkeypatch):
    """Both attempts fail the copy check (3 SFT steps): the child's retry is installed, bit for bit the
    model that the retry made in turn gives, with the same record, and its folder is gone."""
    import torch

    import sorl_verl.quickstart.prepare as prep

    cfg = tiny_config(seed=5)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the child: each attempt on one thread
    try:
        monkeypatch.setattr(prep, "retry_beside_first", lambda: False)
        serial = prepare(tmp_path / "serial", cfg, show_progress=False)
        monkeypatch.setattr(prep, "retry_beside_first", lambda: True)
        beside = prepare(tmp_path / "beside", cfg, show_progress=False)
    finally:
        torch.set_num_threads(threads)
    assert serial["sft_attempts"] == beside["sft_attempts"] == 2
    assert (serial["sft_retry_beside_first"], beside["sft_retry_beside_first"]) == (False, True)
    assert serial["copy_accuracy_per_attempt"] == beside["copy_accuracy_per_attempt"]
    assert serial["sft_loss_last10"] == beside["sft_loss_last10"]
    a, b = model_tensors(tmp_path / "serial" / "model"), model_tensors(tmp_path / "beside" / "model")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (tmp_path / "serial" / "model" / "tokenizer.json").read_bytes() == (
        tmp_path / "beside" / "model" / "tokenizer.json"
    ).read_bytes()
    assert sorted(p.name for p in (tmp_path / "beside").iterdir()) == sorted(
        p.name for p in (tmp_path / "serial").iterdir()
    )


def test_a_first_attempt_that_copies_stops_the_retry_beside_it(tmp_path, monkeypatch):
    import sorl_verl.quickstart.prepare as prep

    started = []
    speculative = prep.SpeculativeAttempt

    class Recorded(speculative):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(prep, "SpeculativeAttempt", Recorded)
    monkeypatch.setattr(prep, "retry_beside_first", lambda: True)
    monkeypatch.setattr(prep, "copy_accuracy", lambda *a, **k: 0.9)  # the parent's first attempt copies
    info = prepare(tmp_path / "run", tiny_config(seed=6), show_progress=False)
    assert info["sft_attempts"] == 1 and info["sft_retry_beside_first"] and len(started) == 1
    assert not started[0]._process.is_alive()
    assert not (tmp_path / "run" / prep.RETRY_DIR).exists()


def test_a_retry_child_that_dies_is_run_in_the_parent(tmp_path, monkeypatch, capsys):
    import sorl_verl.quickstart.prepare as prep

    class Killed(prep.SpeculativeAttempt):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._process.kill()  # as the kernel's OOM killer would

    monkeypatch.setattr(prep, "SpeculativeAttempt", Killed)
    monkeypatch.setattr(prep, "retry_beside_first", lambda: True)
    info = prepare(tmp_path / "run", tiny_config(seed=8), show_progress=False)
    assert info["sft_attempts"] == 2 and (tmp_path / "run" / "model" / "model.safetensors").is_file()
    assert "the retry trained beside the first attempt failed (the child process ended with exit code -9)" in (
        capsys.readouterr().err
    )
    assert not (tmp_path / "run" / prep.RETRY_DIR).exists()
