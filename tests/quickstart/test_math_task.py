"""The math quick start's task: generator, answers under the math reward, DAPO prompt, demonstrations,
and steps 1-2 (prepare: files, cache, skip, refusal of other settings)."""

import dataclasses
import json

import pandas as pd
import pytest

import reward_fns
from data_prep._common import SINGLE_TURN_AGENT
from data_prep.templates import DAPO_MATH, dapo_problem
from sorl_verl.quickstart.math_task import (
    DATA_SOURCE,
    EARLY,
    FULL,
    FULL_UNTAUGHT,
    MathPrepareConfig,
    Problem,
    demonstration,
    generate_problems,
    plan_kinds,
    prepare_math,
    problem_row,
    prompt_messages,
    read_problems,
    write_problems,
)
from sorl_verl.quickstart.prepare import PrepareConfig, PrepareMismatch

SIZES = {"sft": 300, "train": 40, "val": 60}


def score(row, response):
    """The router's score of ``response`` for ``row``, as verl's reward worker calls it."""
    return reward_fns.compute_score(
        row["data_source"], response, row["reward_model"]["ground_truth"], extra_info=row["extra_info"]
    )["score"]


def test_generator_is_deterministic_per_seed():
    a, b = generate_problems(SIZES, seed=3), generate_problems(SIZES, seed=3)
    assert a == b
    assert generate_problems(SIZES, seed=4) != a


def test_splits_are_disjoint_sized_and_in_range():
    problems = generate_problems(SIZES, seed=0, max_ops=3)
    assert {s: sum(p.split == s for p in problems) for s in SIZES} == SIZES
    assert len({p.key() for p in problems}) == len(problems)
    for p in problems:
        assert 0 <= p.start <= 29 and 1 <= len(p.steps) <= 3
        assert all(op in "+-" and 1 <= d <= 9 for op, d in p.steps)
        assert all(0 <= v <= 29 for v in p.values)
    val_ops = [len(p.steps) for p in problems if p.split == "val"]
    assert set(val_ops) == {1, 2, 3}  # uniform over 1..max_ops, drawn first


def test_generator_refuses_ranges_too_small_for_the_sizes():
    with pytest.raises(ValueError, match="could not draw 30 distinct problems"):
        generate_problems({"sft": 10, "train": 10, "val": 10}, max_ops=1, start_range=(10, 10), operand_range=(2, 3))
    with pytest.raises(ValueError, match="sizes must give a count"):
        generate_problems({"sft": 10, "train": 0, "val": 10})


def test_answers_are_right_under_the_math_reward():
    problems = generate_problems(SIZES, seed=1)
    for i, p in enumerate(problems):
        assert p.answer == eval(p.text.removeprefix("What is ").removesuffix("?"))  # noqa: S307 - our own digits and +/-
        row = problem_row(p, i)
        full = "".join(text for text, _ in demonstration(p, FULL))
        assert full.splitlines()[-1] == f"Answer: {p.answer}"
        assert score(row, full) == 1.0, (p, full)
        if len(p.steps) > 1:
            early = "".join(text for text, _ in demonstration(p, EARLY))
            assert early == f"{p.work_lines[0]}\nAnswer: {p.values[0]}"
            assert score(row, early) == (1.0 if p.values[0] == p.answer else 0.0)


def test_rows_use_dapo_math_prompt_and_the_shared_schema():
    p = Problem(start=23, steps=(("+", 7), ("-", 5)), split="val")
    row = problem_row(p, 4)
    content = row["prompt"][0]["content"]
    assert content == DAPO_MATH.format(problem="What is 23 + 7 - 5?")
    assert dapo_problem(content) == p.text and prompt_messages(p) == row["prompt"]
    assert row["data_source"] == DATA_SOURCE and row["agent_name"] == SINGLE_TURN_AGENT and row["ability"] == "math"
    assert row["reward_model"]["ground_truth"] == {"target": ["25"]}
    assert row["extra_info"]["reward_fn"] == "math" and row["extra_info"]["subject"] == "2-step"
    assert reward_fns.reward_name_for(row["data_source"], row["extra_info"]) == "math"
    assert p.work_lines == ["23+7=30", "30-5=25"]


