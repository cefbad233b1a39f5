"""The math quick start's task: generated arithmetic in DAPO-Math's prompt and answer format.

Nothing here is from the SORL paper; it is our design for a single-turn math task that a
~1M-parameter model learns on two CPU cores in minutes, read and scored like the paper's
DAPO-Math-17k setting:

- problems are chains of additions and subtractions, "What is 23 + 7 - 5?": a start in
  ``start_range`` and one to ``max_ops`` one-digit operands (``operand_range``), every running
  value kept in ``value_range`` (defaults 0-29: about 450 one-step facts, which the tiny model
  learns in 1000 SFT steps; with values up to 99 it got 14% of one-step problems right,
  measured). The number of operations is drawn uniformly from 1..max_ops (a draw that repeats
  an earlier problem is redrawn, so a small one-step pool ends up a little under its share);
  Each prompt is DAPO-Math-17k's user message (:data:`data_prep.templates.DAPO_MATH`: its
  header, the problem, its footer asking for ``Answer: $Answer`` on the last line);
- a response shows one short work line per operation, then the answer line::

      23+7=30
      30-5=25
      Answer: 25

  scored by our ``math`` reward (:mod:`reward_fns.math`, which reads the rest of the line
  after the last ``Answer:``), routed to it by ``extra_info.reward_fn``;
- the warm start is partly right by design (``early_answer_fraction``, the launcher's
  ``DEMO_MIX``): in that share of the demonstrated choices a multi-step problem is answered
  right after its first work line, with the first step's result (``23+7=30`` then
  ``Answer: 30``: stopping one step early, a wrong answer). One-step problems are always
  answered right. The choice is one token, the first of the line after the first work line
  (a digit of the running value, or ``Answer``), so the warm start learns it as a coin of
  about that weight on multi-step problems: greedy validation answers multi-step problems
  early (wrong) and one-step problems right, and sampled rollouts finish the work a share
  ``1 - early_answer_fraction`` of the time. RL has one thing to learn that it can learn in
  minutes: *finish the computation before answering*; the warm start's arithmetic is what
  bounds the score it can reach. As in the search quick start (``task.plan_demonstrations``,
  reused here), at least half of the multi-step demonstrations do the whole computation
  (they teach the later steps' arithmetic); above 0.5 only some of them carry a loss on the
  choice token.

Splits are disjoint problems (no (start, operations) pair repeats across ``sft``, ``train`` and
``val``), drawn in the order val, train, sft, so the validation and RL sets have the designed
mix of operation counts even when the one-step pool (about 450 problems at the defaults) runs
low for the SFT set (at the defaults the SFT set is 11% one-step problems, the others 34%).
Distinct problems are not unseen arithmetic: a one-step validation problem is usually the first
line of some multi-step SFT demonstration. Rows follow :data:`data_prep._common.SCHEMA` like ``data_prep.math``'s, with
``agent_name`` = verl's ``single_turn_agent``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from data_prep._common import SINGLE_TURN_AGENT, make_row
from data_prep.templates import render_dapo_math
from sorl_verl.fileio import write_text_atomic
from sorl_verl.quickstart.prepare import WarmStartConfig, build_warm_start, prepare_run
from sorl_verl.quickstart.task import GUESS, SEARCH, SPLITS, plan_demonstrations

DATA_SOURCE = "sorl_quickstart_math"
ABILITY = "math"
REWARD_FN = "math"  # reward_fns.REWARDS name; the router reads it from extra_info.reward_fn
OPS = ("+", "-")

# Kinds of a multi-step demonstration (plan_demonstrations' kinds, read for this task):
# answer after the first step (wrong), do every step and teach the choice, do every step
# without a loss on the choice token.
EARLY, FULL, FULL_UNTAUGHT = "early", "full", "full, choice untaught"
_KIND_OF_PLAN = {GUESS: EARLY, SEARCH: FULL}


@dataclass(frozen=True)
class Problem:
    """``start`` then ``steps`` ``((op, operand), ...)`` applied left to right."""

    start: int
    steps: tuple[tuple[str, int], ...]
    split: str

    @property
    def values(self) -> list[int]:
        """The running value after each step (the last one is the answer)."""
        values, value = [], self.start
        for op, operand in self.steps:
            value = value + operand if op == "+" else value - operand
            values.append(value)
        return values

    @property
    def answer(self) -> int:
        return self.values[-1]

    @property
    def text(self) -> str:
        """The problem statement, e.g. ``What is 23 + 7 - 5?``."""
        return "What is " + " ".join([str(self.start), *(f"{op} {d}" for op, d in self.steps)]) + "?"

    @property
    def work_lines(self) -> list[str]:
        """One line per step, e.g. ``["23+7=30", "30-5=25"]``."""
        lines, value = [], self.start
        for (op, operand), result in zip(self.steps, self.values, strict=True):
            lines.append(f"{value}{op}{operand}={result}")
            value = result
        return lines

    def key(self) -> tuple:
        return (self.start, self.steps)


def _draw(rng: random.Random, max_ops: int, start_range, operand_range, value_range) -> tuple:
    lo, hi = value_range
    start = rng.randint(*start_range)
    steps, value = [], start
    for _ in range(rng.randint(1, max_ops)):
        choices = [
            (op, d)
            for op in OPS
            for d in range(operand_range[0], operand_range[1] + 1)
            if lo <= (value + d if op == "+" else value - d) <= hi
        ]
        if not choices:
            return None
        op, d = rng.choice(choices)
        value = value + d if op == "+" else value - d
        steps.append((op, d))
    return start, tuple(steps)


def generate_problems(
    sizes: dict[str, int],
    seed: int = 0,
    max_ops: int = 2,
    start_range: Sequence[int] = (0, 29),
    operand_range: Sequence[int] = (1, 9),
    value_range: Sequence[int] = (0, 29),
) -> list[Problem]:
    """``sizes[split]`` distinct problems per split, deterministic in ``seed``; listed sft, train, val.

    Drawn in the order val, train, sft (see the module docstring); raises ``ValueError`` when the
    ranges hold too few distinct problems for the sizes asked.
    """
    unknown = set(sizes) - set(SPLITS)
    if unknown or any(int(sizes.get(s, 0)) < 1 for s in SPLITS):
        raise ValueError(f"sizes must give a count >= 1 for each of {SPLITS}, got {sizes}")
    if max_ops < 1:
        raise ValueError(f"max_ops must be >= 1, got {max_ops}")
    for name, (lo, hi) in (
        ("start_range", start_range),
        ("operand_range", operand_range),
        ("value_range", value_range),
    ):
        if lo > hi:
            raise ValueError(f"{name} must be [low, high] with low <= high, got {[lo, hi]}")
    if not (value_range[0] <= start_range[0] and start_range[1] <= value_range[1]):
        raise ValueError(f"start_range {list(start_range)} must lie inside value_range {list(value_range)}")
    rng = random.Random(seed)
    seen: set[tuple] = set()
    by_split: dict[str, list[Problem]] = {}
    total = sum(int(sizes[s]) for s in SPLITS)
    attempts, limit = 0, 200 * total + 1000
    for split in ("val", "train", "sft"):
        drawn: list[Problem] = []
        while len(drawn) < int(sizes[split]):
            attempts += 1
            if attempts > limit:
                raise ValueError(
                    f"could not draw {total} distinct problems (got {len(seen)}) from start_range {list(start_range)}, "
                    f"operand_range {list(operand_range)}, max_ops {max_ops}: ask for fewer or widen the ranges"
                )
            key = _draw(rng, max_ops, start_range, operand_range, value_range)
            if key is None or key in seen:
                continue
            seen.add(key)
            drawn.append(Problem(start=key[0], steps=key[1], split=split))
        by_split[split] = drawn
    return [p for split in SPLITS for p in by_split[split]]


def prompt_messages(problem: Problem) -> list[dict]:
    """The chat prompt: one user message, DAPO-Math-17k's template around the problem."""
    return [{"role": "user", "content": render_dapo_math(problem.text)}]


