"""Text helpers shared by the rewards: answer extraction, SQuAD normalization, gold targets, result dicts.

Everything here is linear in the input length (``str.rfind``, single-pass regexes without nested
quantifiers), because a reward sees whatever a policy writes, including megabytes of garbage, and
must never raise or hang on it.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Mapping

# verl collects ``reward_extra_info`` with the key set of the *first* sample of a batch
# (verl/experimental/reward_loop/reward_loop.py: ``reward_extra_keys = list(infos[0].keys())``),
# so every reward returns exactly these keys; otherwise a run mixing task families fails with a KeyError.
METRIC_KEYS = ("score", "acc", "sub_em", "f1", "unparseable", "format_ok")

# The prompts' own example answers. When a caller passes prompt + response (as Search-R1's reward
# manager did), the text before the end of the last such example is prompt and never counts.
PROMPT_ANSWER_EXAMPLES = (
    "For example, <answer> Beijing </answer>.",  # Search-R1's template (data_prep.templates.SEARCH_R1)
    "For example, <answer> C </answer>.",  # our medical template (data_prep.templates.MEDICAL)
    'Remember to put your answer on its own line after "Answer:".',  # DAPO-Math-17k's prompt footer
)
# Search-R1's qa_em_format.is_valid_sequence reads the text after the first assistant marker.
ASSISTANT_MARKER = "<|im_start|>assistant"

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def response_only(text: str) -> str:
    """Drop an echoed prompt: the text up to the first assistant marker and up to the last prompt example."""
    marker = text.find(ASSISTANT_MARKER)
    if marker != -1:
        text = text[marker + len(ASSISTANT_MARKER) :]
    for example in PROMPT_ANSWER_EXAMPLES:
        at = text.rfind(example)
        if at != -1:
            text = text[at + len(example) :]
    return text


def last_tag_content(text: str, tag: str) -> str | None:
    """Content of the last complete ``<tag>...</tag>``, stripped; None when there is none.

    Our reading: the last closing tag and the nearest opening tag before it. For nested or
    unbalanced tags (``<answer>x <answer>y</answer>``) this returns the innermost ``y``, where
    Search-R1's ``re.finditer(r"<answer>(.*?)</answer>")`` would return ``x <answer>y``.
    """
    close = text.rfind(f"</{tag}>")
    if close == -1:
        return None
    open_ = text.rfind(f"<{tag}>", 0, close)
    if open_ == -1:
        return None
    return text[open_ + len(tag) + 2 : close].strip()


def normalize_answer(text: str) -> str:
    """SQuAD normalization as in Search-R1's qa_em.normalize_answer: lower case, drop ASCII punctuation,
    drop the articles a/an/the, collapse whitespace (same order of operations)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def token_f1(prediction: str, gold: str) -> float:
    """SQuAD token-level F1 between two already normalized strings."""
    pred_tokens, gold_tokens = prediction.split(), gold.split()
    if not pred_tokens or not gold_tokens:
        return float(pred_tokens == gold_tokens)
    common = Counter(pred_tokens) & Counter(gold_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision, recall = overlap / len(pred_tokens), overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def gold_targets(ground_truth) -> list[str]:
    """The gold answers as a list of strings.

    Accepts our row format ``{"target": [...]}`` (after a parquet round trip the list may be a numpy
    array), a bare list, or a bare string (DAPO-Math-17k's published ``ground_truth``).
    """
    if isinstance(ground_truth, Mapping):
        ground_truth = ground_truth.get("target", ())
    if ground_truth is None:
        return []
    if isinstance(ground_truth, (str, bytes, int, float)):
        ground_truth = [ground_truth]
    if not isinstance(ground_truth, Iterable):
        return []
    return [g.decode() if isinstance(g, bytes) else str(g) for g in ground_truth if g is not None]


def as_text(solution_str) -> str:
    """Model output as ``str``; verl passes a decoded string, but never raise on anything else."""
    if isinstance(solution_str, str):
        return solution_str
    if isinstance(solution_str, bytes):
        return solution_str.decode("utf-8", errors="replace")
    return "" if solution_str is None else str(solution_str)


def make_result(
    score: float,
    acc: float,
    unparseable: bool,
    sub_em: float | None = None,
    f1: float | None = None,
    format_ok: bool | None = None,
) -> dict[str, float]:
    """The reward dict verl accepts (``score`` plus extra metrics), always with :data:`METRIC_KEYS`.

    Families without a metric fill it from ``acc`` (``sub_em``, ``f1``) or from whether an answer
    was found (``format_ok``), so averages over a mixed batch stay meaningful.
    """
    return {
        "score": float(score),
        "acc": float(acc),
        "sub_em": float(acc if sub_em is None else sub_em),
        "f1": float(acc if f1 is None else f1),
        "unparseable": float(bool(unparseable)),
        "format_ok": float((not unparseable) if format_ok is None else bool(format_ok)),
    }
