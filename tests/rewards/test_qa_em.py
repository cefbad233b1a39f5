"""Search-R1 exact match (qa_em) and its format-aware variant (qa_em_format), with Search-R1's known pitfalls."""

import numpy as np
import pytest

from data_prep.templates import render_search_r1
from reward_fns import qa_em, qa_em_format
from reward_fns._text import METRIC_KEYS, normalize_answer

GOLD = {"target": ["Paris", "City of Paris"]}
PROMPT = render_search_r1("what is the capital of france")


def test_normalization_is_squad():
    assert normalize_answer("  The Eiffel-Tower!  ") == "eiffeltower"
    assert normalize_answer("An apple, a day") == "apple day"
    assert normalize_answer("theatre") == "theatre"  # only whole-word articles go


@pytest.mark.parametrize(
    "response, expected",
    [
        ("<think>easy</think><answer> Paris </answer>", 1.0),
        ("<answer>the city of Paris.</answer>", 1.0),  # article, punctuation, second alias
        ("<answer>paris!!</answer>", 1.0),
        ("<answer>Lyon</answer>", 0.0),
        ("<answer>Paris, France</answer>", 0.0),  # exact, not substring
        ("no tags at all: Paris", 0.0),
    ],
)
def test_exact_match(response, expected):
    assert qa_em.compute_score("nq", response, GOLD)["score"] == expected


def test_last_answer_counts_not_the_first():
    assert qa_em.compute_score("nq", "<answer>Paris</answer> hmm <answer>Lyon</answer>", GOLD)["score"] == 0.0
    assert qa_em.compute_score("nq", "<answer>Lyon</answer> no wait <answer>Paris</answer>", GOLD)["score"] == 1.0


def test_prompt_example_beijing_never_counts():
    beijing = {"target": ["Beijing"]}
    assert "<answer> Beijing </answer>" in PROMPT
    # Prompt + response without an answer: the prompt's example must not score (Search-R1's pitfall).
    result = qa_em.compute_score("nq", PROMPT + "<think>I do not know</think>", beijing)
    assert result["score"] == 0.0 and result["unparseable"] == 1.0
    # Prompt + response with an answer: the response's answer is the one scored.
    assert qa_em.compute_score("nq", PROMPT + "<answer>Paris</answer>", GOLD)["score"] == 1.0
    assert qa_em.compute_score("nq", PROMPT + "<answer>Paris</answer>", beijing)["score"] == 0.0
    # Chat-formatted prompt + response, as Search-R1's reward manager decoded it.
    chat = f"<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>assistant\n<answer>Beijing</answer>"
    assert qa_em.compute_score("nq", chat, beijing)["score"] == 1.0


def test_no_answer_and_format_score():
    no_answer = qa_em.compute_score("nq", "<think>...</think>", GOLD, format_score=0.1)
    assert no_answer["score"] == 0.0 and no_answer["unparseable"] == 1.0
    wrong = qa_em.compute_score("nq", "<answer>Lyon</answer>", GOLD, format_score=0.1)
    assert wrong["score"] == pytest.approx(0.1) and wrong["unparseable"] == 0.0


def test_sub_em_and_f1_are_extra_metrics():
    result = qa_em.compute_score("nq", "<answer>Barack Obama Jr</answer>", {"target": ["Barack Obama"]})
    assert result["score"] == 0.0 and result["acc"] == 0.0
    assert result["sub_em"] == 1.0
    assert result["f1"] == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))
    assert set(result) == set(METRIC_KEYS)


def test_ground_truth_after_parquet_round_trip():
    # pandas/pyarrow give numpy arrays for list columns.
    assert qa_em.compute_score("nq", "<answer>Paris</answer>", {"target": np.array(["Paris"])})["score"] == 1.0
    assert qa_em.compute_score("nq", "<answer>Paris</answer>", ["paris"])["score"] == 1.0
    assert qa_em.compute_score("nq", "<answer>Paris</answer>", {"target": []})["score"] == 0.0


WELL_FORMED = (
    "<think>need to look it up</think>\n<search>capital of france</search>\n"
    "<information>Doc 1(Title: France) Paris is the capital of France.</information>\n"
    "<think>it is Paris</think>\n<answer>{answer}</answer>"
)


@pytest.mark.parametrize(
    "response, kwargs, expected",
    [
        (WELL_FORMED.format(answer="Paris"), {}, 1.0),
        ("<answer>Paris</answer>", {}, 0.8),  # correct but no <think>: score - structure_format_score
        (WELL_FORMED.format(answer="Lyon"), {}, 0.2),  # wrong, well formed
        (WELL_FORMED.format(answer="Lyon"), {"retrieval_score": 0.1}, 0.3),  # ... and the gold was retrieved
        ("<think>x</think> stray text <answer>Lyon</answer>", {}, 0.1),  # wrong, malformed
        ("<think>x</think>", {}, 0.0),  # no answer, malformed (incomplete)
        ("<think>x</think><answer>Paris</answer><answer>Paris</answer>", {}, 0.8),  # answer after end: malformed
        (WELL_FORMED.format(answer="Lyon"), {"structure_format_score": 0.0}, 0.0),  # upstream function defaults
    ],
)
def test_format_aware_scores(response, kwargs, expected):
    assert qa_em_format.compute_score("nq", response, GOLD, **kwargs)["score"] == pytest.approx(expected)


def test_format_validity_follows_search_r1_state_machine():
    assert qa_em_format.is_valid_sequence(WELL_FORMED.format(answer="x"))[0]
    assert qa_em_format.is_valid_sequence("<|im_start|>assistant\n" + WELL_FORMED.format(answer="x"))[0]
    assert not qa_em_format.is_valid_sequence("<think>a</think><search>q</search><answer>x</answer>")[0]
    assert not qa_em_format.is_valid_sequence("<think>a<think>b</think></think><answer>x</answer>")[0]
    assert not qa_em_format.is_valid_sequence("<think>a</think><answer>x")[0]
    result = qa_em_format.compute_score("nq", WELL_FORMED.format(answer="Paris"), GOLD)
    assert result["format_ok"] == 1.0 and result["acc"] == 1.0