def answer_line(value: int) -> str:
    return f"Answer: {value}"


def demonstration(problem: Problem, kind: str = FULL) -> list[tuple[str, bool]]:
    """A response as ``(text, trainable)`` segments (:func:`sorl_verl.quickstart.sft.tokenize_trajectory`).

    ``EARLY``: the first work line, then the first step's result as the answer (wrong for a
    multi-step problem). ``FULL``: every work line, then the answer. ``FULL_UNTAUGHT``: as
    ``FULL`` with no loss on the choice token, the first character of the second line (a digit:
    single tokens under the tiny model's pre-tokenizer, so the segments tokenize as the whole
    text). One-step problems have no choice: every kind is their full solution.
    """
    lines = problem.work_lines
    if len(lines) == 1 or kind == EARLY:
        return [(f"{lines[0]}\n{answer_line(problem.values[0])}", True)]
    if kind not in (FULL, FULL_UNTAUGHT):
        raise ValueError(f"unknown demonstration kind {kind!r}; choose {EARLY!r}, {FULL!r} or {FULL_UNTAUGHT!r}")
    rest = "\n".join(lines[1:]) + "\n" + answer_line(problem.answer)
    return [(lines[0] + "\n", True), (rest[0], kind == FULL), (rest[1:], True)]


def plan_kinds(problems: Sequence[Problem], early_answer_fraction: float, seed: int) -> list[str]:
    """Each SFT problem's demonstration kind: ``early_answer_fraction`` of the multi-step choices answer early.

    The multi-step problems' kinds come from :func:`sorl_verl.quickstart.task.plan_demonstrations`
    (a guess there is an early answer here; at least half do every step); one-step problems get ``FULL``.
    """
    multi = [i for i, p in enumerate(problems) if len(p.steps) > 1]
    planned = plan_demonstrations(len(multi), early_answer_fraction, seed)
    kinds = [FULL] * len(problems)
    for i, kind in zip(multi, planned, strict=True):
        kinds[i] = _KIND_OF_PLAN.get(kind, FULL_UNTAUGHT)
    return kinds


