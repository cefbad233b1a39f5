"""The quick start's tasks: the interface, and the multi-hop and medical generators.

What the generators must guarantee (each checked below through the real BM25 index of a small
generated task): questions answerable only by searching, hops really chained (each query names
what the previous search returned), disjoint facts across the sft / train / val splits, and for
the medical task gold letters balanced over the options.
"""

from __future__ import annotations

import re
import string
import subprocess
import sys
from collections import Counter
from dataclasses import replace

import pandas as pd
import pytest

from data_prep.templates import options_block_error, parse_options_block
from reward_fns import compute_score
from sorl_verl.quickstart.task import GUESS, SEARCH, SEARCH_UNTAUGHT_CHOICE, SPLITS
from sorl_verl.quickstart.tasks import UnknownTask, get_task, medical, multihop, multihop_long, task_names
from sorl_verl.quickstart.tasks import _search_loop as loop

SIZES = {"sft": 60, "train": 40, "val": 40}


def test_every_task_is_found_by_its_module_name():
    assert task_names() == ("math", "medical", "multihop", "multihop_long", "search")
    for name in task_names():
        task = get_task(name)
        assert task.name == name and task.launcher_path.is_file()
        assert hasattr(task.config(), task.demo_mix)
    with pytest.raises(
        UnknownTask, match="unknown task 'nope'; choose one of: math, medical, multihop, multihop_long, search"
    ):
        get_task("nope")


def test_unknown_task_exits_2_naming_the_choices():
    for command in (["defaults", "nope"], ["launcher", "nope"], ["prepare", "/tmp/x", "--task", "nope"]):
        done = subprocess.run(
            [sys.executable, "-m", "sorl_verl.quickstart", *command], capture_output=True, text=True, check=False
        )
        assert done.returncode == 2, command
        assert "unknown task 'nope'; choose one of: math, medical, multihop, multihop_long, search" in done.stderr


def test_defaults_are_shell_lines_that_keep_a_set_variable():
    done = subprocess.run(
        [sys.executable, "-m", "sorl_verl.quickstart", "defaults", "multihop"],
        capture_output=True,
        text=True,
        check=True,
    )
    script = done.stdout + 'echo "$MAX_TURNS $TOPK"'
    assert subprocess.run(["bash", "-c", script], capture_output=True, text=True).stdout.strip() == "4 1"
    kept = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env={"MAX_TURNS": "9"})
    assert kept.stdout.strip() == "9 1"


def test_an_option_of_another_task_is_refused():
    from sorl_verl.quickstart.__main__ import main

    with pytest.raises(SystemExit, match="--max-ops: not an option of the multihop task"):
        main(["prepare", "/tmp/unused", "--task", "multihop", "--max-ops", "2"])


# ---------------------------------------------------------------- generated tasks, through the index


@pytest.fixture(scope="module", params=["multihop", "multihop_long", "medical"])
def built(request, tmp_path_factory):
    """A small task of each kind: items, corpus and BM25 index (no Wikipedia: faster, same checks)."""
    task = get_task(request.param)
    spec = {"multihop": multihop.SPEC, "multihop_long": multihop_long.SPEC, "medical": medical.SPEC}[request.param]
    cfg = replace(task.config(), sizes=SIZES, include_wiki=False, seed=3)
    task_dir = tmp_path_factory.mktemp(request.param)
    items = loop.build_task(spec, task_dir, cfg)
    return request.param, spec, items, task_dir


def test_splits_have_the_sizes_and_disjoint_facts(built):
    name, spec, items, task_dir = built
    assert Counter(i.split for i in items) == SIZES
    entities = {}
    for item in items:
        names = item.entities if name.startswith("multihop") else (item.finding, item.condition)
        for entity in names:
            entities.setdefault(entity, set()).add(item.split)
    assert all(len(splits) == 1 for splits in entities.values())  # no entity (so no fact) in two splits
    for split in ("train", "val"):
        rows = pd.read_parquet(task_dir / f"{split}.parquet")
        assert len(rows) == SIZES[split]
        assert set(rows["agent_name"]) == {"search_r1"}