def test_demonstration_kinds_and_the_choice_token():
    p = Problem(start=23, steps=(("+", 7), ("-", 5)), split="sft")
    assert demonstration(p, FULL) == [("23+7=30\n", True), ("3", True), ("0-5=25\nAnswer: 25", True)]
    assert demonstration(p, FULL_UNTAUGHT)[1] == ("3", False)
    assert demonstration(p, EARLY) == [("23+7=30\nAnswer: 30", True)]
    one = Problem(start=40, steps=(("-", 3),), split="sft")
    assert demonstration(one, EARLY) == demonstration(one, FULL) == [("40-3=37\nAnswer: 37", True)]
    with pytest.raises(ValueError, match="unknown demonstration kind"):
        demonstration(p, "sometimes")


@pytest.mark.parametrize("mix, early, taught", [(0.0, 0, 100), (0.3, 30, 70), (0.7, 50, 21)])
def test_plan_kinds_mix_applies_to_multi_step_problems(mix, early, taught):
    problems = [Problem(start=50, steps=(("+", 2),) * (1 + i % 2), split="sft") for i in range(200)]
    kinds = plan_kinds(problems, mix, seed=0)
    assert all(k == FULL for p, k in zip(problems, kinds, strict=True) if len(p.steps) == 1)
    multi = [k for p, k in zip(problems, kinds, strict=True) if len(p.steps) > 1]
    assert (multi.count(EARLY), multi.count(FULL)) == (early, taught)
    assert multi.count(FULL_UNTAUGHT) == 100 - early - taught


def test_problems_round_trip_and_malformed_lines_are_located(tmp_path):
    problems = generate_problems(SIZES, seed=2)
    path = tmp_path / "problems.jsonl"
    write_problems(problems, path)
    assert read_problems(path) == problems
    assert json.loads(path.read_text().splitlines()[0])["answer"] == problems[0].answer
    path.write_text('{"start": 10, "steps": [["+", 2]], "split": "val"}\n{"start": 10}\n')
    with pytest.raises(ValueError, match=r"problems.jsonl: line 2: not a problem record \(KeyError"):
        read_problems(path)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("math_run")
    tiny = {"hidden_size": 32, "num_layers": 1, "vocab_size": 300, "sft_steps": 3, "sft_batch_size": 4}
    cfg = MathPrepareConfig(sizes={"sft": 40, "train": 12, "val": 8}, **tiny)
    return run_dir, cfg, prepare_math(run_dir, cfg, show_progress=False)


def test_prepare_writes_task_model_and_record(prepared):
    from transformers import AutoTokenizer

    from sorl_verl.quickstart.sft import tokenize_trajectory

    run_dir, cfg, info = prepared
    assert info["problems"] == {"sft": 40, "train": 12, "val": 8}
    problems = read_problems(run_dir / "task" / "problems.jsonl")
    for split in ("train", "val"):
        rows = pd.read_parquet(run_dir / "task" / f"{split}.parquet")
        assert [list(r["ground_truth"]["target"]) for r in rows["reward_model"]] == [
            [str(p.answer)] for p in problems if p.split == split
        ]
        assert set(rows["agent_name"]) == {SINGLE_TURN_AGENT}
    recorded = json.loads((run_dir / "prepare.json").read_text())
    assert recorded["config"]["task"] == "math" and recorded == info
    n_multi = sum(len(p.steps) > 1 for p in problems if p.split == "sft")
    assert info["sft_early_examples"] == round(0.5 * n_multi)  # 0.7 is capped at half (plan_demonstrations)
    assert info["work_accuracy"] == 0.0  # 3 SFT steps of a 1-layer model write no solution right
    # the demonstrations' segments tokenize to the whole text's tokens (the choice token is its own segment)
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "model")
    prompts = [
        tokenizer.apply_chat_template(prompt_messages(p), add_generation_prompt=True, tokenize=False) for p in problems
    ]
    assert info["prompt_tokens_max"] == max(
        len(tokenizer.encode(text, add_special_tokens=False))
        for text, p in zip(prompts, problems, strict=True)
        if p.split == "train"
    )
    for p in problems[:20]:
        segments = demonstration(p, FULL_UNTAUGHT)
        example = tokenize_trajectory(tokenizer, prompt_messages(p), segments)
        whole = tokenizer.encode("".join(t for t, _ in segments), add_special_tokens=False)
        assert example.input_ids[-len(whole) - 1 : -1] == whole
        assert sum(1 - m for m in example.loss_mask[-len(whole) - 1 :]) == (len(p.steps) > 1)


