"""Pyserini (Lucene BM25, ``sorl-index --method pyserini``) beside our BM25 on the same corpora and queries.

    python benchmarks/pyserini/compare.py --passages 10000 100000      # + the embedded corpus
    python benchmarks/pyserini/compare.py --passages 1000000 --no-embedded --lucene-threads 2

Needs pyserini and Java (docs/retrieval.md, "Pyserini"); without them it says what to install.
``bench_retrieval.py --pyserini`` calls :func:`pyserini_comparison` and prints :func:`format_table`.

For each corpus, the embedded Wikipedia corpus (10,033 passages; its 19,867 questions of
``sorl_verl.retrieval.quality``) and the bench's synthetic corpora (``bench_retrieval.py``'s
generator: 100-word passages; queries are 5 distinct non-stopword words of a random passage, the
passage being the answer), both indexes are built (kept under ``--work`` for reruns) and loaded in
this process, and on the same queries, top-3:

* queries/s one query at a time (``search([q])``: what a Search-R1 rollout worker's request does
  without micro-batching), and in batches of 512 on ``--threads`` threads (ours: Python threads
  over numpy; Pyserini: Anserini's ``batch_search`` on Java threads). Both include fetching the
  documents from ``docs.jsonl``. Best of ``repeats`` passes after a warm-up pass;
* recall@3: the right article (embedded questions) or the source passage (synthetic queries);
* top-3 overlap (mean of |ours ∩ Lucene| / 3 per query) and top-1 agreement.

Both sides score BM25 with k1=0.9, b=0.4 (Lucene's variant); the analyzers differ (Lucene's English
analyzer with Porter stemming vs ours, Snowball stemming and bm25s's stopwords).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import re
import sys
import timeit
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # the repository, for a venv that has pyserini but not sorl-verl
sys.path.insert(0, str(HERE.parent))  # benchmarks/, for bench_retrieval

from sorl_verl.retrieval import build_index, embedded_corpus_path, load_retriever  # noqa: E402
from sorl_verl.retrieval.corpus import write_jsonl_atomic  # noqa: E402

TOPK = 3
BATCH = 512


def folder_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


def synthetic_corpus_path(work: Path, passages: int) -> Path:
    """The bench's synthetic corpus of ``passages`` rows under ``work``, generated once (streamed:
    ``bench_retrieval.synthetic_corpus`` writes the same rows but also returns them as a list)."""
    from bench_retrieval import synthetic_rows, synthetic_texts

    path = work / f"synthetic_{passages}.jsonl"
    done = path.with_name(path.name + ".done")
    if not (path.is_file() and done.is_file()):
        write_jsonl_atomic(synthetic_rows(synthetic_texts(passages)), path)
        done.write_text(f"{passages}\n")
    return path


def synthetic_queries(corpus: Path, count: int, seed: int = 1) -> tuple[list[str], list[str]]:
    """``count`` queries of 5 distinct non-stopword words of a random passage, and that passage's id."""
    from sorl_verl.retrieval.bm25 import TOKEN_PATTERN, stopword_set
    from sorl_verl.retrieval.corpus import MmapCorpus

    split, stopwords = re.compile(TOKEN_PATTERN).findall, stopword_set("en")
    docs = MmapCorpus(corpus, show_progress=False)
    rng = random.Random(seed)
    queries, answers = [], []
    while len(queries) < count:
        row = docs[rng.randrange(len(docs))]
        words = sorted(
            {w for w in row["contents"].split("\n", 1)[1].split() if any(t not in stopwords for t in split(w.lower()))}
        )
        queries.append(" ".join(rng.sample(words, min(5, len(words)))))
        answers.append(row["id"])
    docs.close()
    return queries, answers


def built(corpus: Path, index_dir: Path, method: str, **opts) -> tuple[Path, float]:
    """``index_dir`` (built now unless a complete one is there) and its build seconds (meta.json)."""
    if not (index_dir / "meta.json").is_file():
        build_index(corpus, index_dir, method=method, overwrite=index_dir.exists(), show_progress=False, **opts)
    return index_dir, json.loads((index_dir / "meta.json").read_text())["build_seconds"]


