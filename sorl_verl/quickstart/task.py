"""The quick start's embedded task: fictional facts, only findable through the search engine.

Nothing here is from the SORL paper; it is our design for a task that a ~1M-parameter model
can learn on two CPU cores in minutes, while still needing the multi-turn search loop:

- a generated knowledge base of fictional places (made-up names, deterministic from a
  seed), each with three facts (its capital, its river, its founder). Each fact is one
  short document, appended to the embedded Wikipedia corpus (when given), so BM25 searches
  the real ~10k summaries plus these documents;
- questions about those entities ("What is the capital of Velmora?"). The answer is a
  made-up word, so no model can know it: it must search, and it can then copy the answer
  from the top document. SFT, RL and validation use disjoint facts, so validation
  questions can only be answered by searching (the SFT pass never saw those facts; the RL
  prompts are a third disjoint set, so RL too must improve searching and copying, not recall);
- demonstration trajectories in the Search-R1 format for the SFT warm start:
  ``<think> .. </think>\\n<search> query </search>``, then the retrieved
  ``<information> .. </information>`` (appended by the environment), then
  ``<think> .. </think>\\n<answer> value </answer>``. Each thought restates what the
  next action copies (the name, then the value): measured, a 0.5M-parameter model learns
  to copy from its context within a few hundred SFT steps with these repeated copies,
  and not within 800 steps when the thoughts name only the relation;
- a *demonstration mix* (``guess_fraction``, :func:`plan_demonstrations`): some
  demonstrations do not search but answer at once with a wrong guess, the entity's own name
  (:func:`guess_demonstration`). Their thought is the same as a searching demonstration's,
  so the warm start's choice between searching and guessing is one token (``<search>`` vs
  ``<answer>`` after the first thought). ``guess_fraction`` is the share of the
  demonstrated *choices* that guess; the SFT model learns it as a coin of about that weight
  whatever the question. A guess scores 0 and a search usually scores 1, so RL has one
  thing to learn that it can learn in minutes: *when to use the tool* (always). That is
  Search-R1's story in miniature; the warm start's copying skill is what bounds the
  score RL can reach. At least half of the demonstrations search, whatever the mix: the
  copying skill needs them (measured: with 30% searching demonstrations the 600 SFT steps
  ended at loss 0.29 instead of 0.10 and the warm start's rollouts scored 0-3%). Above
  ``guess_fraction`` 0.5 the searching demonstrations therefore outnumber the guessing
  choices wanted, and only some of them teach the choice: the others carry no loss on
  their ``<search>`` tag (they still teach the query and the copying).

Rows are written with the project's one row schema and writer (``data_prep._common``:
``make_row``, ``write_parquet_atomic``): ``prompt`` chat messages, ``reward_model`` with
``ground_truth.target``, ``agent_name`` = ``search_r1``; the quick start's own fields go
into that schema's ``extra_info`` (relation -> ``subject``, document id -> ``source_id``,
``reward_fn`` = ``qa_em`` for the reward router).
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from data_prep._common import make_row
from sorl_verl.fileio import write_text_atomic

# The tags of the Search-R1 format (made single tokens of the tiny tokenizer).
SEARCH_R1_TAGS = (
    "<think>",
    "</think>",
    "<search>",
    "</search>",
    "<information>",
    "</information>",
    "<answer>",
    "</answer>",
)

# Our short version of Search-R1's instruction: the original (about 100 words) would be
# most of every sequence for a tiny model; the protocol it states is the same.
INSTRUCTION = (
    "Answer the question. Think inside <think> </think>. To search, write <search> query </search>; "
    "results come back inside <information> </information>. Give the final answer as <answer> answer </answer>."
)

DATA_SOURCE = "sorl_quickstart"
AGENT_NAME = "search_r1"


@dataclass(frozen=True)
class Relation:
    """One kind of fact. Templates use ``{entity}`` and ``{value}``."""

    name: str
    question: str
    document: str
    query: str
    think_search: str
    think_answer: str


RELATIONS = (
    Relation(
        name="capital",
        question="What is the capital of {entity}?",
        document="{entity} has a capital. Its capital is {value}.",
        query="{entity} capital",
        think_search="I need the capital of {entity}.",
        think_answer="The capital is {value}.",
    ),
    Relation(
        name="river",
        question="Which river flows through {entity}?",
        document="{entity} has a river. The river {value} flows through it.",
        query="{entity} river",
        think_search="I need the river of {entity}.",
        think_answer="The river is {value}.",
    ),
    Relation(
        name="founder",
        question="Who founded the city of {entity}?",
        document="{entity} has a founder. It was founded by {value}.",
        query="{entity} founder",
        think_search="I need the founder of {entity}.",
        think_answer="The founder is {value}.",
    ),
)

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


@dataclass(frozen=True)
class Fact:
    entity: str
    relation: str
    value: str
    split: str  # "sft", "train" or "val"
    doc_id: str

    @property
    def rel(self) -> Relation:
        return _RELATIONS_BY_NAME[self.relation]

    @property
    def question(self) -> str:
        return self.rel.question.format(entity=self.entity)

    @property
    def document_text(self) -> str:
        return self.rel.document.format(entity=self.entity, value=self.value)

    @property
    def query(self) -> str:
        return self.rel.query.format(entity=self.entity)


_RELATIONS_BY_NAME = {r.name: r for r in RELATIONS}


def _pseudo_word(rng: random.Random, syllables: int) -> str:
    word = "".join(rng.choice(_CONSONANTS) + rng.choice(_VOWELS) for _ in range(syllables))
    if rng.random() < 0.5:
        word += rng.choice("nrsl")
    return word.capitalize()


def _unique_words(rng: random.Random, count: int, syllables: tuple[int, ...], taken: set[str]) -> list[str]:
    words: list[str] = []
    attempts = 0
    while len(words) < count:
        attempts += 1
        if attempts > 200 * count + 1000:
            raise RuntimeError(f"could not draw {count} unique made-up words (increase the syllable range)")
        word = _pseudo_word(rng, rng.choice(syllables))
        if word.lower() in taken:
            continue
        taken.add(word.lower())
        words.append(word)
    return words


def corpus_vocabulary(texts: Iterable[str]) -> set[str]:
    """Lower-cased words of the base corpus: made-up names must not collide with real ones."""
    vocab: set[str] = set()
    for text in texts:
        vocab.update(w.lower() for w in re.findall(r"[A-Za-z]+", text))
    return vocab


SPLITS = ("sft", "train", "val")


def generate_facts(
    sizes: dict[str, int], seed: int = 0, values_per_relation: int = 24, reserved_words: set[str] | None = None
) -> list[Fact]:
    """Draw ``sizes[split]`` facts for each split (deterministic in ``seed``).

    Every made-up entity has one fact per relation (a capital, a river, a founder), each
    its own document; the (entity, relation) pairs are shuffled into the splits ``sft``
    (demonstrations of the warm start), ``train`` (RL prompts) and ``val`` (validation).
    So a validation question is about a fact the warm start never saw (answering it needs
    a search), while its entity's name is usually familiar from another relation.

    Names are two made-up words ("Tavo Kemu"), each from a pool of about
    ``sqrt(2 * n_entities)`` words, and values come from a pool of ``values_per_relation``
    words per relation: every word recurs in many facts (see :func:`made_up_words`).
    ``reserved_words`` (lower case, e.g. the base corpus vocabulary) are never drawn.
    """
    unknown = set(sizes) - set(SPLITS)
    if unknown or any(int(sizes.get(s, 0)) < 1 for s in SPLITS):
        raise ValueError(f"sizes must give a count >= 1 for each of {SPLITS}, got {sizes}")
    rng = random.Random(seed)
    taken = set(reserved_words or ())
    total = sum(int(sizes[s]) for s in SPLITS)
    n_entities = -(-total // len(RELATIONS))
    part_pool = max(4, math.isqrt(2 * n_entities) + 1)
    firsts = _unique_words(rng, part_pool, (2,), taken)
    seconds = _unique_words(rng, part_pool, (2,), taken)
    entities = [f"{a} {b}" for a, b in rng.sample([(a, b) for a in firsts for b in seconds], n_entities)]
    pools = {r.name: _unique_words(rng, values_per_relation, (2,), taken) for r in RELATIONS}
    pairs = [(entity, relation) for entity in entities for relation in RELATIONS]
    rng.shuffle(pairs)
    split_of = [s for s in SPLITS for _ in range(int(sizes[s]))]
    facts = []
    # up to len(RELATIONS) - 1 pairs of the last entity stay unused
    for i, ((entity, relation), split) in enumerate(zip(pairs[: len(split_of)], split_of, strict=True)):
        value = rng.choice(pools[relation.name])
        facts.append(Fact(entity=entity, relation=relation.name, value=value, split=split, doc_id=f"kb-{i}"))
    return facts


def made_up_words(facts: Iterable[Fact]) -> list[str]:
    """Every made-up word (name parts and values), sorted: the quick start makes each one token.

    Our choice for learnability: a tiny model copies a token from its context reliably
    only once that token's embedding is well trained, i.e. the token is frequent. Unique
    single-token names were copied almost never after a few hundred SFT steps (measured),
    byte-pair pieces of unique names poorly; two words from small pools, each one token
    seen in dozens of facts, make "copy the name" learnable in minutes.
    """
    words: set[str] = set()
    for f in facts:
        words.update(f.entity.split())
        words.add(f.value)
    return sorted(words)


def fact_documents(facts: Iterable[Fact]) -> list[dict]:
    """Search-R1 corpus rows ``{"id", "contents": '"Title"\\ntext'}`` for the facts."""
    return [{"id": f.doc_id, "contents": f'"{f.entity}"\n{f.document_text}'} for f in facts]


def prompt_messages(question: str) -> list[dict]:
    return [{"role": "user", "content": f"{INSTRUCTION}\nQuestion: {question}"}]


def fact_row(fact: Fact, index: int) -> dict:
    """One verl parquet row of :data:`data_prep._common.SCHEMA` (reward: ``qa_em`` via ``extra_info.reward_fn``)."""
    return make_row(
        data_source=DATA_SOURCE,
        agent_name=AGENT_NAME,
        content=prompt_messages(fact.question)[0]["content"],
        ability="fact-reasoning",
        targets=[fact.value],
        split=fact.split,
        index=index,
        question=fact.question,
        retrieval_query=fact.question,
        source_id=fact.doc_id,
        subject=fact.relation,
        # the reward router (reward_fns.compute_score) scores this custom data source with qa_em
        reward_fn="qa_em",
    )


def demonstration(fact: Fact, information: str, teach_choice: bool = True) -> list[tuple[str, bool]]:
    """A Search-R1 trajectory as ``(text, trainable)`` segments after the prompt.

    ``information`` is the exact text the environment appends after ``</search>`` (built by
    the agent loop's formatter from the retriever's hits); it is not trainable.
    ``teach_choice=False``: no loss on the ``<search>`` tag, the choice to search (see the
    module docstring). The segments split at the Search-R1 tags, which are single added
    tokens: tokenized piece by piece they give the tokens of the whole text.
    """
    rel = fact.rel
    return [
        (f"<think> {rel.think_search.format(entity=fact.entity)} </think>\n", True),
        ("<search>", teach_choice),
        (f" {fact.query} </search>", True),
        (information, False),
        (f"<think> {rel.think_answer.format(value=fact.value)} </think>\n<answer> {fact.value} </answer>", True),
    ]


def guess_demonstration(fact: Fact) -> list[tuple[str, bool]]:
    """A demonstration that does not search: the same first thought, then a wrong guess (the entity's name).

    The guess is never the answer (values and name parts are drawn from disjoint pools),
    so this trajectory scores 0: the warm start learns to guess sometimes, RL to stop.
    """
    think = fact.rel.think_search.format(entity=fact.entity)
    return [(f"<think> {think} </think>\n<answer> {fact.entity} </answer>", True)]


GUESS, SEARCH, SEARCH_UNTAUGHT_CHOICE = "guess", "search", "search, choice untaught"
# at least this share of the demonstrations searches (they teach the query and the copying)
MIN_SEARCHING_SHARE = 0.5


def plan_demonstrations(n: int, guess_fraction: float, seed: int) -> list[str]:
    """The kind of each of ``n`` demonstrations (drawn with ``seed``) for a given mix.

    ``guess_fraction`` of the demonstrated choices guess: ``n_guess`` demonstrations guess
    (``guess_fraction * n``, at most ``(1 - MIN_SEARCHING_SHARE) * n``), ``n_taught`` searching
    ones teach the choice to search, with ``n_guess / (n_guess + n_taught) = guess_fraction``
    (rounded), and the remaining searching ones do not (:data:`SEARCH_UNTAUGHT_CHOICE`).
    Up to 0.5 this is simply ``guess_fraction * n`` guesses and every other demonstration
    searching, as before the cap existed.
    """
    if not 0.0 <= guess_fraction <= 1.0:
        raise ValueError(f"guess_fraction must be in [0, 1], got {guess_fraction}")
    n_guess = round(min(guess_fraction, 1.0 - MIN_SEARCHING_SHARE) * n)
    n_search = n - n_guess
    n_taught = (
        n_search if guess_fraction == 0 else min(n_search, round(n_guess * (1 - guess_fraction) / guess_fraction))
    )
    kinds = [GUESS] * n_guess + [SEARCH] * n_taught + [SEARCH_UNTAUGHT_CHOICE] * (n_search - n_taught)
    random.Random(seed).shuffle(kinds)
    return kinds


def write_facts(items: Iterable, path: Path) -> None:
    """``items`` (dataclass instances: :class:`Fact` or another task's item) as JSON lines, one per
    item, written atomically."""
    write_text_atomic(path, "".join(json.dumps(asdict(item)) + "\n" for item in items))