@pytest.mark.parametrize(
    "change", [{"seed": 7}, {"early_answer_fraction": 0.3}, {"max_ops": 2}, {"operand_range": [2, 5]}]
)
def test_prepare_math_refuses_other_settings(prepared, change):
    run_dir, cfg, _ = prepared
    stamp = (run_dir / "prepare.json").read_bytes()
    name = next(iter(change))
    with pytest.raises(PrepareMismatch, match=rf"other settings \({name}: prepared .*, asked"):
        prepare_math(run_dir, dataclasses.replace(cfg, **change), show_progress=False)
    assert (run_dir / "prepare.json").read_bytes() == stamp


def test_a_search_folder_is_not_taken_for_a_math_one(tmp_path):
    (tmp_path / "prepare.json").write_text(json.dumps({"config": dataclasses.asdict(PrepareConfig())}))
    with pytest.raises(
        PrepareMismatch, match=r"early_answer_fraction: prepared '<missing>'.*task: prepared '<missing>', asked 'math'"
    ):
        prepare_math(tmp_path, MathPrepareConfig(), show_progress=False)


def test_cli_math_options_and_a_prepared_folder_is_skipped(prepared, capsys):
    from sorl_verl.quickstart.__main__ import main

    run_dir, cfg, info = prepared
    with pytest.raises(SystemExit, match="--topk: not an option of the math task"):
        main(["prepare", str(run_dir), "--task", "math", "--topk", "2"])
    with pytest.raises(SystemExit, match="--max-ops: not an option of the search task"):
        main(["prepare", str(run_dir), "--max-ops", "2"])
    sizes = ["--n-sft", "40", "--n-train", "12", "--n-val", "8"]
    model = [
        "--hidden-size",
        "32",
        "--num-layers",
        "1",
        "--vocab-size",
        "300",
        "--sft-steps",
        "3",
        "--sft-batch-size",
        "4",
    ]
    stamp = (run_dir / "model" / "model.safetensors").stat().st_mtime_ns
    main(["prepare", str(run_dir), "--task", "math", *sizes, *model, "--quiet"])  # the same settings: skipped
    assert json.loads(capsys.readouterr().out) == info
    assert (run_dir / "model" / "model.safetensors").stat().st_mtime_ns == stamp
    with pytest.raises(SystemExit, match="prepared with other settings \\(max_ops: prepared 3, asked 2\\)"):
        main(["prepare", str(run_dir), "--task", "math", *sizes, *model, "--max-ops", "2", "--quiet"])


def test_config_defaults_match_the_launcher_defaults():
    import re
    from pathlib import Path

    script = (Path(__file__).resolve().parents[2] / "examples" / "quickstart" / "run_math_demo.sh").read_text()
    defaults = dict(re.findall(r'^(\w+)="\$\{\w+:-([^}]+)\}"$', script, re.M))
    cfg = MathPrepareConfig()
    assert (float(defaults["DEMO_MIX"]), int(defaults["MAX_OPS"])) == (cfg.early_answer_fraction, cfg.max_ops)