def queries_per_s(retriever, queries: list[str], batch: int, repeats: int) -> float:
    """Best of ``repeats`` passes over ``queries`` in batches of ``batch`` (1: one query at a time)."""
    spans = [queries[i : i + batch] for i in range(0, len(queries), batch)]
    seconds = timeit.repeat(lambda: [retriever.search(span, topk=TOPK) for span in spans], number=1, repeat=repeats)
    return len(queries) / min(seconds)


def top_ids(retriever, queries: list[str]) -> list[list[str]]:
    ids = []
    for i in range(0, len(queries), BATCH):
        ids += [[h["document"]["id"] for h in hits] for hits in retriever.search(queries[i : i + BATCH], topk=TOPK)]
    return ids


def compare_one(
    name: str,
    corpus: Path,
    work: Path,
    queries: list[str],
    answers: list[str],
    threads: int,
    lucene_threads: int,
    timed_queries: int,
    repeats: int,
) -> dict:
    """One row of :func:`pyserini_comparison` (see the module docstring for the figures)."""
    ours_dir, ours_build = built(corpus, work / f"{name}_bm25", "bm25")
    lucene_dir, lucene_build = built(corpus, work / f"{name}_pyserini", "pyserini", threads=lucene_threads)
    ours, lucene = load_retriever(ours_dir), load_retriever(lucene_dir)
    row = {
        "corpus": name,
        "passages": len(ours),
        "queries": len(queries),
        "timed_queries": min(timed_queries, len(queries)),
        "build_s_ours": ours_build,
        "build_s_pyserini": lucene_build,
        "lucene_build_threads": lucene_threads,
        "index_mb_ours": round(folder_mb(ours_dir), 1),
        "index_mb_pyserini": round(folder_mb(lucene_dir), 1),
        "search_threads": threads,
        "load_start": round(os.getloadavg()[0], 2),
    }
    timed = queries[:timed_queries]
    for side, retriever in (("ours", ours), ("pyserini", lucene)):
        retriever.set_search_threads(threads)
        retriever.search(timed[:BATCH], topk=TOPK)  # warm-up: page cache, JIT
        row[f"qps_one_{side}"] = round(queries_per_s(retriever, timed, 1, repeats), 1)
        row[f"qps_batch_{side}"] = round(queries_per_s(retriever, timed, BATCH, repeats), 1)
    row["load_end"] = round(os.getloadavg()[0], 2)
    mine, theirs = top_ids(ours, queries), top_ids(lucene, queries)
    row["recall@3_ours"] = round(sum(a in ids for a, ids in zip(answers, mine, strict=True)) / len(queries), 4)
    row["recall@3_pyserini"] = round(sum(a in ids for a, ids in zip(answers, theirs, strict=True)) / len(queries), 4)
    row["top3_overlap"] = round(
        sum(len(set(a) & set(b)) for a, b in zip(mine, theirs, strict=True)) / (TOPK * len(queries)), 4
    )
    row["top1_agreement"] = round(
        sum(bool(a) and bool(b) and a[0] == b[0] for a, b in zip(mine, theirs, strict=True)) / len(queries), 4
    )
    ours.close()
    lucene.close()
    gc.collect()
    return row