def test_questions_are_answerable_only_by_searching(built):
    name, spec, items, task_dir = built
    sft_text = " ".join(text for i in items if i.split == "sft" for text, _ in spec.demonstration(i, [""] * 5, SEARCH))
    for item in (i for i in items if i.split == "val"):
        answer = item.answer if name.startswith("multihop") else item.drug
        assert answer not in item.question  # the question does not give it away
        # the fact that decides it is in no demonstration the warm start learns from
        decisive = item.facts[item.hops - 1] if name.startswith("multihop") else item.hops[-1]
        assert f"{decisive[0]} {decisive[1]}" not in sft_text
    if name == "medical":  # every option recurs across questions: none is given away by being new
        seen = Counter(d for c in items for d in c.options)
        assert min(seen.values()) >= 2


def test_hops_are_chained_through_the_index(built):
    name, spec, items, task_dir = built
    observations = loop.observations(spec, items, task_dir / "index", topk=1)
    chained = 0
    for item, obs in zip(items, observations, strict=True):
        queries = spec.queries(item)
        assert len(obs) == len(queries) == (item.hops if name.startswith("multihop") else item.facts)
        for k, (query, seen) in enumerate(zip(queries, obs, strict=True)):
            entity = query.rsplit(" ", 1)[0]
            assert f'(Title: "{entity}")' in seen  # the search finds the entity's own document
            if k + 1 < len(queries):  # ... whose value is the next query's entity
                following = queries[k + 1].rsplit(" ", 1)[0]
                assert seen.rstrip().endswith(f"{following}.</information>")
                assert following not in item.question  # known only from the search
                chained += 1
        answer = item.answer if name.startswith("multihop") else item.drug
        assert f"{answer}." in obs[-1]  # the last search returns the answer
    assert chained >= len(items) // 3


def test_multihop_demonstrations_have_a_turn_per_hop_and_score_right(built):
    name, spec, items, task_dir = built
    if not name.startswith("multihop"):
        pytest.skip("multi-hop only")
    assert Counter(i.hops for i in items).keys() == ({2, 3} if name == "multihop" else {4, 5})
    observations = loop.observations(spec, items, task_dir / "index", topk=1)
    rows = pd.read_parquet(task_dir / "val.parquet")
    by_id = {r["extra_info"]["source_id"]: r for _, r in rows.iterrows()}
    for item, obs in zip(items, observations, strict=True):
        full = spec.demonstration(item, obs, SEARCH)
        text = "".join(t for t, _ in full)
        assert text.count("<think>") == item.hops + 1  # one model turn per hop, then the answer
        assert text.count("<search>") == item.hops
        early = "".join(t for t, _ in spec.demonstration(item, obs, GUESS))
        assert early.count("<think>") == 2 and early.endswith(f"<answer> {item.entities[1]} </answer>")
        untaught = spec.demonstration(item, obs, SEARCH_UNTAUGHT_CHOICE)
        assert [t for t, train in untaught if not train] == [
            obs[0],
            "<search>",
            *obs[1:],
        ]  # only the choice is untaught
        row = by_id.get(f"mh-{item.chain_id}")
        if row is not None:
            truth = row["reward_model"]["ground_truth"]
            assert compute_score(row["data_source"], text, truth, row["extra_info"])["score"] == 1.0
            assert compute_score(row["data_source"], early, truth, row["extra_info"])["score"] == 0.0
    # the real recipe's multi-hop data sources: HotpotQA for 2 hops, MuSiQue (composed) for more
    sources = {"hotpotqa": {2}, "musique": {3}} if name == "multihop" else {"musique": {4, 5}}
    assert set(rows["data_source"]) == set(sources)
    for source, hops in sources.items():
        subjects = set(rows[rows["data_source"] == source]["extra_info"].map(lambda e: e["subject"]))
        assert subjects == {f"{h}-hop" for h in hops}


def test_medical_letters_are_balanced_and_the_reward_reads_the_letter(built):
    name, spec, items, task_dir = built
    if name != "medical":
        pytest.skip("medical only")
    for split in SPLITS:
        counts = Counter(c.letter for c in items if c.split == split)
        assert set(counts) == set("ABCD") and max(counts.values()) - min(counts.values()) <= 1
    observations = loop.observations(spec, items, task_dir / "index", topk=1)
    rows = pd.read_parquet(task_dir / "val.parquet")
    by_id = {r["extra_info"]["source_id"]: r for _, r in rows.iterrows()}
    for case, obs in zip(items, observations, strict=True):
        assert len(case.options) == medical.N_OPTIONS == len(set(case.options))
        row = by_id.get(f"med-{case.case_id}")
        if row is None:
            continue
        content = row["prompt"][0]["content"]
        assert parse_options_block(content) == list(case.options) == list(row["extra_info"]["choices"])
        truth = row["reward_model"]["ground_truth"]
        assert list(truth["target"]) == [case.letter]
        full = "".join(t for t, _ in spec.demonstration(case, obs, SEARCH))
        guess = "".join(t for t, _ in spec.demonstration(case, obs, GUESS))
        assert full.count("<search>") == case.facts
        assert compute_score(row["data_source"], full, truth, row["extra_info"])["score"] == 1.0
        assert compute_score(row["data_source"], guess, truth, row["extra_info"])["score"] == 0.0


