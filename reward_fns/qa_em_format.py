"""Search-R1's format-aware exact-match reward, as a verl custom reward.

Source: PeterGriffinJin/Search-R1, ``verl/utils/reward_score/qa_em_format.py`` (``is_valid_sequence``,
``is_retrieval_correct``, ``compute_score_em``). The response is *well formed* when it is a sequence
``<think>..</think>`` (``<search>..</search>`` ``<information>..</information>`` ``<think>..</think>``)*
``<answer>..</answer>`` with only whitespace between blocks and balanced tags. Scores (Search-R1's
table, with their names for the knobs):

============================  ===========================  ==========================================
answer                        well formed                  not well formed
============================  ===========================  ==========================================
exact match                   ``score`` (1.0)              ``score - structure_format_score`` (0.8)
wrong                         ``structure_format_score``   ``final_format_score`` (0.1)
                              (+ ``retrieval_score`` if a
                              gold alias was retrieved)
none                          same as wrong                0.0
============================  ===========================  ==========================================

Defaults: ``structure_format_score=0.2``, ``final_format_score=0.1``, ``retrieval_score=0.0`` are the
values of Search-R1's v0.3 format-reward training scripts (``reward_model.structure_format_score=0.2
reward_model.final_format_score=0.1 reward_model.retrieval_score=0``); the function defaults upstream
are all 0, which reduces it to plain EM. Override through verl's ``reward_kwargs``.

Differences, each deliberate:
- Upstream validates the text after ``<|im_start|>assistant`` and calls a text without it malformed; verl
  hands us the response only, so without the marker the whole text is the response.
- The answer is the last ``<answer>`` block of the response (see :mod:`reward_fns.qa_em`).
- Blocks are found with ``str.find`` instead of lazy regexes, so unbalanced tags in a huge output stay linear,
  and the aliases are normalized once (``_text.GoldAliases``), so many aliases do not multiply the cost.
"""

from __future__ import annotations

import re

from reward_fns._text import (
    ASSISTANT_MARKER,
    GoldAliases,
    as_text,
    gold_targets,
    make_result,
    normalize_answer,
)
from reward_fns.qa_em import answer_metrics, extract_answer

TAGS = ("think", "search", "information", "answer")
_TAG_SPLIT = re.compile(r"(</?(?:think|search|information|answer)>)")
# (state, tag) -> next state: Search-R1's is_valid_sequence state machine.
_TRANSITIONS = {
    ("start", "<think>"): "in_think",
    ("information", "<think>"): "in_think",
    ("in_think", "</think>"): "after_think",
    ("after_think", "<search>"): "in_search",
    ("in_search", "</search>"): "after_search",
    ("after_search", "<information>"): "in_information",
    ("in_information", "</information>"): "information",
    ("after_think", "<answer>"): "in_answer",
    ("in_answer", "</answer>"): "end",
}
_INSIDE_BLOCK = frozenset({"in_think", "in_search", "in_information", "in_answer"})


def _assistant_content(text: str) -> str:
    marker = text.find(ASSISTANT_MARKER)
    return text if marker == -1 else text[marker + len(ASSISTANT_MARKER) :].lstrip()


def is_valid_sequence(text: str) -> tuple[bool, str]:
    """Search-R1's structure check on the response: (well formed, reason)."""
    content = _assistant_content(text)
    for tag in TAGS:
        opening, closing = content.count(f"<{tag}>"), content.count(f"</{tag}>")
        if opening != closing:
            return False, f"Mismatch in {tag} tags: {opening} opening vs {closing} closing tags"
    state = "start"
    for part in _TAG_SPLIT.split(content):
        if not part.strip():
            continue
        if part.startswith("<") and _TAG_SPLIT.fullmatch(part):
            next_state = _TRANSITIONS.get((state, part))
            if next_state is None:
                return False, f"Unexpected tag {part} in state {state}"
            state = next_state
        elif state not in _INSIDE_BLOCK:
            return False, f"Unexpected content between tags (state: {state})"
    if state != "end":
        return False, f"Incomplete sequence, ended in state {state}"
    return True, "Valid sequence format"


def information_blocks(text: str) -> list[str]:
    """Contents of the complete ``<information>...</information>`` blocks, in order."""
    blocks, position = [], 0
    while True:
        start = text.find("<information>", position)
        if start == -1:
            return blocks
        end = text.find("</information>", start)
        if end == -1:
            return blocks
        blocks.append(text[start + len("<information>") : end].strip())
        position = end + len("</information>")


def is_retrieval_correct(text: str, golds: list[str] | GoldAliases) -> bool:
    """Search-R1's ``is_retrieval_correct``: some normalized gold alias occurs in a retrieved block."""
    aliases = golds if isinstance(golds, GoldAliases) else GoldAliases(golds)
    return any(aliases.substring(normalize_answer(block)) for block in information_blocks(text))


def compute_score(
    data_source=None,
    solution_str="",
    ground_truth=None,
    extra_info=None,
    structure_format_score: float = 0.2,
    final_format_score: float = 0.1,
    retrieval_score: float = 0.0,
    score: float = 1.0,
) -> dict[str, float]:
    """verl custom reward: Search-R1's format-aware EM (table in the module docstring)."""
    text = as_text(solution_str)
    golds = GoldAliases(gold_targets(ground_truth))
    well_formed, _ = is_valid_sequence(text)
    retrieved = well_formed and is_retrieval_correct(_assistant_content(text), golds)
    answer = extract_answer(text)
    em, sub_em, f1 = answer_metrics(answer, golds)

    if em:
        reward = score if well_formed else score - structure_format_score
    elif well_formed:
        reward = structure_format_score + (retrieval_score if retrieved else 0.0)
    elif answer is not None:
        reward = final_format_score
    else:
        reward = 0.0
    return make_result(reward, acc=em, unparseable=answer is None, sub_em=sub_em, f1=f1, format_ok=well_formed)
