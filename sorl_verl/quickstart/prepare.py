"""Steps 1-2 of the quick start: the embedded task and its index, then the warm-started tiny model.

Writes into a run folder::

    task/facts.jsonl           the generated facts (entity, relation, value, split, doc id)
    task/corpus.jsonl.gz       embedded Wikipedia summaries + one document per fact
    task/index/                BM25 index of that corpus (sorl_verl.retrieval)
    task/train.parquet         RL prompts (verl rows, agent_name search_r1)
    task/val.parquet           validation prompts (entities seen neither in SFT nor RL)
    model/                     tiny Qwen2 + tokenizer after the SFT warm start
    prepare.json               settings, sizes, timings, SFT losses (written last: marks completion)

A second call with the same settings returns ``prepare.json`` without redoing anything; a
call with different settings (say another ``topk``) refuses with :class:`PrepareMismatch`,
since the warm start's demonstrations would no longer match the run's agent loop.

Our design (not the paper's); see :mod:`sorl_verl.quickstart.task` and :mod:`.sft`.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from data_prep._common import write_parquet_atomic
from sorl_verl.fileio import replace_dir, write_text_atomic
from sorl_verl.quickstart.task import (
    GUESS,
    SEARCH,
    SEARCH_R1_TAGS,
    Fact,
    corpus_vocabulary,
    demonstration,
    fact_documents,
    fact_row,
    generate_facts,
    guess_demonstration,
    made_up_words,
    plan_demonstrations,
    prompt_messages,
    write_facts,
)

if TYPE_CHECKING:
    from sorl_verl.quickstart.sft import SFTExample

PREPARE_MARKER = "prepare.json"


@dataclass
class WarmStartConfig:
    """The tiny model and its SFT warm start: the settings the quick starts' tasks share (:func:`build_warm_start`)."""

    seed: int = 0
    vocab_size: int = 1024  # BPE merges; a task's own tokens (made-up names, tags) come on top, one token each
    hidden_size: int = 128
    num_layers: int = 2
    sft_steps: int = 1000
    sft_batch_size: int = 32
    sft_lr: float = 3e-3
    # SFT's attention kernel, "eager" or "sdpa" (sft.SFT_ATTENTION: the same function, sdpa faster on
    # long demonstrations). The default is what the search and math warm starts were measured with.
    sft_attention: str = "eager"


@dataclass
class PrepareConfig(WarmStartConfig):
    """Sizes and model settings of the quick start (defaults: what fits ~10 min of demo on 2 idle cores).

    ``guess_fraction``, ``topk`` and ``max_obs_length`` must equal run_demo.sh's defaults (``DEMO_MIX``,
    ``TOPK``, ``MAX_OBS_LENGTH``): callers that prepare a warm start themselves (the stability sweep)
    rely on both sides agreeing when a variable is not set.
    """

    sizes: dict[str, int] = field(default_factory=lambda: {"sft": 1500, "train": 400, "val": 256})
    # the demonstration mix: this share of the SFT demonstrations' choices is a wrong guess at once
    # instead of a search (task.plan_demonstrations), so RL has to teach *when to search*
    guess_fraction: float = 0.7
    include_wiki: bool = True  # search the embedded Wikipedia summaries too (distractors)
    topk: int = 1  # passages per search, in the demonstrations and in the agent loop
    max_obs_length: int = 64  # observation tokens kept, in the demonstrations and in the agent loop


def build_task(task_dir: Path, cfg: PrepareConfig) -> list[Fact]:
    """Facts, corpus, BM25 index and parquet files in ``task_dir``; returns the facts."""
    return build_knowledge_base(
        task_dir,
        cfg.include_wiki,
        lambda reserved: generate_facts(cfg.sizes, seed=cfg.seed, reserved_words=reserved),
        fact_documents,
        fact_row,
        "facts.jsonl",
    )


