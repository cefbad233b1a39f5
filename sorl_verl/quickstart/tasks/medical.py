"""Medical multiple-choice QA in miniature: made-up drugs, conditions and findings.

Ours (the paper's medical sets are MedQA, MedMCQA, PubMedQA* and MMLU-Med, as MIRAGE defines them;
this is a made-up knowledge base a ~1M-parameter model learns on two CPU cores). **Nothing here is
a medical claim**: every drug, condition and finding is a made-up word.

Each *case* is a finding, the condition it points to, and the drug that treats the condition, each
fact its own document appended to the embedded Wikipedia corpus:

    finding --cause--> condition --treatment--> drug

- 1-fact question: "Which drug treats Velmo Karis?" (retrieve the condition's treatment);
- 2-fact question: "A patient has Tusa Rembi. Which drug treats the cause?" (retrieve the finding's
  cause, then that condition's treatment).

Options are 4 made-up drug names (:data:`N_OPTIONS`), the correct one at a letter drawn so that the
gold letters are balanced over A-D in every split; the gold answer is the letter, scored by the
``mcqa`` reward, which reads an answer naming an option's text as that option's letter (its rule 2).
The demonstrations answer with the option's text (``<answer> Bateol </answer>``): answering with the
letter needs a lookup from the drug found to the letter before it in the options block, which the
0.6M-parameter warm start did not learn in 1000 SFT steps (held-out copy accuracy 3-14%, nearly every
error a letter), while it copies made-up names from its context well. The prompt is the quick start's
short search instruction with the options block of ``examples/medical``
(:func:`data_prep.templates.render_options`: ``A. text`` lines after ``Options:``). Every entity belongs to one case and cases are split into ``sft``, ``train`` and
``val``, so the facts of the splits are disjoint; a drug name recurs as a distractor in other cases,
so no option is given away by being new.

The warm start leaves RL a decision to learn, as the search quick start does: a share
``guess_fraction`` of the demonstrated choices answer at once with a wrong option instead of
searching. The choice is the first token after the first thought (``<search>`` or ``<answer>``);
a guess scores 0, a search usually 1.
"""

from __future__ import annotations

import math
import random
import string
from dataclasses import dataclass, field

from data_prep._common import make_row
from data_prep.templates import parse_options_block, render_options
from sorl_verl.quickstart.prepare import WarmStartConfig
from sorl_verl.quickstart.task import AGENT_NAME, GUESS, SEARCH, SPLITS, _unique_words
from sorl_verl.quickstart.tasks import SEARCH_LOOP_OPTIONS, QuickstartTask
from sorl_verl.quickstart.tasks import _search_loop as loop

N_OPTIONS = 4
FACTS = (1, 2)
DATA_SOURCE = "sorl_quickstart_medical"
ABILITY = "medical-mcqa"
# The search quick start's instruction (task.INSTRUCTION) for a multiple-choice question; short,
# since it is most of every sequence for a tiny model.
INSTRUCTION = (
    "Answer the multiple-choice question. Think inside <think> </think>. To search, write <search> query </search>; "
    "results come back inside <information> </information>. Give the correct option as <answer> option </answer>."
)


@dataclass(frozen=True)
class Case:
    """One question's facts; ``facts`` (1 or 2) says whether the question names the condition or the finding."""

    finding: str
    condition: str
    drug: str
    options: tuple[str, ...]  # drug names in letter order, ``drug`` among them
    facts: int
    split: str
    case_id: int

    @property
    def letter(self) -> str:
        return string.ascii_uppercase[self.options.index(self.drug)]

    @property
    def question(self) -> str:
        if self.facts == 1:
            return f"Which drug treats {self.condition}?"
        return f"A patient has {self.finding}. Which drug treats the cause?"

    @property
    def hops(self) -> list[tuple[str, str, str]]:
        """``(entity, relation, value)`` of the facts a full demonstration retrieves, in order."""
        treatment = (self.condition, "treatment", self.drug)
        return [treatment] if self.facts == 1 else [(self.finding, "cause", self.condition), treatment]


_DOCUMENT = {
    "cause": "{e} is a finding. Its cause is {v}.",
    "treatment": "{e} is a condition. Its treatment is {v}.",
}


