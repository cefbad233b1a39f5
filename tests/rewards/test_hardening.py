"""Rewards never raise for any response, ground truth or extra_info (JSON-like values, bytes, numpy),
and the alias / gold matching stays linear: one 1 MB answer against 1000 aliases is one pass."""

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reward_fns
from reward_fns import METRIC_KEYS, REWARDS, compute_score
from reward_fns._text import GoldAliases, SubstringMatcher, gold_targets, normalize_answer, token_f1

json_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_like = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
numpy_values = st.sampled_from(
    [
        np.array("x"),
        np.array(["Paris", "B"]),
        np.array([b"\xff"]),
        np.array([[1, 2], [3, 4]]),
        np.float64("nan"),
        np.int64(34),
        np.array([], dtype=object),
        np.array([None, "C"], dtype=object),
        np.str_("34"),
    ]
)
odd_values = json_like | st.binary(max_size=16) | numpy_values | st.builds(lambda v: {"target": v}, json_like)
odd_values = odd_values | st.builds(lambda v: {"target": v}, st.lists(st.binary(max_size=6), max_size=3) | numpy_values)
texts = st.text(max_size=40) | st.sampled_from(["<answer>B</answer>", "<answer>Paris</answer>", "\\boxed{34}"])


def check(result):
    assert tuple(result) == METRIC_KEYS
    assert all(isinstance(v, float) and math.isfinite(v) for v in result.values())


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(sorted(REWARDS)),
    response=texts | odd_values,
    gold=odd_values,
    info=odd_values | st.builds(lambda c: {"choices": c}, odd_values),
)
def test_rewards_never_raise_on_any_value(name, response, gold, info):
    check(REWARDS[name]("x", response, gold, info))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    source=st.sampled_from(sorted(reward_fns.DATA_SOURCE_FAMILY)),
    response=texts | odd_values,
    gold=odd_values,
    info=st.none() | st.dictionaries(st.sampled_from(["choices", "split", "index"]), odd_values, max_size=2),
)
def test_router_never_raises_for_known_sources(source, response, gold, info):
    check(compute_score(source, response, gold, info))


@pytest.mark.parametrize(
    "gold, expected",
    [
        ({"target": [b"\xff"]}, ["\ufffd"]),
        ({"target": np.array("x")}, ["x"]),
        (np.array("x"), ["x"]),
        ({"target": np.array(["a", "b"])}, ["a", "b"]),
        ({"target": [10**5000]}, []),  # over Python's int -> str digit limit: dropped, not raised
        ({"target": {"a": 1}}, []),
        (3.5, ["3.5"]),
    ],
)
def test_gold_targets_of_odd_ground_truths(gold, expected):
    assert gold_targets(gold) == expected


def test_issue_ground_truths_score_without_raising():
    for name in REWARDS:
        check(REWARDS[name]("nq", "<answer>x</answer>", {"target": [b"\xff"]}))
        result = REWARDS[name]("nq", "<answer>x</answer>", np.array("x"))
        check(result)
        assert result["acc"] == (0.0 if name == "mcqa" else 1.0)  # "x" is not an option letter
    assert compute_score("nq", "<answer>x</answer>", np.array("x"))["score"] == 1.0


def test_router_names_a_mistyped_reward_fn():
    with pytest.raises(ValueError, match=r"extra_info.reward_fn must be a reward name \(a string\), got list"):
        compute_score("nq", "<answer>x</answer>", {"target": ["x"]}, {"reward_fn": ["qa_em"]})


needle_text = st.text(alphabet="ab c", max_size=12)


@settings(max_examples=300, deadline=None)
@given(needles=st.lists(needle_text, max_size=6), text=st.text(alphabet="ab c", max_size=60))
def test_aho_corasick_agrees_with_str_contains(needles, text):
    matcher = SubstringMatcher(needles)
    matcher._SCAN_BUDGET = 0  # force the automaton
    assert matcher.found_in(text) == any(needle in text for needle in needles)


@settings(max_examples=200, deadline=None)
@given(
    golds=st.lists(st.text(alphabet="ab ,.the", max_size=12), max_size=5),
    answer=st.text(alphabet="ab ,.the", max_size=30),
)
def test_gold_aliases_match_search_r1s_per_alias_checks(golds, answer):
    aliases = GoldAliases(golds)
    normalized = normalize_answer(answer)
    assert aliases.exact(normalized) == any(normalize_answer(g) == normalized for g in golds)
    assert aliases.substring(normalized) == any(normalize_answer(g) in normalized for g in golds)
    expected_f1 = max((token_f1(normalized, normalize_answer(g)) for g in golds), default=0.0)
    assert aliases.best_f1(normalized) == pytest.approx(expected_f1)


MB = 1 << 20
ALIASES = {"target": [f"alias number {i} of the answer" for i in range(1000)]}
WORDS = ("paris city light river seine alias number answer " * (MB // 48))[:MB]


@pytest.mark.parametrize(
    "source, text, gold, kwargs",
    [
        ("nq", f"<answer>{WORDS}</answer>", ALIASES, {}),  # was ~20 s (token F1 recounted the answer per alias)
        ("nq", f"<think>t</think><answer>{WORDS}</answer>", ALIASES, {"qa_reward": "qa_em_format"}),
        ("nq", "<answer>" + "x" * MB + "</answer>", {"target": ["x" * 50 + str(i) for i in range(1000)]}, {}),
        ("aime2024", "\\boxed{" + "9" * 999 + "x}", {"target": [str(i) * 3 for i in range(1000)]}, {}),  # was ~10 s
    ],
)
def test_many_aliases_against_a_huge_answer_stay_linear(source, text, gold, kwargs, hang_guard):
    with hang_guard(5):  # ~0.2 s after the fix on 2 busy cores
        check(compute_score(source, text, gold, None, **kwargs))