def build_knowledge_base(
    task_dir: Path,
    include_wiki: bool,
    generate: Callable[[set[str]], list],
    documents: Callable[[list], list[dict]],
    row: Callable[[object, int], dict],
    items_file: str,
) -> list:
    """A search-loop task's folder: ``generate(reserved_words)`` items (dataclasses with a ``split``;
    the embedded Wikipedia's vocabulary reserved when ``include_wiki``), written as JSON lines to
    ``items_file``; the corpus (Wikipedia, if asked, plus ``documents(items)``) and its BM25 index;
    ``train.parquet`` / ``val.parquet`` of ``row(item, index)``. Returns the items."""
    from sorl_verl.retrieval import build_index, embedded_corpus_path
    from sorl_verl.retrieval.corpus import iter_corpus, write_jsonl_atomic

    task_dir.mkdir(parents=True, exist_ok=True)
    base_rows = []
    if include_wiki:
        base_rows = [{"id": f"wiki-{d.id}", "contents": d.contents} for d in iter_corpus(embedded_corpus_path())]
    items = generate(corpus_vocabulary(r["contents"] for r in base_rows))
    write_facts(items, task_dir / items_file)
    corpus_path = task_dir / "corpus.jsonl.gz"
    write_jsonl_atomic(base_rows + documents(items), corpus_path)
    build_index(corpus_path, task_dir / "index", method="bm25", overwrite=True, show_progress=False)
    for split in ("train", "val"):
        rows = [row(item, i) for i, item in enumerate(i for i in items if i.split == split)]
        write_parquet_atomic(rows, task_dir / f"{split}.parquet")
    return items


def demonstration_segments(
    facts: list[Fact], index_dir: Path, topk: int, kinds: list[str] | None = None
) -> list[list[tuple[str, bool]]]:
    """Each fact's demonstration, with the observation the agent loop would show for its query.

    ``kinds[i]`` (from :func:`~sorl_verl.quickstart.task.plan_demonstrations`; default: every
    one searches) picks fact ``i``'s kind: guessing, searching, or searching without a loss
    on the choice to search.
    """
    from sorl_verl.agent.retrieval_client import format_passages
    from sorl_verl.agent.search_r1_loop import information_block
    from sorl_verl.retrieval import load_retriever

    kinds = kinds or [SEARCH] * len(facts)
    retriever = load_retriever(index_dir)
    hit_lists = retriever.search([f.query for f in facts], topk=topk)
    return [
        guess_demonstration(f)
        if kind == GUESS
        else demonstration(f, information_block(format_passages(hits)), teach_choice=kind == SEARCH)
        for f, hits, kind in zip(facts, hit_lists, kinds, strict=True)
    ]


def untrained_model(model_dir: Path, cfg: WarmStartConfig, texts: list[str], extra_tokens: Sequence[str]) -> Path:
    """The tiny model of ``cfg``'s size and its tokenizer (BPE trained on ``texts``, ``extra_tokens``
    single tokens) in ``model_dir``, before SFT; returns the folder."""
    from sorl_verl.models.tiny import build_tiny_model

    return build_tiny_model(
        model_dir,
        texts=texts,
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        num_layers=cfg.num_layers,
        intermediate_size=3 * cfg.hidden_size,
        extra_tokens=extra_tokens,
        seed=cfg.seed,
    )


def build_warm_start(
    run_dir: Path,
    cfg: WarmStartConfig,
    texts: list[str],
    extra_tokens: Sequence[str],
    make_examples: Callable[[object], list[SFTExample]],
    show_progress: bool = True,
    model_dir: Path | None = None,
) -> tuple[Path, dict]:
    """The tiny model and tokenizer in ``model_dir`` (default ``run_dir/model``; BPE trained on ``texts``,
    ``extra_tokens`` single tokens), then SFT on ``make_examples(tokenizer)``; returns the folder and its stats."""
    from transformers import AutoTokenizer

    from sorl_verl.quickstart.sft import train_sft

    model_dir = untrained_model(model_dir or run_dir / "model", cfg, texts, extra_tokens)
    examples = make_examples(AutoTokenizer.from_pretrained(model_dir))
    losses = train_sft(
        model_dir,
        examples,
        steps=cfg.sft_steps,
        batch_size=cfg.sft_batch_size,
        lr=cfg.sft_lr,
        attention=cfg.sft_attention,
        seed=cfg.seed,
        show_progress=show_progress,
    )
    meta = json.loads((model_dir / "sorl_tiny_model.json").read_text(encoding="utf-8"))
    return model_dir, {
        "n_params": meta["n_params"],
        "vocab_size": meta["vocab_size"],
        "sft_examples": len(examples),
        "sft_mean_tokens": sum(len(e.input_ids) for e in examples) / len(examples),
        "sft_loss_first": losses[0],
        "sft_loss_last10": sum(losses[-10:]) / len(losses[-10:]),
    }


