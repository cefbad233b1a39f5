"""Multi-hop QA in miniature: questions that need two or three chained lookups.

Ours (the paper's multi-hop sets are HotpotQA, 2WikiMultiHopQA, MuSiQue and Bamboogle; this is a
made-up knowledge base a ~1M-parameter model learns on two CPU cores). Every question follows a
*chain* of made-up entities, each fact its own document appended to the embedded Wikipedia corpus:

    country --capital--> city --founder--> person --birthplace--> town --mayor--> person --spouse--> person

- 2-hop: "Who is the founder of the capital of Tavo Kemu?" (answer: the person);
- 3-hop: "Where was the founder of the capital of Tavo Kemu born?" (answer: the town);
- 4- and 5-hop questions (the long variant, :mod:`.multihop_long`) go on through the mayor and the
  spouse: "Who is the mayor of the birthplace of the founder of the capital of Tavo Kemu?".

This task asks 2 or 3 hops (its chains stop at the town). One relation per hop, so the question's
words alone tell how many hops it has: with two relations per hop ("the mayor of the port of X")
the 0.54M-parameter warm start learned the relation words as a coin instead of copying them from
the question (held-out copy accuracy 8-39% after 1000 SFT steps, every error a relation word), while
it copies made-up names well. The second query names the entity the first search returned
("<city> founder"), the third the one the second returned: the hops are chained, and a good
trajectory has hops + 1 model turns. Every entity belongs to one chain, and chains are split into
``sft`` (warm-start demonstrations), ``train`` (RL prompts) and ``val`` (validation), so the facts of
the three splits are disjoint: a validation question can only be answered by searching.

The warm start leaves RL a decision to learn, as the search quick start does: in a share
``early_answer_fraction`` of the demonstrated choices the demonstration answers right after the
first hop, with the entity it found (a city: always wrong). The choice is one token after the
second thought (``<search>`` or ``<answer>``), so the warm start learns it as a coin: greedy
validation answers after one hop (about 0 exact match) and sampled rollouts go on searching about
``1 - early_answer_fraction`` of the time. After the second hop the demonstrations are all
right: each hop's thought names the relation needed next until the question's last, then answers
(the question's words tell which: "Who" or "Where" here, the outermost relation in the long variant).

Rows use the project's row schema (:func:`data_prep._common.make_row`), the ``search_r1`` agent and
the ``qa_em`` reward, with the multi-hop data source names the real recipe uses: ``hotpotqa`` for
the 2-hop questions and ``musique`` (composed questions of two to four hops) for the longer ones.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from data_prep._common import make_row
from sorl_verl.quickstart.prepare import WarmStartConfig
from sorl_verl.quickstart.task import AGENT_NAME, GUESS, SEARCH, SPLITS, _unique_words, prompt_messages
from sorl_verl.quickstart.tasks import SEARCH_LOOP_OPTIONS, QuickstartTask
from sorl_verl.quickstart.tasks import _search_loop as loop

FIRST_HOP = ("capital",)  # country -> city
SECOND_HOP = ("founder",)  # city -> person
# the later hops, one fixed relation each: person -> town -> person -> person
LATER_HOPS = ("birthplace", "mayor", "spouse")
HOPS = (2, 3)
# the real recipe's multi-hop data sources: HotpotQA (2 hops), MuSiQue (composed, two to four hops)
DATA_SOURCES = {2: "hotpotqa"}
LONG_DATA_SOURCE = "musique"  # 3 hops and more


@dataclass(frozen=True)
class Chain:
    """One question's chain of made-up entities: ``entities[k]`` --``relations[k]``--> ``entities[k + 1]``;
    the question asks for ``entities[hops]`` (``hops`` <= ``len(relations)``; the later facts are in
    the corpus all the same)."""

    entities: tuple[str, ...]
    relations: tuple[str, ...]
    hops: int
    split: str
    chain_id: int

    @property
    def question(self) -> str:
        # "the founder of the capital of X": the hops before the last, the outermost relation first
        phrase = self.entities[0]
        for relation in self.relations[: self.hops - 1]:
            phrase = f"the {relation} of {phrase}"
        last = self.relations[self.hops - 1]
        return f"Where was {phrase} born?" if last == "birthplace" else f"Who is the {last} of {phrase}?"

    @property
    def answer(self) -> str:
        return self.entities[self.hops]

    @property
    def facts(self) -> list[tuple[str, str, str]]:
        """``(entity, relation, value)`` of every fact of the chain, in hop order."""
        return list(zip(self.entities, self.relations, self.entities[1:], strict=False))


_DOCUMENT = {
    "capital": "{e} is a country. Its capital is {v}.",
    "founder": "{e} is a city. Its founder is {v}.",
    "birthplace": "{e} is a person. Their birthplace is {v}.",
    "mayor": "{e} is a town. Its mayor is {v}.",
    "spouse": "{e} is a person. Their spouse is {v}.",
}


def generate_chains(
    sizes: dict[str, int], seed: int = 0, reserved_words: set[str] | None = None, hops: tuple[int, ...] = HOPS
) -> list[Chain]:
    """``sizes[split]`` chains per split (listed sft, train, val; deterministic in ``seed``).

    Each chain has ``max(hops) + 1`` entities of its own (two made-up words each, from two pools of
    about ``sqrt((max(hops) + 2) * chains)`` words, so every word recurs in many names and is learnable
    as one token), its hop count drawn uniformly from ``hops``. ``reserved_words`` (lower case) are
    never drawn.
    """
    if set(sizes) - set(SPLITS) or any(int(sizes.get(s, 0)) < 1 for s in SPLITS):
        raise ValueError(f"sizes must give a count >= 1 for each of {SPLITS}, got {sizes}")
    if not hops or min(hops) < 2 or max(hops) > 2 + len(LATER_HOPS):
        raise ValueError(f"hops must lie in 2..{2 + len(LATER_HOPS)}, got {hops}")
    rng = random.Random(seed)
    taken = set(reserved_words or ())
    total = sum(int(sizes[s]) for s in SPLITS)
    n = max(hops) + 1  # entities per chain
    pool = max(4, math.isqrt((n + 1) * total) + 1)
    firsts = _unique_words(rng, pool, (2,), taken)
    seconds = _unique_words(rng, pool, (2,), taken)
    names = [f"{a} {b}" for a, b in rng.sample([(a, b) for a in firsts for b in seconds], n * total)]
    chains = []
    for i, split in enumerate(s for s in SPLITS for _ in range(int(sizes[s]))):
        relations = (rng.choice(FIRST_HOP), rng.choice(SECOND_HOP), *LATER_HOPS[: n - 3])
        chains.append(
            Chain(
                entities=tuple(names[n * i : n * i + n]),
                relations=relations,
                hops=rng.choice(hops),
                split=split,
                chain_id=i,
            )
        )
    return chains


def documents(chains: list[Chain]) -> list[dict]:
    """Search-R1 corpus rows, one per fact: ``{"id": "mh-<chain>-<hop>", "contents": '"Entity"\\ntext'}``."""
    return [
        {"id": f"mh-{c.chain_id}-{hop}", "contents": f'"{e}"\n' + _DOCUMENT[r].format(e=e, v=v)}
        for c in chains
        for hop, (e, r, v) in enumerate(c.facts, start=1)
    ]


def queries(chain: Chain) -> list[str]:
    """The searches of a full demonstration: one per hop, each naming the entity the last one found."""
    return [f"{e} {r}" for e, r, _ in chain.facts[: chain.hops]]


def demonstration(chain: Chain, observations: list[str], kind: str = SEARCH) -> loop.Segments:
    """The trajectory as ``(text, trainable)`` segments after the prompt (observations not trainable).

    ``kind`` (:func:`~sorl_verl.quickstart.task.plan_demonstrations`): ``GUESS`` answers after the first
    hop with the entity it found (wrong); ``SEARCH`` goes on; any other kind goes on with no loss on the
    choice token (the ``<search>`` after the second thought). After the first hop every hop's thought
    names what it found and, unless it was the last hop, the relation it needs next.
    """
    c = chain
    asks = queries(c)
    segments: loop.Segments = [
        (f"<think> I need the {c.relations[0]} of {c.entities[0]}. </think>\n<search> {asks[0]} </search>", True),
        (observations[0], False),
    ]
    for k in range(1, c.hops + 1):  # after hop k: entities[k] found
        found = f"<think> The {c.relations[k - 1]} is {c.entities[k]}."
        if k == c.hops:
            return segments + [(f"{found} </think>\n<answer> {c.entities[k]} </answer>", True)]
        need = f"{found} I need the {c.relations[k]} of {c.entities[k]}. </think>\n"
        if k > 1:
            segments += [(f"{need}<search> {asks[k]} </search>", True), (observations[k], False)]
            continue
        segments.append((need, True))
        if kind == GUESS:
            return segments + [(f"<answer> {c.entities[1]} </answer>", True)]
        segments += [("<search>", kind == SEARCH), (f" {asks[1]} </search>", True), (observations[1], False)]
    raise AssertionError("unreachable: the loop returns at the last hop")


def chain_row(chain: Chain, index: int) -> dict:
    """One verl row (:data:`data_prep._common.SCHEMA`), scored by ``qa_em``."""
    return make_row(
        data_source=DATA_SOURCES.get(chain.hops, LONG_DATA_SOURCE),
        agent_name=AGENT_NAME,
        content=prompt_messages(chain.question)[0]["content"],
        ability="fact-reasoning",
        targets=[chain.answer],
        split=chain.split,
        index=index,
        question=chain.question,
        retrieval_query=chain.question,
        source_id=f"mh-{chain.chain_id}",
        subject=f"{chain.hops}-hop",
        reward_fn="qa_em",
    )


class _Spec:
    """:class:`~sorl_verl.quickstart.tasks._search_loop.SearchLoopSpec` of a multi-hop task whose
    questions have ``hops`` hops (drawn uniformly)."""

    demo_mix_field = "early_answer_fraction"

    def __init__(self, hops: tuple[int, ...] = HOPS):
        self.hops = tuple(hops)

    def generate(self, cfg, reserved_words):
        return generate_chains(cfg.sizes, cfg.seed, reserved_words, self.hops)

    documents = staticmethod(documents)
    row = staticmethod(chain_row)
    queries = staticmethod(queries)
    demonstration = staticmethod(demonstration)

    @staticmethod
    def prompt(chain: Chain) -> str:
        return prompt_messages(chain.question)[0]["content"]

    @staticmethod
    def words(chains: list[Chain]) -> list[str]:
        return sorted({w for c in chains for name in c.entities for w in name.split()})

    @staticmethod
    def describe(chains: list[Chain]) -> dict:
        return {"chains": loop.count_by_split(chains), "chains_by_hops": loop.count_by_split(chains, lambda c: c.hops)}


SPEC = _Spec()


@dataclass
class MultihopConfig(WarmStartConfig):
    """Settings of the multi-hop quick start's steps 1-2 (recorded in ``prepare.json``)."""

    task: str = "multihop"
    sizes: dict[str, int] = field(default_factory=lambda: {"sft": 1500, "train": 400, "val": 256})
    early_answer_fraction: float = 0.7
    include_wiki: bool = True
    topk: int = 1
    max_obs_length: int = 64
    sft_attention: str = "sdpa"  # long demonstrations: the faster kernel (docs/quickstart.md, "SFT attention")