def pyserini_comparison(
    passages: tuple[int, ...] = (10_000, 100_000),
    work: str | Path = "/tmp/pyserini_compare",
    embedded: bool = True,
    queries: int = 2_000,
    timed_queries: int = 2_000,
    threads: int | None = None,
    lucene_threads: int = 1,
    repeats: int = 2,
    log=print,
) -> list[dict]:
    """Pyserini vs ours on the embedded corpus (all its questions; ``timed_queries`` of them timed)
    and on synthetic corpora of each size in ``passages`` (``queries`` synthetic queries); one dict a
    corpus (keys: see :func:`format_table`). ``threads``: search threads on both sides (default: the
    CPUs this process may use); ``lucene_threads``: Anserini indexing threads. Raises
    :class:`~sorl_verl.retrieval.lucene.PyseriniUnavailable` (an ``ImportError`` naming what to
    install) when pyserini or Java is missing."""
    from sorl_verl.retrieval.bm25 import default_search_threads
    from sorl_verl.retrieval.lucene import require_pyserini
    from sorl_verl.retrieval.quality import load_questions

    versions = require_pyserini()
    work = Path(work)
    work.mkdir(parents=True, exist_ok=True)
    threads = threads or default_search_threads()
    rows = []
    if embedded:
        questions = load_questions(embedded_corpus_path())
        random.Random(0).shuffle(questions)
        log(f"pyserini {versions['pyserini']} on Java {versions['java']}: embedded corpus, {len(questions)} questions")
        rows.append(
            compare_one(
                "embedded",
                embedded_corpus_path(),
                work,
                [q.text for q in questions],
                [q.answer_id for q in questions],
                threads,
                lucene_threads,
                timed_queries,
                repeats,
            )
        )
        log(json.dumps(rows[-1]))
    for n in passages:
        log(f"synthetic corpus of {n:,} passages (generated once into {work})")
        corpus = synthetic_corpus_path(work, n)
        texts, answers = synthetic_queries(corpus, queries)
        rows.append(
            compare_one(f"synthetic_{n}", corpus, work, texts, answers, threads, lucene_threads, timed_queries, repeats)
        )
        log(json.dumps(rows[-1]))
    return rows


COLUMNS = [
    ("corpus", "corpus", "{}"),
    ("passages", "passages", "{:,}"),
    ("build s ours/Lucene", ("build_s_ours", "build_s_pyserini"), "{:.0f} / {:.0f}"),
    ("index MB ours/Lucene", ("index_mb_ours", "index_mb_pyserini"), "{:.0f} / {:.0f}"),
    ("q/s one ours/Lucene", ("qps_one_ours", "qps_one_pyserini"), "{:.0f} / {:.0f}"),
    ("q/s batch ours/Lucene", ("qps_batch_ours", "qps_batch_pyserini"), "{:.0f} / {:.0f}"),
    ("recall@3 ours/Lucene", ("recall@3_ours", "recall@3_pyserini"), "{:.4f} / {:.4f}"),
    ("top-3 overlap", "top3_overlap", "{:.1%}"),
    ("top-1 agree", "top1_agreement", "{:.1%}"),
    ("load", ("load_start", "load_end"), "{:.1f}-{:.1f}"),
]


def format_table(rows: list[dict]) -> str:
    """A markdown table of :func:`pyserini_comparison`'s rows."""
    cells = [
        [fmt.format(*(r[k] for k in (keys if isinstance(keys, tuple) else (keys,)))) for _, keys, fmt in COLUMNS]
        for r in rows
    ]
    lines = ["| " + " | ".join(name for name, _, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(c) + " |" for c in cells]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passages", type=int, nargs="*", default=[10_000, 100_000], help="synthetic corpus sizes")
    parser.add_argument("--no-embedded", action="store_true", help="skip the embedded Wikipedia corpus")
    parser.add_argument("--work", type=Path, default=Path("/tmp/pyserini_compare"), help="corpora and indexes (kept)")
    parser.add_argument("--queries", type=int, default=2_000, help="synthetic queries per corpus")
    parser.add_argument("--timed-queries", type=int, default=2_000, help="queries timed per corpus and mode")
    parser.add_argument("--threads", type=int, default=None, help="search threads, both sides (default: CPUs)")
    parser.add_argument("--lucene-threads", type=int, default=1, help="Anserini indexing threads")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    if any(n < 1 for n in args.passages) or args.queries < 1 or args.timed_queries < 1 or args.repeats < 1:
        parser.error("--passages, --queries, --timed-queries and --repeats must be positive")
    print(f"machine: {os.cpu_count()} CPUs, 1-min load {os.getloadavg()[0]:.1f} at start")
    try:
        rows = pyserini_comparison(
            tuple(args.passages),
            args.work,
            not args.no_embedded,
            args.queries,
            args.timed_queries,
            args.threads,
            args.lucene_threads,
            args.repeats,
        )
    except ImportError as e:
        print(f"compare.py: {e}", file=sys.stderr)
        sys.exit(2)
    print(format_table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