@dataclass
class SearchExamples:
    """The search task's SFT examples for a tokenizer (a picklable ``make_examples``: a retry may run
    in a child process). ``segments[i]`` is ``facts[i]``'s demonstration."""

    facts: list[Fact]
    segments: list[list[tuple[str, bool]]]
    max_obs_length: int

    def __call__(self, tokenizer) -> list[SFTExample]:
        from sorl_verl.quickstart.sft import tokenize_trajectory

        return [
            tokenize_trajectory(tokenizer, prompt_messages(f.question), demo, self.max_obs_length)
            for f, demo in zip(self.facts, self.segments, strict=True)
        ]


def build_model(run_dir: Path, facts: list[Fact], cfg: PrepareConfig, show_progress: bool = True) -> dict:
    """Tiny model + tokenizer (trained on the task's texts), then the SFT warm start; returns stats.

    The warm start is checked by :func:`copy_accuracy` on held-out facts and redone once when it
    is weak (:func:`warm_start_with_retry`).
    """
    sft_facts = [f for f in facts if f.split == "sft"]
    kinds = plan_demonstrations(len(sft_facts), cfg.guess_fraction, seed=cfg.seed)
    segments = demonstration_segments(sft_facts, run_dir / "task" / "index", cfg.topk, kinds)
    texts = [f.question for f in facts] + [f.document_text for f in facts]
    texts += [text for demo in segments for text, _ in demo]
    extra_tokens = (*SEARCH_R1_TAGS, *made_up_words(facts))
    stats = warm_start_with_retry(
        run_dir,
        cfg,
        texts=texts,
        extra_tokens=extra_tokens,
        make_examples=SearchExamples(sft_facts, segments, cfg.max_obs_length),
        check=SearchCopyCheck([f for f in facts if f.split == "train"], run_dir / "task" / "index"),
        show_progress=show_progress,
    )
    return {**stats, "sft_guess_examples": kinds.count(GUESS), "sft_search_choice_taught": kinds.count(SEARCH)}


@dataclass
class SearchCopyCheck:
    """The search task's warm-start check (picklable): :func:`copy_accuracy` on ``held_out`` facts."""

    held_out: list[Fact]
    index_dir: Path

    def __call__(self, model_dir: Path, cfg: PrepareConfig) -> float:
        return copy_accuracy(model_dir, self.held_out, self.index_dir, cfg)


