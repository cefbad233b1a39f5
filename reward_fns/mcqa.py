"""Multiple-choice reward for the medical sets (MedQA, MedMCQA, PubMedQA*, MMLU-Med), as a verl custom reward.

The benchmark definition is MIRAGE's (Xiong et al., 2024): zero-shot multiple choice, accuracy. How the
answer is read is our choice: the last ``<answer>...</answer>`` block of the response (the agent format
of :mod:`data_prep.templates`), parsed as

1. the letter alone: ``B``, ``(B)``, ``[B]``, ``B.``, ``B:``, ``B)``, a lone ``b``, optionally after
   "Option", "Answer:", "The correct answer is";
2. the text of one option (SQuAD-normalized equality; needs ``extra_info["choices"]``, which our rows
   carry): "a protruding mandible ..." is option text, not the letter A;
3. a letter followed by a mark and text: ``B. text``, ``B: text``, ``B) text``, ``(B) text``.

On the full MIRAGE files 24 of 7,045 questions have a gold option whose text is itself a letter or
repeats another option; for those only the letter is unambiguous.

The letter must be one of the row's options (``A``.. up to ``len(choices)``; A-E when the row has no
choices). 1.0 iff it equals the gold letter. Nothing parsed is 0.0 and counted in ``unparseable``:
there is **no fallback letter** (MedRAG's parser falls back to "A" and inflates accuracy by about a
quarter of the unparsed answers).
"""

from __future__ import annotations

import re
import string

from reward_fns._text import as_text, gold_targets, last_tag_content, make_result, normalize_answer, response_only

# "the correct answer is", "Option", "answer:" ... before the letter.
_PREFIX = re.compile(r"(?:the\s+)?(?:correct\s+)?(?:option|answer|choice)(?:\s+is)?\s*[:\-]?\s*", re.IGNORECASE)
# The letter alone: B, (B), [B], B., B:, B)
_BARE_LETTER = re.compile(r"(?:\((?P<p>[A-Z])\)|\[(?P<b>[A-Z])\]|(?P<l>[A-Z])[.:)]?)")
# The letter then text: "B. text", "B: text", "B) text", "(B) text"; "A recessive..." is not one (no mark).
_LETTER_THEN_TEXT = re.compile(r"(?:\((?P<p>[A-Z])\)|\[(?P<b>[A-Z])\]|(?P<l>[A-Z])[.:)])\s")
_DEFAULT_LETTERS = "ABCDE"
_MAX_ANSWER_CHARS = 4096  # option texts are short; longer "answers" are not parsed as option text
# The letter pattern is anchored at the start; a bounded window keeps its adjacent \s* linear-time.
_LETTER_WINDOW = 128


def option_letters(extra_info) -> str:
    """Valid letters for this row: one per entry of ``extra_info["choices"]``, else A-E."""
    choices = _choices(extra_info)
    if choices:
        return string.ascii_uppercase[: min(len(choices), 26)]
    return _DEFAULT_LETTERS


def _choices(extra_info) -> list[str]:
    try:
        choices = extra_info.get("choices") if extra_info is not None else None
    except AttributeError:
        return []
    if choices is None or isinstance(choices, (str, bytes)):
        return []
    try:
        return [str(choice) for choice in choices]
    except TypeError:
        return []


def _letter(match: re.Match | None) -> str | None:
    return None if match is None else (match.group("p") or match.group("b") or match.group("l"))


def parse_letter(answer: str, letters: str, choices: list[str]) -> str | None:
    """The option letter an answer names, or None. Order, so that each form means one thing:

    1. the letter alone (``B``, ``(B)``, ``B.``; a lone ``b`` too), after an optional "the answer is";
    2. the text of an option (SQuAD-normalized equality), e.g. "a protruding mandible" or "C. diphtheriae";
    3. a letter followed by text (``B. text``, ``B: text``, ``(B) text``).
    """
    text = answer.strip().strip("*").strip("\"'`").strip()
    if not text:
        return None
    window = text[:_LETTER_WINDOW]
    prefix = _PREFIX.match(window)
    rest = window[prefix.end() :] if prefix else window
    if len(text) == 1:
        rest = text.upper()
    if len(text) <= _LETTER_WINDOW:
        letter = _letter(_BARE_LETTER.fullmatch(rest.strip()))
        if letter is not None and letter in letters:
            return letter
    if choices and len(text) <= _MAX_ANSWER_CHARS:
        normalized = normalize_answer(text)
        for letter, choice in zip(letters, choices, strict=False):
            if normalized and normalized == normalize_answer(choice):
                return letter
    letter = _letter(_LETTER_THEN_TEXT.match(rest))
    return letter if letter is not None and letter in letters else None


def compute_score(data_source=None, solution_str="", ground_truth=None, extra_info=None) -> dict[str, float]:
    """verl custom reward: 1.0 iff the last answer names the gold letter (``{"target": ["B"]}``), else 0.0."""
    letters = option_letters(extra_info)
    answer = last_tag_content(response_only(as_text(solution_str)), "answer")
    letter = None if answer is None else parse_letter(answer, letters, _choices(extra_info))
    golds = {gold.strip().upper() for gold in gold_targets(ground_truth)}
    correct = letter is not None and letter in golds
    return make_result(float(correct), acc=float(correct), unparseable=letter is None)
