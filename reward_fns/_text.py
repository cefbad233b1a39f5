"""Text helpers shared by the rewards: answer extraction, SQuAD normalization, gold targets, result dicts.

Everything here is linear in the input length (``str.rfind``, single-pass regexes without nested
quantifiers), because a reward sees whatever a policy writes, including megabytes of garbage, and
must never raise or hang on it.
"""

from __future__ import annotations

import re
import string
from collections import Counter, deque
from collections.abc import Iterable, Mapping, Sequence

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

_PUNCTUATION_TABLE = str.maketrans("", "", string.punctuation)
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
    text = text.lower().translate(_PUNCTUATION_TABLE)
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


def _scalar_text(value) -> str | None:
    """One gold answer as text, or None when it cannot be one (never raises)."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, str):
        return value
    try:
        return str(value)
    except Exception:  # e.g. an int over Python's 4300-digit str() limit, or a broken __str__
        return None


def _plain(value):
    """numpy arrays and scalars as Python lists and scalars (a 0-d array cannot be iterated)."""
    tolist = getattr(value, "tolist", None)
    if tolist is not None and not isinstance(value, (str, bytes)):
        try:
            return tolist()
        except Exception:
            return value
    return value


def gold_targets(ground_truth) -> list[str]:
    """The gold answers as a list of strings; never raises.

    Accepts our row format ``{"target": [...]}`` (after a parquet round trip the list may be a numpy
    array), a bare list, or a bare string (DAPO-Math-17k's published ``ground_truth``). Bytes are
    decoded as UTF-8 with replacement; anything that is not text, a number or a list of them is
    rendered with ``str`` (it then matches nothing a model writes) or dropped.
    """
    try:
        if isinstance(ground_truth, Mapping):
            ground_truth = ground_truth.get("target", ())
    except Exception:
        return []
    ground_truth = _plain(ground_truth)
    if ground_truth is None:
        return []
    if isinstance(ground_truth, (str, bytes, int, float)):
        ground_truth = [ground_truth]
    if isinstance(ground_truth, Mapping) or not isinstance(ground_truth, Iterable):
        return []
    golds = []
    try:
        for gold in ground_truth:
            text = _scalar_text(_plain(gold))
            if text is not None:
                golds.append(text)
    except Exception:  # an iterable that fails while iterating
        pass
    return golds


def as_text(solution_str) -> str:
    """Model output as ``str``; verl passes a decoded string, but never raise on anything else."""
    if isinstance(solution_str, str):
        return solution_str
    return _scalar_text(_plain(solution_str)) or ""


class SubstringMatcher:
    """Whether any of ``needles`` occurs in a text, in time linear in the text plus the needles.

    Small cases (text length x needle count up to :data:`_SCAN_BUDGET`) use ``str.__contains__``
    (C speed); larger ones an Aho-Corasick automaton, built once per matcher, so one 1 MB answer
    against 1000 aliases costs one pass over the answer, not a thousand.
    """

    _SCAN_BUDGET = 1 << 20

    def __init__(self, needles: Sequence[str]):
        self.needles = list(dict.fromkeys(needles))
        self._has_empty = "" in self.needles
        self._automaton = None

    def found_in(self, text: str) -> bool:
        if not self.needles:
            return False
        if self._has_empty:
            return True  # "" is a substring of every text, as in Search-R1's ``subem_check``
        if len(text) * len(self.needles) <= self._SCAN_BUDGET:
            return any(needle in text for needle in self.needles)
        if self._automaton is None:
            self._automaton = _build_automaton(self.needles)
        goto, fail, out = self._automaton
        state = 0
        for char in text:
            while state and char not in goto[state]:
                state = fail[state]
            state = goto[state].get(char, 0)
            if out[state]:
                return True
        return False


def _build_automaton(needles: Sequence[str]) -> tuple[list[dict], list[int], list[bool]]:
    """Aho-Corasick: trie transitions, failure links, and whether a needle ends at each state."""
    goto: list[dict] = [{}]
    out = [False]
    for needle in needles:
        state = 0
        for char in needle:
            nxt = goto[state].get(char)
            if nxt is None:
                goto.append({})
                out.append(False)
                nxt = goto[state][char] = len(goto) - 1
            state = nxt
        out[state] = True
    fail = [0] * len(goto)
    queue = deque(goto[0].values())
    while queue:
        state = queue.popleft()
        for char, child in goto[state].items():
            queue.append(child)
            link = fail[state]
            while link and char not in goto[link]:
                link = fail[link]
            fail[child] = goto[link].get(char, 0)
            out[child] = out[child] or out[fail[child]]
    return goto, fail, out


class GoldAliases:
    """Gold aliases SQuAD-normalized once, scored against a normalized prediction in linear time.

    ``exact`` is Search-R1's ``em_check``, ``substring`` its ``subem_check``, ``best_f1`` the
    best SQuAD token F1 over the aliases; each costs the prediction's length plus the aliases'
    total length (the prediction's token counts are computed once, not once per alias).
    """

    def __init__(self, golds: Iterable[str]):
        self.normalized = [normalize_answer(gold) for gold in golds]
        self._exact = frozenset(self.normalized)
        self._tokens = [Counter(gold.split()) for gold in self.normalized]
        self._substrings = SubstringMatcher(self.normalized)

    def __len__(self) -> int:
        return len(self.normalized)

    def exact(self, prediction: str) -> bool:
        return prediction in self._exact

    def substring(self, text: str) -> bool:
        return self._substrings.found_in(text)

    def best_f1(self, prediction: str) -> float:
        if not self.normalized:
            return 0.0
        predicted = Counter(prediction.split())
        predicted_total = sum(predicted.values())
        best = 0.0
        for gold in self._tokens:
            gold_total = sum(gold.values())
            if not predicted_total or not gold_total:
                best = max(best, float(predicted_total == gold_total))
                continue
            overlap = sum(min(count, predicted.get(token, 0)) for token, count in gold.items())
            if overlap:
                precision, recall = overlap / predicted_total, overlap / gold_total
                best = max(best, 2 * precision * recall / (precision + recall))
        return best


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