def warm_start_with_retry(
    run_dir: Path,
    cfg: WarmStartConfig,
    texts: list[str],
    extra_tokens: Sequence[str],
    make_examples: Callable[[object], list[SFTExample]],
    check: Callable[[Path, WarmStartConfig], float],
    show_progress: bool = True,
) -> dict:
    """:func:`build_warm_start` into ``run_dir/model``, checked by ``check(model_dir, cfg)`` (a share in
    [0, 1], the task's copy accuracy); returns the warm start's stats with the check's figures.

    A warm start whose check is under :data:`MIN_COPY_ACCURACY` is redone once from a fresh
    initialization (seed + :data:`RETRY_SEED_OFFSET`), and the better of the two is kept (the first on a
    tie; ``sft_attempt_kept``). With one torch thread and a spare core (the quick
    start's ``PREPARE_THREADS=1`` on 2 cores) the retry is trained *beside* the first attempt in a child
    process, and dropped if the first attempt passes: the same warm start as in turn (each attempt is
    single-threaded, so bit for bit the same), in the time of one attempt instead of two.
    ``make_examples`` and ``check`` must be picklable for that (module-level classes or functions).
    """
    attempt = partial(
        warm_start_attempt, run_dir, texts=texts, extra_tokens=extra_tokens, make_examples=make_examples, check=check
    )
    retry_cfg = replace(cfg, seed=cfg.seed + RETRY_SEED_OFFSET)
    beside = SFT_RETRIES == 1 and retry_beside_first()
    retry = SpeculativeAttempt(attempt, retry_cfg, run_dir / RETRY_DIR) if beside else None
    kept = 0
    try:
        results = [attempt(cfg, show_progress=show_progress)]
        if SFT_RETRIES and results[0][1] < MIN_COPY_ACCURACY:
            print(
                f"warm start: copy accuracy {results[0][1]:.0%} < {MIN_COPY_ACCURACY:.0%} after {cfg.sft_steps} SFT "
                f"steps; {'the retry trained beside it from' if retry else 'SFT again from'} a fresh initialization "
                f"(seed {retry_cfg.seed}); the better of the two is kept",
                file=sys.stderr,
            )
            if retry is None:
                results.append(attempt(retry_cfg, show_progress=show_progress, model_dir=run_dir / RETRY_DIR / "model"))
            else:
                results.append(retry.result())
            if results[1][1] > results[0][1]:  # a retry can be worse: keep the better warm start
                replace_dir(run_dir / RETRY_DIR / "model", run_dir / "model")
                kept = 1
    finally:
        if retry is not None:
            retry.discard()
        shutil.rmtree(run_dir / RETRY_DIR, ignore_errors=True)
    copies = [copy for _, copy in results]
    return {
        **results[kept][0],
        "copy_accuracy": copies[kept],
        "sft_attempts": len(copies),
        "sft_attempt_kept": kept + 1,
        "copy_accuracy_per_attempt": copies,
        "sft_retry_beside_first": beside,
    }


def warm_start_attempt(
    run_dir: Path,
    cfg: WarmStartConfig,
    texts: list[str],
    extra_tokens: Sequence[str],
    make_examples: Callable[[object], list[SFTExample]],
    check: Callable[[Path, WarmStartConfig], float],
    show_progress: bool = True,
    model_dir: Path | None = None,
) -> tuple[dict, float]:
    """One warm start (:func:`build_warm_start` into ``model_dir``) and its check: ``(stats, check(model_dir, cfg))``."""
    model_dir, stats = build_warm_start(run_dir, cfg, texts, extra_tokens, make_examples, show_progress, model_dir)
    return stats, check(model_dir, cfg)


def retry_beside_first() -> bool:
    """Whether the retry can train beside the first attempt: torch on one thread (so two attempts take
    two cores and each gives the bits it gives alone) and at least two cores for this process."""
    import torch

    return torch.get_num_threads() == 1 and len(os.sched_getaffinity(0)) >= 2


# the retry's folder while it trains beside the first attempt (removed afterwards)
RETRY_DIR = "model.retry"


