"""Multiple-choice (mcqa) and math rewards."""

import pytest

from data_prep.templates import render_dapo_math, render_medical
from reward_fns import math as math_reward
from reward_fns import mcqa

CHOICES = [
    "a protruding mandible due to reactivation of the condylar cartilage by acromegaly.",
    "a recessive maxilla due to failure of elongation of the cranial base.",
    "an enlarged frontal bone due to hydrocephaly.",
    "defective development of the maxillary air sinus.",
]
INFO = {"choices": CHOICES}
GOLD_B = {"target": ["B"]}


@pytest.mark.parametrize(
    "answer",
    [
        "B",
        " b ",
        "(B)",
        "[B]",
        "B.",
        "B)",
        "B: a recessive maxilla",
        "B. a recessive maxilla due to failure of elongation of the cranial base.",
        "**B**",
        "Option B",
        "The answer is B",
        "answer: (B)",
        "A recessive maxilla due to failure of elongation of the cranial base",  # the option text itself
    ],
)
def test_accepted_forms_of_the_gold_letter(answer):
    result = mcqa.compute_score("medqa", f"<think>...</think><answer>{answer}</answer>", GOLD_B, INFO)
    assert result["score"] == 1.0 and result["unparseable"] == 0.0, answer


def test_option_text_starting_with_an_article_is_not_letter_a():
    # "a protruding mandible..." is option A's text; "an enlarged frontal bone..." must map to C, not to "A".
    assert mcqa.compute_score("medqa", f"<answer>{CHOICES[2]}</answer>", {"target": ["C"]}, INFO)["score"] == 1.0
    assert mcqa.parse_letter("a recessive maxilla", "ABCD", []) is None  # no choices: an article, not a letter


@pytest.mark.parametrize("answer", ["", "I am not sure", "E", "Bone marrow", "AB", "the first one"])
def test_unparseable_is_zero_and_counted_with_no_fallback_letter(answer):
    for gold in "ABCD":  # a fallback to any letter would score 1 for one of these golds
        result = mcqa.compute_score("medqa", f"<answer>{answer}</answer>", {"target": [gold]}, INFO)
        assert result["score"] == 0.0 and result["unparseable"] == 1.0, (answer, gold)


def test_missing_answer_tag_and_wrong_letter():
    assert mcqa.compute_score("medqa", "B", GOLD_B, INFO)["unparseable"] == 1.0
    wrong = mcqa.compute_score("medqa", "<answer>C</answer>", GOLD_B, INFO)
    assert wrong["score"] == 0.0 and wrong["unparseable"] == 0.0


def test_letters_limited_to_the_rows_options():
    three = {"choices": ["yes", "no", "maybe"]}  # PubMedQA*
    assert mcqa.compute_score("pubmedqa", "<answer>maybe</answer>", {"target": ["C"]}, three)["score"] == 1.0
    assert mcqa.compute_score("pubmedqa", "<answer>D</answer>", {"target": ["D"]}, three)["unparseable"] == 1.0
    assert mcqa.compute_score("medqa", "<answer>E</answer>", {"target": ["E"]}, None)["score"] == 1.0  # A-E default


def test_medical_prompt_example_never_counts():
    prompt = render_medical("Which bone?", ["Femur", "Tibia", "Fibula", "Ulna"])
    assert "<answer> C </answer>" in prompt
    result = mcqa.compute_score("medqa", prompt + "<think>hmm</think>", {"target": ["C"]}, {"choices": ["a"] * 4})
    assert result["score"] == 0.0 and result["unparseable"] == 1.0
    assert mcqa.compute_score("medqa", prompt + "<answer>D</answer>", {"target": ["D"]})["score"] == 1.0


@pytest.mark.parametrize(
    "response, gold",
    [
        ("so the result is \\boxed{55}.", "55"),
        ("\\boxed{\\frac{1}{2}}", "0.5"),
        ("\\boxed{\\dfrac12}", "1/2"),
        ("$\\boxed{-\\frac{3}{4}}$", "-0.75"),
        ("\\boxed{1,000}", "1000"),
        ("\\boxed{x = 5}", "5"),
        ("\\boxed{\\text{5 }}", "5"),
        ("\\boxed{45^\\circ}", "45"),
        ("\\boxed{\\left(2\\right)}", "(2)"),
        ("\\boxed{{\\frac{1}{3}}}", "\\frac{1}{3}"),
        ("work...\nAnswer: 34", "34"),  # DAPO's requested format
        ("Answer: 3\nthen more text\nAnswer: $-3$", "-3"),
        ("<think>..</think><answer>401</answer>", "401"),
        ("<answer>the value is \\boxed{19}</answer>", "19"),
        ("\\boxed{7} but finally \\boxed{8}", "8"),
        ("\\boxed 9", "9"),
    ],
)
def test_math_equivalent_answers(response, gold):
    assert math_reward.compute_score("aime2024", response, {"target": [gold]})["score"] == 1.0, response


@pytest.mark.parametrize(
    "response, gold",
    [
        ("\\boxed{56}", "55"),
        ("\\boxed{\\sqrt{8}}", "2\\sqrt{2}"),  # not a CAS: documented limitation
        ("\\boxed{7} but finally \\boxed{8}", "7"),
        ("\\boxed{1/0}", "1"),
    ],
)
def test_math_wrong_answers(response, gold):
    result = math_reward.compute_score("aime2024", response, {"target": [gold]})
    assert result["score"] == 0.0 and result["unparseable"] == 0.0


def test_math_unparseable_and_dapo_string_ground_truth():
    assert math_reward.compute_score("dapo_math", "I give up", "34")["unparseable"] == 1.0
    assert math_reward.compute_score("dapo_math", "\\boxed{", "34")["unparseable"] == 1.0
    assert math_reward.compute_score("math_dapo", "Answer: 34", "34")["score"] == 1.0  # DAPO's bare string
    # The DAPO prompt's own "Answer: $Answer" is prompt text; without a response answer nothing parses as 34.
    prompt = render_dapo_math("What is 30 + 4?")
    assert math_reward.compute_score("dapo_math", prompt, "34")["unparseable"] == 1.0
    assert math_reward.compute_score("dapo_math", prompt + "30 + 4 = 34\nAnswer: 34", "34")["score"] == 1.0


def test_options_that_are_letters_themselves():
    # Real MedMCQA/MedQA rows: option texts "a", "c", "bc", "ad" or "B", "C", "D", "E".
    lettered = {"choices": ["a", "c", "bc", "ad"]}
    assert mcqa.compute_score("medmcqa", "<answer>C</answer>", {"target": ["C"]}, lettered)["score"] == 1.0
    assert mcqa.compute_score("medmcqa", "<answer>bc</answer>", {"target": ["C"]}, lettered)["score"] == 1.0
    shifted = {"choices": ["B", "C", "D", "E"]}
    assert mcqa.compute_score("medqa", "<answer>C</answer>", {"target": ["C"]}, shifted)["score"] == 1.0  # letter
    assert mcqa.compute_score("medqa", "<answer>E</answer>", {"target": ["D"]}, shifted)["score"] == 1.0  # text
    species = {"choices": ["C. diphtheriae", "C. tetani", "B. anthracis", "E. coli"]}
    assert mcqa.compute_score("medmcqa", "<answer>C. tetani</answer>", {"target": ["B"]}, species)["score"] == 1.0
    assert mcqa.compute_score("medmcqa", "<answer>D. E. coli</answer>", {"target": ["D"]}, species)["score"] == 1.0
