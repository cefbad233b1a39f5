"""The quick start's embedded task: deterministic, answers only in the corpus, rows scoreable."""

import json
import re
from pathlib import Path

import pytest

from sorl_verl.quickstart.task import (
    RELATIONS,
    SPLITS,
    Fact,
    demonstration,
    fact_documents,
    fact_row,
    generate_facts,
    guess_demonstration,
    made_up_words,
    plan_demonstrations,
    write_facts,
)

SIZES = {"sft": 60, "train": 30, "val": 12}


def read_facts(path: Path) -> list[Fact]:
    """facts.jsonl back into facts (the quick start itself never reads it; tests do)."""
    facts = []
    for line_number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        try:
            facts.append(Fact(**json.loads(line)))
        except (json.JSONDecodeError, TypeError) as e:
            raise ValueError(f"{path}:{line_number}: not a fact row ({e})") from None
    return facts


def test_generation_is_deterministic_and_seed_dependent():
    assert generate_facts(SIZES, seed=3) == generate_facts(SIZES, seed=3)
    assert generate_facts(SIZES, seed=3) != generate_facts(SIZES, seed=4)


def test_splits_sizes_and_disjoint_facts():
    facts = generate_facts(SIZES, seed=0)
    for split in SPLITS:
        assert sum(f.split == split for f in facts) == SIZES[split]
    pairs = [(f.entity.lower(), f.relation) for f in facts]
    assert len(set(pairs)) == len(pairs), "each (entity, relation) fact exists once, in one split"
    assert len({f.doc_id for f in facts}) == len(facts)
    entities = {f.entity.lower() for f in facts}
    assert len(entities) == -(-len(facts) // len(RELATIONS))
    values = {f.value.lower() for f in facts}
    parts = {w.lower() for e in entities for w in e.split()}
    assert not values & parts, "a value must never be part of an entity's name"
    assert {f.relation for f in facts} == {r.name for r in RELATIONS}


def test_reserved_words_never_drawn():
    facts = generate_facts(SIZES, seed=0)
    reserved = {facts[0].entity.split()[0].lower(), facts[1].value.lower()}
    again = generate_facts(SIZES, seed=0, reserved_words=reserved)
    drawn = {w.lower() for w in made_up_words(again)}
    assert not drawn & reserved


def test_answer_is_in_its_document_and_not_in_the_question():
    facts = generate_facts(SIZES, seed=1)
    docs = {d["id"]: d["contents"] for d in fact_documents(facts)}
    for f in facts:
        contents = docs[f.doc_id]
        assert contents.startswith(f'"{f.entity}"\n')
        assert re.search(rf"\b{re.escape(f.value)}\b", contents)
        assert f.value not in f.question
        assert f.entity in f.question and f.entity in f.query


def test_bad_sizes_rejected():
    with pytest.raises(ValueError, match="sizes"):
        generate_facts({"sft": 1, "train": 1}, seed=0)
    with pytest.raises(ValueError, match="sizes"):
        generate_facts({"sft": 1, "train": 1, "val": 0}, seed=0)


def test_facts_round_trip_and_bad_line_named(tmp_path):
    facts = generate_facts(SIZES, seed=0)
    path = tmp_path / "facts.jsonl"
    write_facts(facts, path)
    assert read_facts(path) == facts
    path.write_text(path.read_text() + '{"entity": 1}\n')
    with pytest.raises(ValueError, match=r"facts.jsonl:103"):
        read_facts(path)


def test_bm25_finds_the_fact_document_first(tmp_path):
    from sorl_verl.retrieval import build_index, load_retriever
    from sorl_verl.retrieval.corpus import write_jsonl_atomic

    facts = generate_facts(SIZES, seed=0)
    write_jsonl_atomic(fact_documents(facts), tmp_path / "corpus.jsonl")
    build_index(tmp_path / "corpus.jsonl", tmp_path / "index", show_progress=False)
    hits = load_retriever(tmp_path / "index").search([f.query for f in facts], topk=2)
    assert [h[0]["document"]["id"] for h in hits] == [f.doc_id for f in facts]


def test_row_is_scored_by_the_reward_router_with_qa_em():
    from reward_fns import compute_score

    fact = generate_facts(SIZES, seed=0)[0]
    row = fact_row(fact, 0)
    assert row["agent_name"] == "search_r1"
    assert row["prompt"][0]["role"] == "user" and fact.question in row["prompt"][0]["content"]
    assert row["reward_model"] == {"style": "rule", "ground_truth": {"target": [fact.value]}}
    information = f'\n\n<information>Doc 1(Title: "{fact.entity}") {fact.document_text}\n</information>\n\n'
    response = "".join(text for text, _ in demonstration(fact, information))
    score = compute_score(row["data_source"], response, row["reward_model"]["ground_truth"], row["extra_info"])
    assert score["score"] == 1.0
    wrong = response.replace(f"<answer> {fact.value} </answer>", "<answer> Nowhere </answer>")
    assert (
        compute_score(row["data_source"], wrong, row["reward_model"]["ground_truth"], row["extra_info"])["score"] == 0.0
    )


def test_demonstration_marks_only_the_observation_untrainable():
    fact = generate_facts(SIZES, seed=0)[0]
    segments = demonstration(fact, "\n\n<information>X</information>\n\n")
    assert [trainable for _, trainable in segments] == [True, True, True, False, True]
    assert "".join(t for t, _ in segments[:3]).endswith(f"</think>\n<search> {fact.query} </search>")
    assert segments[4][0].endswith(f"<answer> {fact.value} </answer>")
    # the choice to search untaught: only the <search> tag loses its loss
    untaught = demonstration(fact, "\n\n<information>X</information>\n\n", teach_choice=False)
    assert [t for t, _ in untaught] == [t for t, _ in segments]
    assert [trainable for _, trainable in untaught] == [True, False, True, False, True] and untaught[1][0] == "<search>"


def test_row_has_the_shared_schema_and_keeps_the_quick_start_fields(tmp_path):
    import pyarrow.parquet as pq

    from data_prep._common import SCHEMA, write_parquet_atomic

    facts = generate_facts(SIZES, seed=0)
    rows = [fact_row(f, i) for i, f in enumerate(facts[:5])]
    write_parquet_atomic(rows, tmp_path / "x.parquet")  # raises on any field outside the schema
    table = pq.read_table(tmp_path / "x.parquet")
    assert table.schema.equals(SCHEMA)
    info = table.to_pylist()[0]["extra_info"]
    assert info["subject"] == facts[0].relation and info["source_id"] == facts[0].doc_id
    assert info["reward_fn"] == "qa_em" and info["question"] == facts[0].question


def test_guess_demonstration_answers_the_entity_at_once_and_scores_zero():
    from reward_fns import compute_score

    fact = generate_facts(SIZES, seed=0)[0]
    segments = guess_demonstration(fact)
    assert [trainable for _, trainable in segments] == [True]
    text = segments[0][0]
    assert "<search>" not in text and text.endswith(f"<answer> {fact.entity} </answer>")
    # the same first thought as the searching demonstration: the choice is the next tag
    search_text = demonstration(fact, "")[0][0]
    assert text.split("<answer>")[0] == search_text.split("<search>")[0]
    row = fact_row(fact, 0)
    assert (
        compute_score(row["data_source"], text, row["reward_model"]["ground_truth"], row["extra_info"])["score"] == 0.0
    )


@pytest.mark.parametrize(
    "fraction, guesses, taught, untaught",
    [(0.0, 0, 40, 0), (0.3, 12, 28, 0), (0.5, 20, 20, 0), (0.7, 20, 9, 11), (1.0, 20, 0, 20)],
)
def test_plan_demonstrations_mix(fraction, guesses, taught, untaught):
    kinds = plan_demonstrations(40, fraction, seed=5)
    assert (kinds.count("guess"), kinds.count("search"), kinds.count("search, choice untaught")) == (
        guesses,
        taught,
        untaught,
    )
    # at least half of the demonstrations search; the taught choices guess `fraction` of the time
    assert kinds.count("guess") <= 20
    if guesses + taught:
        assert guesses / (guesses + taught) == pytest.approx(fraction, abs=0.03)
    assert kinds == plan_demonstrations(40, fraction, seed=5)
    if 0 < fraction < 1:
        assert kinds != plan_demonstrations(40, fraction, seed=6)


def test_plan_demonstrations_rejects_a_fraction_outside_0_1():
    with pytest.raises(ValueError, match="guess_fraction"):
        plan_demonstrations(10, 1.5, seed=0)