class SpeculativeAttempt:
    """``attempt(cfg, show_progress=False, model_dir=folder/"model")`` started now in a child process
    (spawned, one torch thread), for a result that may never be needed: :meth:`result` waits for it
    (its model is then in ``folder/model``), :meth:`discard` stops the child and removes ``folder``.
    If the child fails, :meth:`result` runs the attempt here instead (a warning says why)."""

    def __init__(self, attempt: Callable[..., tuple[dict, float]], cfg, folder: Path):
        import multiprocessing

        self.attempt, self.cfg, self.folder = attempt, cfg, folder
        shutil.rmtree(folder, ignore_errors=True)  # a killed earlier run's leftovers
        context = multiprocessing.get_context("spawn")
        self._receive, send = context.Pipe(duplex=False)
        self._process = context.Process(
            target=_run_speculative, args=(send, attempt, cfg, folder / "model"), daemon=True
        )
        self._process.start()
        send.close()

    def result(self) -> tuple[dict, float]:
        try:
            outcome = self._receive.recv()
        except EOFError:  # the child died without a word (killed, out of memory)
            outcome = None
        self._process.join()
        if outcome is None:
            outcome = ("error", f"the child process ended with exit code {self._process.exitcode}")
        if outcome[0] == "ok":
            return outcome[1]
        print(
            f"warning: the retry trained beside the first attempt failed ({outcome[1]}); running it now",
            file=sys.stderr,
        )
        shutil.rmtree(self.folder, ignore_errors=True)
        return self.attempt(self.cfg, show_progress=False, model_dir=self.folder / "model")

    def discard(self) -> None:
        if self._process.is_alive():
            self._process.terminate()
        self._process.join()
        self._receive.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def _run_speculative(send, attempt, cfg, model_dir: Path) -> None:
    """Child process body of :class:`SpeculativeAttempt`: one torch thread, stop with the parent."""
    import signal

    import torch

    torch.set_num_threads(1)
    try:  # Linux: receive SIGTERM if the parent dies (a killed prepare leaves no SFT running)
        import ctypes

        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    try:
        send.send(("ok", attempt(cfg, show_progress=False, model_dir=model_dir)))
    except Exception as error:  # noqa: BLE001 - reported to the parent, which runs the attempt itself
        send.send(("error", f"{type(error).__name__}: {error}"))
    finally:
        send.close()


# A warm start below this copy accuracy makes a demo whose RL has (almost) nothing to learn from.
# Measured (docs/quickstart.md): the documented seeds' 1000-step warm starts 0.85, 0.99, 1.00; one
# made on an idle machine with two torch threads 0.42 (RL: 0.000 -> 0.000). The copying skill
# appears late in SFT, at a step that varies with the seed and the machine; 500 more SFT steps
# on the 0.42 warm start reached only 0.53, so a weak warm start is redone from a fresh
# initialization with another seed, once; the better attempt is kept (a warning when it is still weak).
MIN_COPY_ACCURACY = 0.8
COPY_CHECK_FACTS = 100
SFT_RETRIES = 1  # 1: one retry; 0: none (the code runs at most one)
RETRY_SEED_OFFSET = 1000


def copy_accuracy(model_dir: Path, facts: list[Fact], index_dir: Path, cfg: PrepareConfig) -> float:
    """Share of ``facts`` (the first :data:`COPY_CHECK_FACTS` RL training facts, never seen in SFT) on
    which the warm start, once it chooses to search, writes its searching trajectory exactly
    (teacher-forced, greedy; :func:`~sorl_verl.quickstart.sft.teacher_forced_exact`): it copies the
    entity into its thought and query and the retrieved value into its answer. RL only teaches
    *when* to search, so this is about the ceiling of the score RL can reach from the warm start.

    Measured (docs/quickstart.md): with 1000 SFT steps some seeds and machines did not get there
    (the copying skill appears late in SFT); such a warm start leaves RL no reward to learn from.
    """
    from transformers import AutoTokenizer

    from sorl_verl.quickstart.sft import load_causal_lm, pad_token_id, teacher_forced_exact, tokenize_trajectory

    facts = facts[:COPY_CHECK_FACTS]
    if not facts:
        return float("nan")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = load_causal_lm(model_dir, cfg.sft_attention)
    segments = demonstration_segments(facts, index_dir, cfg.topk)
    examples = [
        tokenize_trajectory(tokenizer, prompt_messages(f.question), demo, cfg.max_obs_length)
        for f, demo in zip(facts, segments, strict=True)
    ]
    search_tag = tokenizer.convert_tokens_to_ids("<search>")
    return teacher_forced_exact(model, examples, pad_token_id(tokenizer), ignore_targets=[search_tag])


class PrepareMismatch(ValueError):
    """``prepare.json`` of a run folder records other settings than the ones asked for."""


# settings added to WarmStartConfig after folders were prepared without them: what those folders used
LEGACY_SETTINGS = {"sft_attention": "eager"}