def test_an_unparseable_options_block_is_refused():
    assert options_block_error(["a", "b"]) is None
    assert options_block_error(["a", ""]) == (1, "empty option text")
    assert options_block_error(["a", "two\nlines"])[0] == 1
    case = medical.generate_cases({"sft": 1, "train": 1, "val": 4}, seed=0)[-1]
    with pytest.raises(ValueError, match="does not parse back"):
        medical.case_row(replace(case, options=(case.options[0] + "\nB. x", *case.options[1:])), 0)


def test_medical_data_prep_names_the_file_row_and_field_of_a_bad_option(tmp_path):
    from data_prep._common import DataPrepError
    from data_prep.medical import read_medmcqa

    path = tmp_path / "dev.json"
    path.write_text(
        '{"question": "q1", "opa": "a", "opb": "b\\n\\"", "opc": "c", "opd": "d", "cop": 1}\n'  # MedQA's line-break artifact
        '{"question": "q2", "opa": "a", "opb": " ", "opc": "c", "opd": "d", "cop": 1}\n'
    )
    items = read_medmcqa(path)
    assert next(items)[1] == ["a", 'b "', "c", "d"]  # a line break inside an option becomes a space
    with pytest.raises(DataPrepError, match=re.escape(f"{path}: line 2: field 'opb': empty option text")):
        next(items)


def test_generators_are_deterministic_and_use_made_up_words():
    a = multihop.generate_chains(SIZES, seed=5, reserved_words={"paris"})
    assert a == multihop.generate_chains(SIZES, seed=5, reserved_words={"paris"})
    assert a != multihop.generate_chains(SIZES, seed=6)
    words = multihop.SPEC.words(a)
    assert all(w[0] in string.ascii_uppercase and w.isalpha() for w in words)
    reserved = {w.lower() for w in words[:5]}
    assert not reserved & {w.lower() for w in multihop.SPEC.words(multihop.generate_chains(SIZES, 5, reserved))}
    cases = medical.generate_cases(SIZES, seed=5)
    assert cases == medical.generate_cases(SIZES, seed=5)
    assert Counter(c.facts for c in cases).keys() == {1, 2}
    assert Counter(c.hops for c in a).keys() == {2, 3}


def test_long_chains_ask_four_or_five_hops_in_words_that_tell_which():
    chains = multihop.generate_chains(SIZES, seed=5, hops=multihop_long.HOPS)
    assert Counter(c.hops for c in chains).keys() == {4, 5}
    four, five = (next(c for c in chains if c.hops == h) for h in (4, 5))
    inner = "the birthplace of the founder of the capital of"
    assert four.question == f"Who is the mayor of {inner} {four.entities[0]}?" and four.answer == four.entities[4]
    assert five.question == f"Who is the spouse of the mayor of {inner} {five.entities[0]}?"
    assert five.answer == five.entities[5] and len(five.facts) == len(four.facts) == 5
    for bad in ((1, 2), (6,), ()):
        with pytest.raises(ValueError, match="hops must lie in 2..5"):
            multihop.generate_chains(SIZES, seed=5, hops=bad)


def test_run_demo_refuses_a_task_with_its_own_launcher(tmp_path):
    from sorl_verl.quickstart.tasks import get_task

    script = get_task("search").launcher_path
    for task, message in (
        ("math", "TASK=math has its own launcher"),
        ("nope", "unknown task 'nope'; choose one of: math, medical, multihop, multihop_long, search"),
    ):
        done = subprocess.run(
            ["bash", str(script), "so_grpo", "--out", str(tmp_path / task)],
            capture_output=True,
            text=True,
            env={"PATH": "/usr/bin:/bin", "TASK": task, "PYTHON": sys.executable},
            check=False,
        )
        assert done.returncode == 2 and message in done.stderr, (task, done.stderr[-500:])
