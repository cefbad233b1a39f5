"""Steps 1-2 end to end at a tiny size: files, rows, index, single-token names, idempotence."""

import json

import pandas as pd
import pytest

from sorl_verl.quickstart.prepare import PrepareConfig, prepare
from sorl_verl.quickstart.task import made_up_words, read_facts


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    cfg = PrepareConfig(
        sizes={"sft": 40, "train": 12, "val": 8},
        include_wiki=False,
        hidden_size=32,
        num_layers=1,
        vocab_size=300,
        sft_steps=3,
        sft_batch_size=4,
    )
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
    assert json.loads((run_dir / "prepare.json").read_text())["sft_examples"] == 40


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
