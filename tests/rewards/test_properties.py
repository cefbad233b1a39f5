"""Rewards never raise, always return finite metrics in range, and stay linear on huge adversarial outputs."""

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reward_fns import METRIC_KEYS, compute_score

FAMILIES = [
    ("nq", {"target": ["Paris", "the city of light"]}, None, {}),
    ("hotpotqa", {"target": ["Paris"]}, None, {"qa_reward": "qa_em_format", "retrieval_score": 0.1}),
    ("medqa", {"target": ["B"]}, {"choices": ["yes", "no", "a protruding mandible", "(B)"]}, {}),
    ("pubmedqa", {"target": ["C"]}, None, {}),
    ("aime2024", {"target": ["\\frac{1}{2}"]}, None, {}),
    ("math_dapo", "34", None, {}),
]
FRAGMENTS = [
    "<answer>",
    "</answer>",
    "<think>",
    "</think>",
    "<search>",
    "</search>",
    "<information>",
    "</information>",
    "<|im_start|>assistant",
    "For example, <answer> Beijing </answer>.",
    "\\boxed{",
    "\\boxed",
    "}",
    "{",
    "\\frac{",
    "Answer:",
    "(B)",
    "B.",
    "Paris",
    "the",
    " ",
    "\n",
    "$",
    "1,000",
    "-",
    "0.5",
    "é",
    "北京",
    "\x00",
    "🙂",
]
adversarial = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=8), max_size=60).map("".join)


def check(result):
    assert tuple(result) == METRIC_KEYS
    assert all(isinstance(v, float) and math.isfinite(v) for v in result.values())
    assert -1.0 <= result["score"] <= 1.0
    for key in ("acc", "sub_em", "f1", "unparseable", "format_ok"):
        assert 0.0 <= result[key] <= 1.0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text() | adversarial, family=st.sampled_from(FAMILIES))
def test_never_raises_on_arbitrary_text(text, family):
    data_source, gold, info, kwargs = family
    check(compute_score(data_source, text, gold, info, **kwargs))


@settings(max_examples=50, deadline=None)
@given(gold=st.lists(st.text(max_size=20), max_size=3), text=adversarial)
def test_never_raises_on_odd_ground_truth(gold, text):
    for data_source, _, info, kwargs in FAMILIES:
        check(compute_score(data_source, text, {"target": gold}, info, **kwargs))


@pytest.mark.parametrize("odd", [None, b"<answer>Paris</answer>", 12345, ""])
def test_non_string_solution(odd):
    for data_source, gold, info, kwargs in FAMILIES:
        check(compute_score(data_source, odd, gold, info, **kwargs))


MB = 1 << 20
HUGE = {
    "unclosed answers": "<answer>" * (MB // 8),
    "unclosed information": "<think>x</think><search>q</search>" + "<information>" * (MB // 13),
    "spaces after a prefix": "<answer>answer is" + " " * MB + "x</answer>",
    "deep braces": "\\boxed{" + "{" * MB + "}" * MB + "}",
    "digits": "<answer>" + "1" * MB + "x</answer>",
    "many answers": "<answer>Paris</answer>" * (MB // 22),
    "unicode": "北京🙂é" * (MB // 4),
    "well formed but long": "<think>" + "a " * (MB // 2) + "</think><answer>" + "b" * MB + "</answer>",
    "many fracs": "<answer>" + "\\frac{1}{" * (MB // 9) + "</answer>",
}


@pytest.mark.parametrize("name", sorted(HUGE))
def test_huge_outputs_return(name, hang_guard):
    with hang_guard(20):
        for data_source, gold, info, kwargs in FAMILIES:
            check(compute_score(data_source, HUGE[name], gold, info, **kwargs))