def problem_row(problem: Problem, index: int) -> dict:
    """One verl parquet row of :data:`data_prep._common.SCHEMA` (scored by ``reward_fns.math``)."""
    return make_row(
        data_source=DATA_SOURCE,
        agent_name=SINGLE_TURN_AGENT,
        content=prompt_messages(problem)[0]["content"],
        ability=ABILITY,
        targets=[str(problem.answer)],
        split=problem.split,
        index=index,
        question=problem.text,
        source_id=f"{problem.split}-{index}",
        subject=f"{len(problem.steps)}-step",
        reward_fn=REWARD_FN,
    )


def write_problems(problems: Sequence[Problem], path: Path) -> None:
    """One JSON object per line (start, steps, split, answer), written atomically."""
    lines = [json.dumps({**asdict(p), "answer": p.answer}) + "\n" for p in problems]
    write_text_atomic(path, "".join(lines))


def read_problems(path: Path) -> list[Problem]:
    """The problems :func:`write_problems` wrote; a malformed line raises naming the file, line and field."""
    problems = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            problem = Problem(
                start=int(record["start"]),
                steps=tuple((str(op), int(d)) for op, d in record["steps"]),
                split=str(record["split"]),
            )
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}: line {number}: not a problem record ({type(e).__name__}: {e})") from None
        problems.append(problem)
    return problems


@dataclass
class MathPrepareConfig(WarmStartConfig):
    """Settings of the math quick start's steps 1-2 (recorded in ``prepare.json``; a rerun must match).

    ``early_answer_fraction`` and ``max_ops`` must equal ``run_math_demo.sh``'s ``DEMO_MIX`` and
    ``MAX_OPS`` defaults. The model settings are :class:`~sorl_verl.quickstart.prepare.WarmStartConfig`'s
    (a smaller BPE vocabulary: the texts are few and repetitive; digits are single tokens whatever its size).
    """

    vocab_size: int = 512
    task: str = "math"  # tells a math run folder from a search one in prepare.json
    sizes: dict[str, int] = field(default_factory=lambda: {"sft": 2000, "train": 400, "val": 256})
    early_answer_fraction: float = 0.7
    max_ops: int = 3
    start_range: list[int] = field(default_factory=lambda: [0, 29])
    operand_range: list[int] = field(default_factory=lambda: [1, 9])
    value_range: list[int] = field(default_factory=lambda: [0, 29])