def prepare(run_dir, cfg: MultihopConfig | None = None, show_progress: bool = True) -> dict:
    return loop.prepare_search_loop(SPEC, run_dir, cfg or MultihopConfig(), show_progress)


def report(info: dict) -> str:
    return (
        f"task: {info['chains']} chains ({info['chains_by_hops']['val']} hops in validation); "
        f"model: {info['n_params']:,} parameters; SFT on {info['sft_examples']} demonstrations "
        f"({info['sft_early_examples']} answer after one hop), loss {info['sft_loss_first']:.2f} -> "
        f"{info['sft_loss_last10']:.2f}, copy accuracy {info['copy_accuracy']:.0%} "
        f"({info['task_seconds'] + info['model_seconds']:.0f} s)"
    )


TASK = QuickstartTask(
    name="multihop",
    summary="multi-hop QA: two or three chained lookups of made-up facts (3-4 model turns)",
    config=MultihopConfig,
    prepare=prepare,
    report=report,
    demo_mix=SPEC.demo_mix_field,
    options=SEARCH_LOOP_OPTIONS,
    defaults={
        "MAX_TURNS": "4",
        "TOPK": "1",
        "MAX_OBS_LENGTH": "64",
        "MAX_TOKENS_PER_TURN": "48",
        "MAX_PROMPT_LENGTH": "96",
        "MAX_RESPONSE_LENGTH": "256",
        "DEMO_MIX": "0.7",
    },
    # a search per hop, then the answer (hops drawn uniformly from HOPS)
    episode_turns=sum(hops + 1 for hops in HOPS) / len(HOPS),
)
