"""Final-answer reward for competition math (DAPO-Math-17k, AIME-2024), as a verl custom reward.

Our reading, not a paper's: the final answer is, in this order of preference,
1. the last ``<answer>...</answer>`` block (the agent format), or the last ``\\boxed{...}`` inside it;
2. the last ``\\boxed{...}`` / ``\\fbox{...}`` of the response (braces balanced);
3. the rest of the line after the last ``Answer:`` (DAPO-Math-17k's published prompt asks for
   ``Answer: $Answer`` on the last line).
It is correct when, after a light LaTeX normalization (``$``, ``\\left``/``\\right``, spacing commands,
``\\text{..}``, ``\\dfrac``/``\\tfrac``, ``^\\circ``, ``%``, a leading ``x =``, thousands separators),
the strings are equal or both are numbers (integers, decimals, fractions ``a/b`` or ``\\frac{a}{b}``)
within a relative 1e-9. This is not a CAS: ``\\sqrt{8}`` and ``2\\sqrt{2}`` do not match. Both target
sets have integer answers, for which it is exact. Score 1.0 / 0.0 (DAPO's own verifier uses +1 / -1).
"""

from __future__ import annotations

import re
from fractions import Fraction

from reward_fns._text import as_text, gold_targets, last_tag_content, make_result, response_only

_MAX_ANSWER_CHARS = 1000  # longer "answers" are compared verbatim, never normalized
_REMOVE = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\displaystyle", "^{\\circ}", "^\\circ", "\\%", "%", "\\$")
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mathrm|mathbf|mbox)\{([^{}]*)\}")
_FRAC = re.compile(r"\\frac\{([^{}]*)\}\{([^{}]*)\}")
_FRAC_SHORT = re.compile(r"\\frac(\d)(\d)")
_SQRT_SHORT = re.compile(r"\\sqrt(\w)")
_ASSIGNMENT = re.compile(r"^[A-Za-z](?:_\{?\w+\}?)?=")
_THOUSANDS = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
# Unambiguous (one way to match each string), so a 999-digit non-number fails in linear time.
_DECIMAL = re.compile(r"^-?(?:\d+(?:\.\d*)?|\.\d+)$")
_FRACTION = re.compile(r"^(-?\d+)/(-?\d+)$")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``, or ``\\boxed 5``), braces balanced; None if none."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start == -1:
        return None
    position = start + (len("\\boxed") if text.startswith("\\boxed", start) else len("\\fbox"))
    rest = text[position:]
    if rest.startswith(" "):
        return rest.split("$", 1)[0].strip() or None
    if not rest.startswith("{"):
        return None
    depth = 0
    for offset, char in enumerate(rest):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return rest[1:offset].strip()
    return None


def extract_final_answer(solution_str: str) -> str | None:
    """The final answer of a response (order of preference in the module docstring), or None."""
    text = response_only(solution_str)
    tagged = last_tag_content(text, "answer")
    if tagged is not None:
        boxed = last_boxed(tagged)
        return boxed if boxed is not None else tagged
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    marker = text.rfind("Answer:")
    if marker == -1:
        return None
    line = text[marker + len("Answer:") :].split("\n", 1)[0].strip()
    return line or None


def _wrapped_in_braces(text: str) -> bool:
    """True for ``{...}`` whose first brace closes at the very end (``{a}{b}`` is not wrapped)."""
    if len(text) < 2 or text[0] != "{" or text[-1] != "}":
        return False
    depth = 0
    for char in text[:-1]:
        depth += char == "{"
        depth -= char == "}"
        if depth == 0:
            return False
    return True


def normalize_math(answer: str) -> str:
    """Light LaTeX normalization for string comparison (see the module docstring)."""
    text = answer.strip()
    if len(text) > _MAX_ANSWER_CHARS:
        return text
    text = text.strip("$").strip()
    for token in _REMOVE:
        text = text.replace(token, "")
    text = text.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = _TEXT_WRAPPER.sub(r"\1", text)
    text = _FRAC_SHORT.sub(r"\\frac{\1}{\2}", text)
    text = _SQRT_SHORT.sub(r"\\sqrt{\1}", text)
    text = "".join(text.split())
    while _wrapped_in_braces(text):
        text = text[1:-1]
    text = _ASSIGNMENT.sub("", text)
    text = text.rstrip(".")
    if _THOUSANDS.match(text):
        text = text.replace(",", "")
    text = _FRAC.sub(r"(\1)/(\2)", text)
    simple_fraction = re.fullmatch(r"(-?)\((-?\d+)\)/\((\d+)\)", text)
    if simple_fraction:
        text = f"{simple_fraction.group(1)}{simple_fraction.group(2)}/{simple_fraction.group(3)}"
        text = text.replace("--", "")
    return text


def to_number(normalized: str) -> Fraction | None:
    """An exact number for an integer, decimal or ``a/b`` string; None otherwise."""
    if len(normalized) > _MAX_ANSWER_CHARS:
        return None
    try:
        if _DECIMAL.match(normalized):
            return Fraction(normalized)
        match = _FRACTION.match(normalized)
        if match:
            return Fraction(int(match.group(1)), int(match.group(2)))
    except (ValueError, ZeroDivisionError, OverflowError):
        return None
    return None


class _Normalized:
    """An answer normalized once, with its exact value when it is a number."""

    __slots__ = ("text", "value")

    def __init__(self, answer: str):
        self.text = normalize_math(answer)
        self.value = to_number(self.text)

    def matches(self, other: _Normalized) -> bool:
        if self.text == other.text:
            return True
        if self.value is None or other.value is None:
            return False
        return abs(self.value - other.value) <= Fraction(1, 10**9) * max(1, abs(other.value))


def is_equivalent(answer: str, gold: str) -> bool:
    """Normalized string equality, or numeric equality within a relative 1e-9 of the gold."""
    return _Normalized(answer).matches(_Normalized(gold))


def compute_score(data_source=None, solution_str="", ground_truth=None, extra_info=None) -> dict[str, float]:
    """verl custom reward: 1.0 iff the final answer is equivalent to a gold answer, else 0.0.

    ``ground_truth`` is ``{"target": ["34"]}`` (our rows) or DAPO-Math-17k's bare string ``"34"``.
    The answer is normalized once and each gold once: the cost is linear in their total length.
    """
    answer = extract_final_answer(as_text(solution_str))
    correct = False
    if answer is not None:
        normalized = _Normalized(answer)
        correct = any(normalized.matches(_Normalized(gold)) for gold in gold_targets(ground_truth))
    return make_result(float(correct), acc=float(correct), unparseable=answer is None)