def check_prepared(marker: Path, cfg: WarmStartConfig) -> dict:
    """The content of an existing ``prepare.json``, if its settings equal ``cfg``; else :class:`PrepareMismatch`."""
    try:
        info = json.loads(marker.read_text(encoding="utf-8"))
        recorded = info["config"]
        if not isinstance(recorded, dict):
            raise TypeError("field 'config' is not an object")
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise PrepareMismatch(
            f"{marker}: not a prepare record ({e}); remove the run folder to prepare it again"
        ) from None
    wanted = json.loads(json.dumps(asdict(cfg)))  # the types the JSON round trip gives (tuples -> lists)
    recorded = {**LEGACY_SETTINGS, **recorded}
    differ = sorted(
        k for k in set(wanted) | set(recorded) if recorded.get(k, "<missing>") != wanted.get(k, "<missing>")
    )
    if differ:
        details = ", ".join(
            f"{k}: prepared {recorded.get(k, '<missing>')!r}, asked {wanted.get(k, '<missing>')!r}" for k in differ
        )
        raise PrepareMismatch(
            f"{marker}: this run folder was prepared with other settings ({details}). The warm start's "
            "demonstrations would not match this run: use a new --out folder, or the settings it was prepared with."
        )
    return info


def prepare_run(
    run_dir: str | os.PathLike,
    cfg: WarmStartConfig,
    build_task: Callable[[Path, WarmStartConfig], list],
    build_model: Callable[..., dict],
    describe: Callable[[list], dict],
    show_progress: bool = True,
) -> dict:
    """Steps 1-2 of a quick-start task into ``run_dir`` unless ``prepare.json`` says they are done.

    ``build_task(run_dir / "task", cfg)`` returns the task's items, ``build_model(run_dir, items, cfg,
    show_progress=...)`` the warm start's stats, ``describe(items)`` the counts recorded beside them.
    Returns ``prepare.json``'s content (written last: it marks completion); raises
    :class:`PrepareMismatch` when it exists with settings other than ``cfg``.
    """
    run_dir = Path(run_dir)
    marker = run_dir / PREPARE_MARKER
    if marker.is_file():
        return check_prepared(marker, cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    items = build_task(run_dir / "task", cfg)
    task_seconds = time.time() - started
    model_stats = build_model(run_dir, items, cfg, show_progress=show_progress)
    info = {
        "config": asdict(cfg),
        **describe(items),
        "task_seconds": round(task_seconds, 1),
        "model_seconds": round(time.time() - started - task_seconds, 1),
        **model_stats,
    }
    write_text_atomic(marker, json.dumps(info, indent=2) + "\n")
    return info


def prepare(run_dir: str | os.PathLike, cfg: PrepareConfig | None = None, show_progress: bool = True) -> dict:
    """Run steps 1-2 into ``run_dir`` unless ``prepare.json`` says they are done; returns its content.

    Raises :class:`PrepareMismatch` when ``prepare.json`` exists with settings other than ``cfg``.
    """
    fresh = not (Path(run_dir) / PREPARE_MARKER).is_file()

    def describe(facts: list[Fact]) -> dict:
        return {"facts": {s: sum(f.split == s for f in facts) for s in ("sft", "train", "val")}}

    info = prepare_run(run_dir, cfg or PrepareConfig(), build_task, build_model, describe, show_progress)
    if fresh:
        warn_weak_warm_start(info)
    return info


def warn_weak_warm_start(info: dict) -> bool:
    """Print a warning (stderr) when the warm start's ``copy_accuracy`` is below :data:`MIN_COPY_ACCURACY`."""
    copy = info.get("copy_accuracy")
    if copy is None or not copy < MIN_COPY_ACCURACY:
        return False
    print(
        f"warning: the warm start writes its searching trajectory right on only {copy:.0%} of {COPY_CHECK_FACTS} "
        f"held-out facts (copy_accuracy in prepare.json; {MIN_COPY_ACCURACY:.0%} or more expected), so RL will "
        "find little reward to learn from. Prepare again in a new folder with more SFT steps "
        "(PREPARE_ARGS='--sft-steps 2000') or another SEED.",
        file=sys.stderr,
    )
    return True
