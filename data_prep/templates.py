"""Prompt templates, each with where it comes from.

``SEARCH_R1`` is Search-R1's ``make_prefix(template_type="base")`` verbatim (PeterGriffinJin/Search-R1,
``scripts/data_process/nq_search.py``, ``qa_search_train_merge.py``, ``qa_search_test_merge.py``),
including its "as many times as your want" typo and the trailing newline; the question is stripped and
gets a ``?`` when it does not end with one (``process_fn`` there).

``MEDICAL`` is our adaptation of it for MIRAGE's multiple-choice sets: the same search protocol, options
rendered as ``A. text`` lines (MedRAG's rendering), the answer asked for as the option letter, and an
example letter instead of ``Beijing``. MIRAGE itself prompts without a search protocol.

``DAPO_MATH`` is the user message of BytedTsinghua-SIA/DAPO-Math-17k as published (its header, the
problem, its footer); we render AIME-2024 problems with it too so both math sets read the same.
"""

from __future__ import annotations

SEARCH_R1 = (
    "Answer the given question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query </search> "
    "and it will return the top searched results between <information> and </information>. "
    "You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the answer inside <answer> and "
    "</answer>, without detailed illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"
)

MEDICAL = (
    "Answer the given multiple-choice question. "
    "You must conduct reasoning inside <think> and </think> first every time you get new information. "
    "After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query </search> "
    "and it will return the top searched results between <information> and </information>. "
    "You can search as many times as your want. "
    "If you find no further external knowledge needed, you can directly provide the letter of the correct option "
    "inside <answer> and </answer>, without detailed illustrations. For example, <answer> C </answer>. "
    "Question: {question}\nOptions:\n{options}\n"
)

DAPO_MATH_HEADER = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem."
)
DAPO_MATH_FOOTER = 'Remember to put your answer on its own line after "Answer:".'
DAPO_MATH = DAPO_MATH_HEADER + "\n\n{problem}\n\n" + DAPO_MATH_FOOTER


def search_r1_question(question: str) -> str:
    """Search-R1's question clean-up: strip, then append ``?`` unless it already ends with one."""
    question = question.strip()
    return question if question.endswith("?") else question + "?"


def render_search_r1(question: str) -> str:
    return SEARCH_R1.format(question=search_r1_question(question))


def render_options(choices: list[str]) -> str:
    """``A. first``, ``B. second``, ... one per line."""
    return "\n".join(f"{chr(ord('A') + i)}. {choice}" for i, choice in enumerate(choices))


def parse_options_block(content: str) -> list[str] | None:
    """The option texts of the last ``Options:`` block of a prompt (``A. text`` lines, letters in order
    from A), or None when there is no such block: the inverse of :func:`render_options`."""
    head, sep, block = content.rpartition("Options:\n")
    if not sep:
        return None
    choices = []
    for line in block.split("\n"):
        expected = f"{chr(ord('A') + len(choices))}. "
        if not line.startswith(expected):
            break
        choices.append(line[len(expected) :])
    return choices or None


def options_block_error(choices: list[str]) -> tuple[int, str] | None:
    """``(index, why)`` of the first option that cannot be shown as an ``A. text`` line that reads back
    as itself (an empty text, a line break in it), or None: the multiple-choice reward reads the options
    the prompt shows, so a block that does not parse back would score answers against other texts."""
    for i, choice in enumerate(choices):
        if not choice.strip():
            return i, "empty option text"
        if "\n" in choice or "\r" in choice:
            return i, "option text holds a line break (the options block has one line per option)"
    if parse_options_block("Options:\n" + render_options(choices) + "\n") != list(choices):
        return len(choices) - 1, "the options block does not parse back to the options"
    return None


def render_medical(question: str, choices: list[str]) -> str:
    return MEDICAL.format(question=question.strip(), options=render_options(choices))


def render_dapo_math(problem: str) -> str:
    return DAPO_MATH.format(problem=problem.strip())


def dapo_problem(content: str) -> str:
    """The problem inside a DAPO-style user message (the message itself when it has another shape)."""
    head, foot = DAPO_MATH_HEADER + "\n\n", "\n\n" + DAPO_MATH_FOOTER
    if content.startswith(head) and content.endswith(foot):
        return content[len(head) : -len(foot)].strip()
    return content.strip()
