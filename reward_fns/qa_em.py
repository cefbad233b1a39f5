"""Search-R1's exact-match reward for open-domain QA, as a verl custom reward.

Source: PeterGriffinJin/Search-R1, ``verl/utils/reward_score/qa_em.py`` (``normalize_answer``,
``em_check``, ``subem_check``, ``compute_score_em``): the answer inside ``<answer>...</answer>`` is
SQuAD-normalized and compared with every gold alias; 1.0 on an exact match, else ``format_score``
when an answer was given, 0.0 when none was.

Differences, each deliberate:
- Search-R1's reward manager decoded prompt + response, and ``extract_solution`` skipped the prompt's
  example ``<answer> Beijing </answer>`` by demanding at least two ``<answer>`` blocks. verl 0.9 hands
  the reward the response only, where that rule would reject every single-answer response. We take the
  last ``<answer>`` block of the response and cut an echoed prompt first (``_text.response_only``),
  so the example never counts either way.
- sub-string EM (Search-R1's ``subem_check``) and SQuAD token F1 (best over aliases) are reported as
  extra metrics; they never change ``score``.

Use: ``reward.custom_reward_function.path=pkg://reward_fns.qa_em`` (``name=compute_score``), or the
router ``pkg://reward_fns`` for the data sources nq, triviaqa, popqa, hotpotqa, 2wikimultihopqa,
musique, bamboogle.
"""

from __future__ import annotations

from reward_fns._text import (
    as_text,
    gold_targets,
    last_tag_content,
    make_result,
    normalize_answer,
    response_only,
    token_f1,
)


def extract_answer(solution_str: str) -> str | None:
    """The last ``<answer>`` block of the response (an echoed prompt removed), or None."""
    return last_tag_content(response_only(solution_str), "answer")


def em_check(prediction: str, golds: list[str]) -> bool:
    """Search-R1's ``em_check``: normalized prediction equals some normalized gold alias."""
    normalized = normalize_answer(prediction)
    return any(normalize_answer(gold) == normalized for gold in golds)


def subem_check(prediction: str, golds: list[str]) -> bool:
    """Search-R1's ``subem_check``: some normalized gold alias is a substring of the normalized prediction."""
    normalized = normalize_answer(prediction)
    return any(normalize_answer(gold) in normalized for gold in golds)


def answer_metrics(answer: str | None, golds: list[str]) -> tuple[float, float, float]:
    """(EM, sub-EM, best F1) of an extracted answer; all 0 when there is no answer."""
    if answer is None or not golds:
        return 0.0, 0.0, 0.0
    normalized = normalize_answer(answer)
    f1 = max(token_f1(normalized, normalize_answer(gold)) for gold in golds)
    return float(em_check(answer, golds)), float(subem_check(answer, golds)), f1


def compute_score(
    data_source=None,
    solution_str="",
    ground_truth=None,
    extra_info=None,
    format_score: float = 0.0,
    score: float = 1.0,
) -> dict[str, float]:
    """verl custom reward: ``score`` if the last answer exactly matches a gold alias, ``format_score``
    if an answer was given but is wrong, 0.0 if none was (Search-R1's defaults: score=1, format_score=0).

    ``ground_truth`` is the row's ``reward_model.ground_truth``: ``{"target": [aliases]}``.
    """
    golds = gold_targets(ground_truth)
    answer = extract_answer(as_text(solution_str))
    em, sub_em, f1 = answer_metrics(answer, golds)
    if answer is None:
        reward = 0.0
    else:
        reward = score if em else format_score
    return make_result(reward, acc=em, unparseable=answer is None, sub_em=sub_em, f1=f1)