def generate_cases(sizes: dict[str, int], seed: int = 0, reserved_words: set[str] | None = None) -> list[Case]:
    """``sizes[split]`` cases per split (listed sft, train, val; deterministic in ``seed``).

    Findings and conditions are two made-up words (from pools of about ``sqrt(3 * cases)``), drugs
    one made-up word each from a pool of about ``cases / 4`` (so every drug treats several conditions
    and appears as a distractor in many questions). Within each split the gold letters cycle through
    A-D in a shuffled order, so they are balanced (counts differ by at most one).
    """
    if set(sizes) - set(SPLITS) or any(int(sizes.get(s, 0)) < 1 for s in SPLITS):
        raise ValueError(f"sizes must give a count >= 1 for each of {SPLITS}, got {sizes}")
    rng = random.Random(seed)
    taken = set(reserved_words or ())
    total = sum(int(sizes[s]) for s in SPLITS)
    pool = max(4, math.isqrt(3 * total) + 1)
    firsts = _unique_words(rng, pool, (2,), taken)
    seconds = _unique_words(rng, pool, (2,), taken)
    names = [f"{a} {b}" for a, b in rng.sample([(a, b) for a in firsts for b in seconds], 2 * total)]
    drugs = [
        w + "mab" if i % 2 else w + "ol"
        for i, w in enumerate(_unique_words(rng, max(N_OPTIONS + 1, total // 4), (2,), taken))
    ]
    cases, case_id = [], 0
    for split in SPLITS:
        n = int(sizes[split])
        letters = [i % N_OPTIONS for i in range(n)]
        rng.shuffle(letters)
        for position in letters:
            drug = rng.choice(drugs)
            options = rng.sample([d for d in drugs if d != drug], N_OPTIONS - 1)
            options.insert(position, drug)
            finding, condition = names[2 * case_id : 2 * case_id + 2]
            cases.append(Case(finding, condition, drug, tuple(options), rng.choice(FACTS), split, case_id))
            case_id += 1
    return cases


def prompt(case: Case) -> str:
    """The user message: instruction, question, and the options block of ``examples/medical``."""
    return f"{INSTRUCTION}\nQuestion: {case.question}\nOptions:\n{render_options(list(case.options))}\n"


def documents(cases: list[Case]) -> list[dict]:
    """Search-R1 corpus rows, one per fact (a 1-fact case's finding document is written too)."""
    return [
        {"id": f"med-{c.case_id}-{i}", "contents": f'"{e}"\n' + _DOCUMENT[r].format(e=e, v=v)}
        for c in cases
        for i, (e, r, v) in enumerate([(c.finding, "cause", c.condition), (c.condition, "treatment", c.drug)])
    ]


def queries(case: Case) -> list[str]:
    return [f"{e} {r}" for e, r, _ in case.hops]


def wrong_option(case: Case) -> str:
    """A guess: the option after the gold one (deterministic, never right)."""
    return case.options[(case.options.index(case.drug) + 1) % len(case.options)]


def demonstration(case: Case, observations: list[str], kind: str = SEARCH) -> loop.Segments:
    """The trajectory as ``(text, trainable)`` segments after the prompt (observations not trainable).

    ``GUESS`` answers at once with a wrong option; ``SEARCH`` retrieves the facts and answers with the
    drug found (an option's text, which the ``mcqa`` reward reads as its letter); any other kind does
    the same with no loss on the choice token (the first ``<search>``).
    """
    first_entity, first_relation, _ = case.hops[0]
    segments: loop.Segments = [(f"<think> I need the {first_relation} of {first_entity}. </think>\n", True)]
    if kind == GUESS:
        return segments + [(f"<answer> {wrong_option(case)} </answer>", True)]
    segments += [("<search>", kind == SEARCH), (f" {queries(case)[0]} </search>", True), (observations[0], False)]
    if case.facts == 2:
        segments += [
            (
                f"<think> The cause is {case.condition}. I need the treatment of {case.condition}. </think>\n"
                f"<search> {queries(case)[1]} </search>",
                True,
            ),
            (observations[1], False),
        ]
    return segments + [(f"<think> The treatment is {case.drug}. </think>\n<answer> {case.drug} </answer>", True)]


def case_row(case: Case, index: int) -> dict:
    """One verl row (:data:`data_prep._common.SCHEMA`), scored by ``mcqa`` (the gold is the letter)."""
    content = prompt(case)
    if parse_options_block(content) != list(case.options):  # the prompt must show the options the reward reads
        raise ValueError(f"case {case.case_id}: the rendered options block does not parse back to its options")
    return make_row(
        data_source=DATA_SOURCE,
        agent_name=AGENT_NAME,
        content=content,
        ability=ABILITY,
        targets=[case.letter],
        split=case.split,
        index=index,
        question=case.question,
        retrieval_query=case.question,
        choices=list(case.options),
        source_id=f"med-{case.case_id}",
        subject=f"{case.facts}-fact",
        reward_fn="mcqa",
    )


class _Spec:
    """:class:`~sorl_verl.quickstart.tasks._search_loop.SearchLoopSpec` of this task."""

    demo_mix_field = "guess_fraction"

    def generate(self, cfg, reserved_words):
        return generate_cases(cfg.sizes, cfg.seed, reserved_words)

    documents = staticmethod(documents)
    row = staticmethod(case_row)
    queries = staticmethod(queries)
    demonstration = staticmethod(demonstration)
    prompt = staticmethod(prompt)

    @staticmethod
    def words(cases: list[Case]) -> list[str]:
        words = {w for c in cases for name in (c.finding, c.condition) for w in name.split()}
        return sorted(words | {d for c in cases for d in c.options})

    @staticmethod
    def describe(cases: list[Case]) -> dict:
        return {
            "cases": loop.count_by_split(cases),
            "cases_by_facts": loop.count_by_split(cases, lambda c: c.facts),
            "letters": loop.count_by_split(cases, lambda c: c.letter),
        }


SPEC = _Spec()


@dataclass
class MedicalConfig(WarmStartConfig):
    """Settings of the medical quick start's steps 1-2 (recorded in ``prepare.json``)."""

    task: str = "medical"
    sizes: dict[str, int] = field(default_factory=lambda: {"sft": 1500, "train": 400, "val": 256})
    guess_fraction: float = 0.7
    include_wiki: bool = True
    topk: int = 1
    max_obs_length: int = 64
    sft_attention: str = "sdpa"  # long demonstrations: the faster kernel (docs/quickstart.md, "SFT attention")


def prepare(run_dir, cfg: MedicalConfig | None = None, show_progress: bool = True) -> dict:
    return loop.prepare_search_loop(SPEC, run_dir, cfg or MedicalConfig(), show_progress)


def report(info: dict) -> str:
    return (
        f"task: {info['cases']} cases (facts per question in validation: {info['cases_by_facts']['val']}); "
        f"model: {info['n_params']:,} parameters; SFT on {info['sft_examples']} demonstrations "
        f"({info['sft_early_examples']} guess an option), loss {info['sft_loss_first']:.2f} -> "
        f"{info['sft_loss_last10']:.2f}, copy accuracy {info['copy_accuracy']:.0%} "
        f"({info['task_seconds'] + info['model_seconds']:.0f} s)"
    )


TASK = QuickstartTask(
    name="medical",
    summary="medical multiple choice: made-up drugs and conditions, one or two lookups, the gold a letter",
    config=MedicalConfig,
    prepare=prepare,
    report=report,
    demo_mix=SPEC.demo_mix_field,
    options=SEARCH_LOOP_OPTIONS,
    defaults={
        # RL moves this warm start towards searching more slowly than the other tasks' (validation
        # accuracy still rising at step 40; docs/results.md); the stability benchmark sets its own
        "STEPS": "40",
        "MAX_TURNS": "3",
        "TOPK": "1",
        "MAX_OBS_LENGTH": "64",
        "MAX_TOKENS_PER_TURN": "48",
        "MAX_PROMPT_LENGTH": "128",
        "MAX_RESPONSE_LENGTH": "192",
        "DEMO_MIX": "0.7",
    },
    # a search per fact, then the answer
    episode_turns=sum(facts + 1 for facts in FACTS) / len(FACTS),
)
