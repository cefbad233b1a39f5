"""What the tasks played through the ``search_r1`` loop share: a knowledge base of made-up facts
appended to the embedded Wikipedia corpus, its BM25 index, verl rows, and a warm start on
demonstrations that show the real retrieved passages.

A task supplies a :class:`SearchLoopSpec` (generate items, their documents and rows, each item's
search queries and demonstration); :func:`prepare_search_loop` does the rest. Our design, as the
search quick start's (:mod:`sorl_verl.quickstart.task`), whose tokens, tags and demonstration mix
it reuses.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sorl_verl.quickstart.prepare import WarmStartConfig, build_knowledge_base, prepare_run, warm_start_with_retry
from sorl_verl.quickstart.task import (
    GUESS,
    SEARCH,
    SEARCH_R1_TAGS,
    SPLITS,
    plan_demonstrations,
)

Segments = list[tuple[str, bool]]


class SearchLoopSpec(Protocol):
    """The task-specific half of a search-loop task (items are frozen dataclasses with a ``split``)."""

    # the config field with the share of SFT demonstrations whose choice stops early
    demo_mix_field: str

    def generate(self, cfg: Any, reserved_words: set[str]) -> list: ...

    def documents(self, items: list) -> list[dict]: ...

    def row(self, item, index: int) -> dict: ...

    def prompt(self, item) -> str: ...

    def queries(self, item) -> list[str]: ...

    def demonstration(self, item, observations: list[str], kind: str) -> Segments: ...

    def words(self, items: list) -> list[str]: ...

    def describe(self, items: list) -> dict: ...


def prompt_messages(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


def build_task(spec: SearchLoopSpec, task_dir: Path, cfg) -> list:
    """Items (``items.jsonl``), corpus, BM25 index and parquet rows in ``task_dir``; returns the items."""
    return build_knowledge_base(
        task_dir,
        cfg.include_wiki,
        lambda reserved: spec.generate(cfg, reserved),
        spec.documents,
        spec.row,
        "items.jsonl",
    )


def observations(spec: SearchLoopSpec, items: list, index_dir: Path, topk: int) -> list[list[str]]:
    """For each item, the observation the agent loop shows after each of its queries (one batched search)."""
    from sorl_verl.agent.retrieval_client import format_passages
    from sorl_verl.agent.search_r1_loop import information_block
    from sorl_verl.retrieval import load_retriever

    queries = [spec.queries(item) for item in items]
    flat = [q for qs in queries for q in qs]
    hits = load_retriever(index_dir).search(flat, topk=topk) if flat else []
    blocks = iter(information_block(format_passages(h)) for h in hits)
    return [[next(blocks) for _ in qs] for qs in queries]


@dataclass
class Demonstrations:
    """Picklable ``make_examples`` of :func:`~sorl_verl.quickstart.prepare.warm_start_with_retry`:
    ``prompts[i]`` followed by ``segments[i]``, observations cut to ``max_obs_length`` tokens."""

    prompts: list[str]
    segments: list[Segments]
    max_obs_length: int

    def __call__(self, tokenizer) -> list:
        from sorl_verl.quickstart.sft import tokenize_trajectory

        return [
            tokenize_trajectory(tokenizer, prompt_messages(p), s, self.max_obs_length)
            for p, s in zip(self.prompts, self.segments, strict=True)
        ]


@dataclass
class TrajectoryCheck:
    """Picklable warm-start check: the share of held-out demonstrations (never trained on) that the
    model writes exactly, teacher-forced and greedy, the ``<search>`` tag not checked (the choice to
    search is the coin RL acts on; :func:`~sorl_verl.quickstart.sft.teacher_forced_exact`). It is
    about the ceiling of the score RL can reach by changing that choice alone."""

    demonstrations: Demonstrations

    def __call__(self, model_dir: Path, cfg) -> float:
        from transformers import AutoTokenizer

        from sorl_verl.quickstart.sft import load_causal_lm, pad_token_id, teacher_forced_exact

        if not self.demonstrations.prompts:
            return float("nan")
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        model = load_causal_lm(model_dir, cfg.sft_attention)
        examples = self.demonstrations(tokenizer)
        search_tag = tokenizer.convert_tokens_to_ids("<search>")
        return teacher_forced_exact(model, examples, pad_token_id(tokenizer), ignore_targets=[search_tag])


CHECK_ITEMS = 100


@dataclass
class WarmStartInputs:
    """What the warm start of a search-loop task is made from: the tokenizer's ``texts`` and
    ``extra_tokens``, the SFT demonstrations (``make_examples(tokenizer)``), the copy ``check``, and
    the mix of choices taught (``kinds``)."""

    texts: list[str]
    extra_tokens: tuple[str, ...]
    make_examples: Demonstrations
    check: TrajectoryCheck
    kinds: list[str]


def warm_start_inputs(spec: SearchLoopSpec, run_dir: Path, items: list, cfg) -> WarmStartInputs:
    """The ``sft`` items' demonstrations (a share ``cfg.<spec.demo_mix_field>`` of the choices stop early:
    :func:`~sorl_verl.quickstart.task.plan_demonstrations`) and the check on the first
    :data:`CHECK_ITEMS` RL training items, searched in ``run_dir/task/index``."""
    index_dir = run_dir / "task" / "index"
    sft = [i for i in items if i.split == "sft"]
    held_out = [i for i in items if i.split == "train"][:CHECK_ITEMS]
    kinds = plan_demonstrations(len(sft), getattr(cfg, spec.demo_mix_field), seed=cfg.seed)
    sft_obs = observations(spec, sft, index_dir, cfg.topk)
    segments = [spec.demonstration(i, o, k) for i, o, k in zip(sft, sft_obs, kinds, strict=True)]
    check_obs = observations(spec, held_out, index_dir, cfg.topk)
    check = Demonstrations(
        [spec.prompt(i) for i in held_out],
        [spec.demonstration(i, o, SEARCH) for i, o in zip(held_out, check_obs, strict=True)],
        cfg.max_obs_length,
    )
    texts = [spec.prompt(i) for i in items] + [d["contents"] for d in spec.documents(items)]
    texts += [text for demo in segments for text, _ in demo]
    return WarmStartInputs(
        texts=texts,
        extra_tokens=(*SEARCH_R1_TAGS, *spec.words(items)),
        make_examples=Demonstrations([spec.prompt(i) for i in sft], segments, cfg.max_obs_length),
        check=TrajectoryCheck(check),
        kinds=kinds,
    )


def build_model(spec: SearchLoopSpec, run_dir: Path, items: list, cfg, show_progress: bool) -> dict:
    """Tiny model + tokenizer, SFT on :func:`warm_start_inputs`' demonstrations, checked by its check;
    returns the warm start's stats."""
    inputs = warm_start_inputs(spec, run_dir, items, cfg)
    stats = warm_start_with_retry(
        run_dir, cfg, inputs.texts, inputs.extra_tokens, inputs.make_examples, inputs.check, show_progress
    )
    return {**stats, "sft_early_examples": inputs.kinds.count(GUESS), "sft_choice_taught": inputs.kinds.count(SEARCH)}


def prepare_search_loop(spec: SearchLoopSpec, run_dir, cfg: WarmStartConfig, show_progress: bool = True) -> dict:
    """Steps 1-2 of a search-loop task (:func:`~sorl_verl.quickstart.prepare.prepare_run`'s contract)."""

    def task(task_dir: Path, c) -> list:
        return build_task(spec, task_dir, c)

    def model(run_dir: Path, items: list, c, show_progress: bool = True) -> dict:
        return build_model(spec, run_dir, items, c, show_progress)

    return prepare_run(run_dir, cfg, task, model, spec.describe, show_progress)


def count_by_split(items: Sequence, key=None) -> dict:
    """``{split: count}`` or, with ``key``, ``{split: {key(item): count}}``."""
    if key is None:
        return {s: sum(i.split == s for i in items) for s in SPLITS}
    out: dict[str, dict[str, int]] = {}
    for s in SPLITS:
        counts: dict[str, int] = {}
        for i in items:
            if i.split == s:
                counts[str(key(i))] = counts.get(str(key(i)), 0) + 1
        out[s] = dict(sorted(counts.items()))
    return out
