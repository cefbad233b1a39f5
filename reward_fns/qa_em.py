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
    GoldAliases,
    as_text,
    gold_targets,
    last_tag_content,
    make_result,
    normalize_answer,
    response_only,
)


def extract_answer(solution_str: str) -> str | None:
    """The last ``<answer>`` block of the response (an echoed prompt removed), or None."""
    return last_tag_content(response_only(solution_str), "answer")


def em_check(prediction: str, golds: list[str]) -> bool:
    """Search-R1's ``em_check``: normalized prediction equals some normalized gold alias."""
    return GoldAliases(golds).exact(normalize_answer(prediction))


def subem_check(prediction: str, golds: list[str]) -> bool:
    """Search-R1's ``subem_check``: some normalized gold alias is a substring of the normalized prediction."""
    return GoldAliases(golds).substring(normalize_answer(prediction))


def answer_metrics(answer: str | None, golds: list[str] | GoldAliases) -> tuple[float, float, float]:
    """(EM, sub-EM, best F1) of an extracted answer; all 0 when there is no answer.

    The answer is normalized once and each alias once, so the cost is linear in the answer's
    length plus the aliases' total length.
    """
    aliases = golds if isinstance(golds, GoldAliases) else GoldAliases(golds)
    if answer is None or not len(aliases):
        return 0.0, 0.0, 0.0
    normalized = normalize_answer(answer)
    return float(aliases.exact(normalized)), float(aliases.substring(normalized)), aliases.best_f1(normalized)


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
    answer = extract_answer(as_text(solution_str))
    em, sub_em, f1 = answer_metrics(answer, GoldAliases(gold_targets(ground_truth)))
    if answer is None:
        reward = 0.0
    else:
        reward = score if em else format_score
    return make_result(reward, acc=em, unparseable=answer is None, sub_em=sub_em, f1=f1)