def build_task(task_dir: Path, cfg: MathPrepareConfig) -> list[Problem]:
    """``problems.jsonl``, ``train.parquet`` and ``val.parquet`` in ``task_dir``; returns the problems."""
    from data_prep._common import write_parquet_atomic

    task_dir.mkdir(parents=True, exist_ok=True)
    problems = generate_problems(cfg.sizes, cfg.seed, cfg.max_ops, cfg.start_range, cfg.operand_range, cfg.value_range)
    write_problems(problems, task_dir / "problems.jsonl")
    for split in ("train", "val"):
        rows = [problem_row(p, i) for i, p in enumerate(p for p in problems if p.split == split)]
        write_parquet_atomic(rows, task_dir / f"{split}.parquet")
    return problems


WORK_CHECK_PROBLEMS = 100


def build_model(run_dir: Path, problems: list[Problem], cfg: MathPrepareConfig, show_progress: bool = True) -> dict:
    """Tiny model + tokenizer (trained on the task's texts), then the SFT warm start; returns stats.

    ``work_accuracy``: the share of the first :data:`WORK_CHECK_PROBLEMS` RL training problems
    (never in SFT) whose whole solution the warm start writes right once it goes on past the first
    step (teacher-forced, greedy, the choice token not checked;
    :func:`~sorl_verl.quickstart.sft.teacher_forced_exact`): about the ceiling of the training
    reward RL can reach by teaching it to finish the computation.
    """
    from sorl_verl.quickstart.sft import load_causal_lm, teacher_forced_exact, tokenize_trajectory

    sft = [p for p in problems if p.split == "sft"]
    checked = [p for p in problems if p.split == "train"][:WORK_CHECK_PROBLEMS]
    kinds = plan_kinds(sft, cfg.early_answer_fraction, seed=cfg.seed)
    segments = [demonstration(p, kind) for p, kind in zip(sft, kinds, strict=True)]
    texts = [prompt_messages(p)[0]["content"] for p in problems] + ["".join(t for t, _ in s) for s in segments]
    tokenizer = None

    def make_examples(loaded_tokenizer) -> list:
        nonlocal tokenizer
        tokenizer = loaded_tokenizer
        return [tokenize_trajectory(tokenizer, prompt_messages(p), s) for p, s in zip(sft, segments, strict=True)]

    model_dir, stats = build_warm_start(run_dir, cfg, texts, (), make_examples, show_progress)
    model = load_causal_lm(model_dir, cfg.sft_attention)
    full = [tokenize_trajectory(tokenizer, prompt_messages(p), demonstration(p, FULL_UNTAUGHT)) for p in checked]
    return {
        **stats,
        "sft_early_examples": kinds.count(EARLY),
        "sft_full_choice_taught": kinds.count(FULL) - sum(len(p.steps) == 1 for p in sft),
        "prompt_tokens_max": max(e.loss_mask.index(1) for e in full),  # the first trained token ends the prompt
        "work_accuracy": teacher_forced_exact(model, full, tokenizer.pad_token_id),
    }


def prepare_math(run_dir, cfg: MathPrepareConfig | None = None, show_progress: bool = True) -> dict:
    """Steps 1-2 of the math quick start into ``run_dir`` unless ``prepare.json`` says they are done.

    :func:`sorl_verl.quickstart.prepare.prepare_run`'s contract: returns ``prepare.json``'s content;
    raises :class:`~sorl_verl.quickstart.prepare.PrepareMismatch` naming each setting that differs
    when the folder was prepared with others (a search quick-start folder included).
    """
    cfg = cfg or MathPrepareConfig()

    def describe(problems: list[Problem]) -> dict:
        by_steps = {
            split: {
                str(k): sum(p.split == split and len(p.steps) == k for p in problems) for k in range(1, cfg.max_ops + 1)
            }
            for split in SPLITS
        }
        return {"problems": {s: sum(p.split == s for p in problems) for s in SPLITS}, "problems_by_steps": by_steps}

    return prepare_run(run_dir, cfg, build_task, build_model, describe, show_progress)
