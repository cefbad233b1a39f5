"""BM25 at wiki-18 scale: build time and peak memory, index size, retriever memory and queries/s
against corpus size, fitted and projected to wiki-18's 21M passages.

    python benchmarks/bench_bm25_scale.py                            # print the committed table (what make bench runs)
    nice -n 5 python benchmarks/bench_bm25_scale.py --scale 1000000 2000000 5000000   # measure (about an hour)
    python benchmarks/bench_bm25_scale.py --scale 1000000 --compare-in-memory        # also the former bm25s build

For each size N, on the synthetic corpus of ``bench_retrieval.py`` (passages of 100 words drawn
from the embedded Wikipedia corpus's word frequencies; queries are 5 distinct non-stopword words
of a random passage), each step in a child process of its own:

* ``sorl-index`` (the bounded build, in its default index layout, see docs/retrieval.md): wall
  time, peak resident memory (the child's ``VmHWM``, which counts every page it touched, file
  pages included), and the size on disk of the BM25 arrays and of ``docs.jsonl`` with its offset
  table;
* the retriever (``load_retriever``, what ``sorl-retriever`` serves): resident memory after
  loading and after 1,000 queries (total, anonymous, and mapped-file pages, from /proc), and
  queries/s in batches of 512, top-3, on 1 and on 2 search threads (best of 3 passes over 1,024
  queries, after the 1,000 warm-up queries).

Then each figure is fitted by least squares as ``a + b * N`` (time per query for queries/s) and
projected to N = 21,000,000 against the targets: build peak <= 16 GB, retriever memory <= 8 GB,
queries/s per core >= (the 1M figure) / 21. The figures go to ``docs/figures/bm25_scale.csv`` and
``.md``; synthetic corpora and indexes to ``--work`` (default /tmp/bm25_scale), kept for reruns.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import io
import json
import os
import random
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
FIGURES = REPO / "docs" / "figures"
CSV_PATH = FIGURES / "bm25_scale.csv"
MD_PATH = FIGURES / "bm25_scale.md"
WIKI18 = 21_000_000
TARGET_BUILD_PEAK_GB = 16.0
TARGET_RSS_GB = 8.0
BATCH = 512
TOPK = 3
WARM_QUERIES = 1000
TIMED_QUERIES = 1024
GB = 1e9
COLD_QUERIES = 256

BUILD_COLUMNS = [
    "passages",
    "build_s",
    "build_cpu_s",
    "build_peak_gb",
    "bm25_bytes",
    "docs_bytes",
    "vocab",
    "postings",
    "load_avg_build",
]
COLUMNS = BUILD_COLUMNS + [
    "load_s",
    "rss_load_mb",
    "anon_load_mb",
    "rss_1000q_mb",
    "anon_1000q_mb",
    "file_1000q_mb",
    "qps_1_thread",
    "qps_2_threads",
    "qps_cpu_1_thread",
    "qps_cpu_2_threads",
    "qps_cpu_cold",
    "postings_per_query",
    "visits_per_query",
    "qps_cpu_exhaustive",
    "load_avg_search",
]


def proc_status() -> dict[str, float]:
    """VmRSS, VmHWM, RssAnon, RssFile of this process in MB (10**6 bytes; Linux /proc)."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            fields[key] = int(value.split()[0]) * 1024 / 1e6
    return fields


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ---------------------------------------------------------------- child processes (one per step)


def child_build(corpus: str, index: str, in_memory: bool) -> dict:
    from sorl_verl.retrieval import build_index

    started = time.perf_counter()
    if in_memory:  # the former build_index: the corpus in lists, bm25s's Tokenizer and BM25.index
        from sorl_verl.retrieval.bm25 import BM25_DIR, build_bm25_in_memory
        from sorl_verl.retrieval.corpus import iter_corpus
        from sorl_verl.retrieval.store import write_docs, write_meta

        docs = list(iter_corpus(corpus))
        ids, contents = [d.id for d in docs], [d.contents for d in docs]
        del docs
        out = Path(index)
        (out / BM25_DIR).mkdir(parents=True)
        meta = build_bm25_in_memory(contents, out, show_progress=True)
        write_docs(out, ids, contents)
        write_meta(out, {"method": "bm25", "num_docs": len(ids), "corpus": corpus, **meta})
    else:
        build_index(corpus, index, show_progress=True)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return {"build_s": time.perf_counter() - started, "cpu_s": usage.ru_utime + usage.ru_stime, **proc_status()}


def child_search(index: str, queries_path: str) -> dict:
    from sorl_verl.retrieval import load_retriever

    queries = json.loads(Path(queries_path).read_text())
    started = time.perf_counter()
    retriever = load_retriever(index)
    result = {"load_s": time.perf_counter() - started, "after_load": proc_status()}
    warm, timed = queries[:WARM_QUERIES], queries[WARM_QUERIES : WARM_QUERIES + TIMED_QUERIES]
    for i in range(0, len(warm), BATCH):
        retriever.search(warm[i : i + BATCH], topk=TOPK)
    result["after_1000"] = proc_status()
    for threads in (1, 2):
        retriever.set_search_threads(threads)
        wall, cpu = [], []
        for _ in range(3):
            start, start_cpu = time.perf_counter(), time.process_time()
            for i in range(0, len(timed), BATCH):
                retriever.search(timed[i : i + BATCH], topk=TOPK)
            wall.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)  # all threads of this process
        result[f"qps_{threads}"] = len(timed) / min(wall)
        result[f"qps_cpu_{threads}"] = len(timed) / min(cpu)
    result["qps_cpu_cold"] = cold_queries_per_cpu_second(retriever, timed[:COLD_QUERIES])
    token_ids = [retriever.query_token_ids(q) for q in timed]
    result["postings_per_query"] = float(np.mean([sum(map(len, retriever._postings(ids))) for ids in token_ids]))
    # MaxScore's work: postings read from the essential lists plus seeks into the others
    result["visits_per_query"] = (
        float(np.mean([retriever._index.top_k_maxscore(ids, TOPK)[2].sum() for ids in token_ids]))
        if retriever.prune
        else float("nan")
    )
    if retriever.prune:  # the same queries scoring every posting (BM25Retriever(prune=False)), 1 thread, one pass
        retriever.prune = False
        retriever.set_search_threads(1)
        start_cpu = time.process_time()
        for i in range(0, len(timed), BATCH):
            retriever.search(timed[i : i + BATCH], topk=TOPK)
        result["qps_cpu_exhaustive"] = len(timed) / (time.process_time() - start_cpu)
    else:
        result["qps_cpu_exhaustive"] = result["qps_cpu_1"]
    result["after_timing"] = proc_status()
    return result


def last_level_cache_bytes() -> int:
    """The largest CPU cache's size (Linux sysfs), or 128 MiB when it cannot be read."""
    sizes = []
    for path in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = path.read_text().strip()
        unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        sizes.append(int(text.rstrip("KMG")) * unit)
    return max(sizes, default=128 << 20)


def cold_queries_per_cpu_second(retriever, queries: list[str]) -> float:
    """Queries per CPU-second on 1 thread with the CPU caches flushed before each query (a write pass
    over a scratch array of twice the last-level cache, not timed): what a query costs when none of
    its postings are still cached from earlier queries, as at wiki-18 scale."""
    retriever.set_search_threads(1)
    scratch = np.zeros(2 * last_level_cache_bytes() // 8, dtype=np.float64)
    cpu = 0.0
    for query in queries:
        scratch += 1.0
        start = time.process_time()
        retriever.search([query], topk=TOPK)
        cpu += time.process_time() - start
    return len(queries) / cpu


def run_child(args: list[str], log: Path) -> dict:
    """Run this script with ``args`` in a child process; returns its JSON result. A child reports its
    own peak (``VmHWM``: reset by exec, so it is the child's alone; ``ru_maxrss`` from ``wait4`` would
    also count the pages the child shared with this process between fork and exec)."""
    with open(log, "w") as err:
        proc = subprocess.run([sys.executable, __file__, *args], stdout=subprocess.PIPE, stderr=err, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"child {args[0]} failed with exit code {proc.returncode}; see {log}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- corpus and queries


def synthetic_corpus_file(work: Path, passages: int) -> Path:
    """The bench's synthetic corpus of ``passages`` rows under ``work`` (generated once, streamed)."""
    sys.path.insert(0, str(HERE))
    from bench_retrieval import synthetic_rows, synthetic_texts

    from sorl_verl.retrieval.corpus import write_jsonl_atomic

    path = work / f"synthetic_{passages}.jsonl"
    done = path.with_name(path.name + ".done")
    if not (path.is_file() and done.is_file()):
        started = time.perf_counter()
        write_jsonl_atomic(synthetic_rows(synthetic_texts(passages)), path)
        done.write_text(f"{passages}\n")
        print(f"   generated {path} in {time.perf_counter() - started:.0f} s ({path.stat().st_size / GB:.2f} GB)")
    return path


def synthetic_queries(corpus: Path, count: int, seed: int = 1) -> list[str]:
    """``count`` queries of 5 distinct non-stopword words of a random passage (as bench_retrieval.py)."""
    from sorl_verl.retrieval.bm25 import TOKEN_PATTERN, stopword_set
    from sorl_verl.retrieval.corpus import MmapCorpus

    split, stopwords = re.compile(TOKEN_PATTERN).findall, stopword_set("en")
    docs = MmapCorpus(corpus, show_progress=False)
    rng = random.Random(seed)
    queries = []
    while len(queries) < count:
        text = docs[rng.randrange(len(docs))]["contents"].split("\n", 1)[1]
        words = sorted({w for w in text.split() if any(t not in stopwords for t in split(w.lower()))})
        queries.append(" ".join(rng.sample(words, min(5, len(words)))))
    docs.close()
    return queries


# ---------------------------------------------------------------- measurement, fit, tables


def measure(passages: int, work: Path, saved: dict | None = None) -> dict:
    """Build and search figures of one size; with ``saved`` (an earlier row), only the search step is rerun."""
    print(f"\n-- {passages:,} passages (1-min load {os.getloadavg()[0]:.1f})", flush=True)
    corpus = synthetic_corpus_file(work, passages)
    index = work / f"index_{passages}"
    if saved is None:
        shutil.rmtree(index, ignore_errors=True)
        load_before = os.getloadavg()[0]
        build = run_child(["--_build", str(corpus), str(index)], work / f"build_{passages}.log")
        meta = json.loads((index / "meta.json").read_text())
        row = {
            "passages": passages,
            "build_s": build["build_s"],
            "build_cpu_s": build["cpu_s"],
            "build_peak_gb": build["VmHWM"] * 1e6 / GB,
            "bm25_bytes": folder_bytes(index / "bm25"),
            "docs_bytes": folder_bytes(index) - folder_bytes(index / "bm25"),
            "vocab": meta["bm25"]["vocab_size"],
            "postings": meta["bm25"]["postings"],
            "layout": meta["bm25"].get("layout", 1),
            "load_avg_build": (load_before + os.getloadavg()[0]) / 2,
            "build_measured": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        }
        print(
            f"   build {row['build_s']:.0f} s ({row['build_cpu_s']:.0f} s CPU), peak {row['build_peak_gb']:.2f} GB "
            f"(VmHWM), vocabulary {row['vocab']:,}, {row['postings']:,} postings; index {row['bm25_bytes'] / GB:.2f} GB "
            f"+ docs {row['docs_bytes'] / GB:.2f} GB (1-min load {row['load_avg_build']:.1f})",
            flush=True,
        )
    else:
        row = {k: saved.get(k, float("nan")) for k in BUILD_COLUMNS}  # build_cpu_s: not in older rows
        row["build_measured"] = saved.get("build_measured", "?")
        row["layout"] = saved.get("layout", 1)
    queries_path = work / f"queries_{passages}.json"
    queries_path.write_text(json.dumps(synthetic_queries(corpus, WARM_QUERIES + TIMED_QUERIES)))
    load_before = os.getloadavg()[0]
    search = run_child(["--_search", str(index), str(queries_path)], work / f"search_{passages}.log")
    row.update(
        {
            "load_s": search["load_s"],
            "rss_load_mb": search["after_load"]["VmRSS"],
            "anon_load_mb": search["after_load"]["RssAnon"],
            "rss_1000q_mb": search["after_1000"]["VmRSS"],
            "anon_1000q_mb": search["after_1000"]["RssAnon"],
            "file_1000q_mb": search["after_1000"]["RssFile"],
            "qps_1_thread": search["qps_1"],
            "qps_2_threads": search["qps_2"],
            "qps_cpu_1_thread": search["qps_cpu_1"],
            "qps_cpu_2_threads": search["qps_cpu_2"],
            "qps_cpu_cold": search["qps_cpu_cold"],
            "postings_per_query": search["postings_per_query"],
            "visits_per_query": search["visits_per_query"],
            "qps_cpu_exhaustive": search["qps_cpu_exhaustive"],
            "load_avg_search": (load_before + os.getloadavg()[0]) / 2,
            "measured": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
            "nice": os.nice(0),
        }
    )
    print(
        f"   retriever loaded in {row['load_s']:.1f} s: RSS {row['rss_load_mb']:.0f} MB -> {row['rss_1000q_mb']:.0f} MB "
        f"after {WARM_QUERIES} queries (anonymous {row['anon_1000q_mb']:.0f} MB, file pages "
        f"{row['file_1000q_mb']:.0f} MB); queries/s: {row['qps_1_thread']:.0f} on 1 thread, "
        f"{row['qps_2_threads']:.0f} on 2 (wall clock); {row['qps_cpu_1_thread']:.0f} and "
        f"{row['qps_cpu_2_threads']:.0f} per CPU-second, {row['qps_cpu_cold']:.0f} with the caches flushed before "
        f"each query; {row['postings_per_query']:,.0f} postings a query, of which MaxScore visits "
        f"{row['visits_per_query']:,.0f}; {row['qps_cpu_exhaustive']:.0f} queries per CPU-second scoring every "
        f"posting (1-min load {row['load_avg_search']:.1f})",
        flush=True,
    )
    return row


def fit_line(n: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares ``(a, b)`` of ``y = a + b * n``; with one point, the line through the origin."""
    if len(n) == 1:
        return 0.0, float(y[0] / n[0])
    b, a = np.polyfit(n, y, 1)
    return float(a), float(b)


def projections(rows: list[dict]) -> list[dict]:
    """The 21M figure of each figure with a target (and of a few without): projected by the least-squares
    line over the rows under 21M passages, and measured where a row of 21M passages exists (then the
    measured figure decides the target)."""
    small = [r for r in rows if r["passages"] < WIKI18]
    at_wiki18 = next((r for r in rows if r["passages"] == WIKI18), None)
    n = np.array([r["passages"] for r in small], dtype=np.float64)
    first = min(rows, key=lambda r: r["passages"])
    nan = float("nan")
    out = []

    def add(name, value_of, unit, target=None, better="lower", per_query=False):
        """``value_of(row)``; ``per_query``: a rate, fitted as its inverse (time per query: grows with N)."""
        values = np.array([value_of(r) for r in small], dtype=np.float64)
        projected, fit = nan, ""
        if len(small) and not np.isnan(values).any():
            a, b = fit_line(n, 1.0 / values if per_query else values)
            projected = 1.0 / (a + b * WIKI18) if per_query else a + b * WIKI18
            fit = (
                f"1 / ({a * 1e3:.3g} ms + {b * 1e9:.3g} ms per 1M)" if per_query else f"{a:.3g} + {b * 1e6:.3g} per 1M"
            )
        measured = nan if at_wiki18 is None else value_of(at_wiki18)
        decisive = projected if np.isnan(measured) else measured
        met = None
        if target is not None and not np.isnan(decisive):
            met = bool(decisive <= target if better == "lower" else decisive >= target)
        out.append(
            {
                "figure": name,
                "fit": fit,
                "projected": projected,
                "measured": measured,
                "unit": unit,
                "target": target,
                "met": met,
            }
        )

    add("build peak memory", lambda r: r["build_peak_gb"], "GB", TARGET_BUILD_PEAK_GB)
    add("build time (wall, at the loads above)", lambda r: r["build_s"] / 60, "min")
    add("build CPU time", lambda r: r.get("build_cpu_s", nan) / 60, "min")
    add("index on disk (BM25 arrays)", lambda r: r["bm25_bytes"] / GB, "GB")
    add("docs.jsonl + offset table", lambda r: r["docs_bytes"] / GB, "GB")
    add("retriever RSS after 1000 queries", lambda r: r["rss_1000q_mb"] / 1000, "GB", TARGET_RSS_GB)
    add("  of which anonymous", lambda r: r["anon_1000q_mb"] / 1000, "GB")
    # CPU seconds per query (load-independent; grows with the posting lists, i.e. with N)
    target = first["qps_cpu_1_thread"] * first["passages"] / WIKI18
    add("queries per CPU-second (1 thread)", lambda r: r["qps_cpu_1_thread"], "queries/s", target, "higher", True)
    cold = first.get("qps_cpu_cold", nan) * first["passages"] / WIKI18
    add(
        "  with the caches flushed before each query",
        lambda r: r.get("qps_cpu_cold", nan),
        "queries/s",
        cold,
        "higher",
        True,
    )
    full = first.get("qps_cpu_exhaustive", nan) * first["passages"] / WIKI18
    add(
        "  scoring every posting (no pruning)",
        lambda r: r.get("qps_cpu_exhaustive", nan),
        "queries/s",
        full,
        "higher",
        True,
    )
    return out


def markdown(rows: list[dict], projected: list[dict], context: str) -> str:
    lines = [
        "| passages | build: wall (CPU) | build peak | BM25 arrays | docs + offsets | vocabulary | postings | "
        "retriever RSS: loaded / after 1000 queries | of which anonymous | queries/s, 1 / 2 threads (wall) | "
        "queries per CPU-second, 1 / 2 threads; caches flushed | postings a query | MaxScore visits a query | "
        "queries per CPU-second scoring every posting | 1-min load: build / search |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cpu = "" if r["build_cpu_s"] != r["build_cpu_s"] else f" ({r['build_cpu_s'] / 60:.1f})"
        cold = r.get("qps_cpu_cold", float("nan"))
        lines.append(
            f"| {r['passages'] / 1e6:g}M | {r['build_s'] / 60:.1f}{cpu} min | {r['build_peak_gb']:.2f} GB | "
            f"{r['bm25_bytes'] / GB:.2f} GB | {r['docs_bytes'] / GB:.2f} GB | {int(r['vocab']):,} | "
            f"{int(r['postings']):,} | {r['rss_load_mb'] / 1000:.2f} / {r['rss_1000q_mb'] / 1000:.2f} GB | "
            f"{r['anon_1000q_mb'] / 1000:.2f} GB | {r['qps_1_thread']:.0f} / {r['qps_2_threads']:.0f} | "
            f"{r['qps_cpu_1_thread']:.0f} / {r['qps_cpu_2_threads']:.0f}; {cold:.0f} | "
            f"{r.get('postings_per_query', float('nan')):,.0f} | {r.get('visits_per_query', float('nan')):,.0f} | "
            f"{r.get('qps_cpu_exhaustive', float('nan')):.1f} | "
            f"{r['load_avg_build']:.1f} / {r['load_avg_search']:.1f} |"
        )
    lines += [
        "",
        f"At {WIKI18 / 1e6:g}M passages: projected by least squares `a + b*N` over the rows under {WIKI18 / 1e6:g}M "
        "(queries/s from the fitted time per query), and measured where the table has a "
        f"{WIKI18 / 1e6:g}M row (the measured figure then decides the target; targets on queries/s: the "
        f"smallest size's figure / ({WIKI18:,} / its passages), i.e. no worse than linear):",
        "",
        f"| figure | fit | {WIKI18 / 1e6:g}M projected | {WIKI18 / 1e6:g}M measured | target | met |",
        "|---|---|---|---|---|---|",
    ]
    for p in projected:
        target = (
            ""
            if p["target"] is None or p["target"] != p["target"]
            else f"{'>=' if 'queries' in p['unit'] else '<='} {p['target']:.3g} {p['unit']}"
        )
        met = "" if p["met"] is None else ("yes" if p["met"] else "**no**")
        shown = [f"{p[k]:.3g} {p['unit']}" if p[k] == p[k] else "" for k in ("projected", "measured")]
        lines.append(f"| {p['figure']} | {p['fit']} | {shown[0]} | {shown[1]} | {target} | {met} |")
    lines += ["", context]
    return "\n".join(lines) + "\n"


def write_outputs(rows: list[dict], projected: list[dict], context: str) -> None:
    from sorl_verl.fileio import write_text_atomic

    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: (f"{r[k]:.4g}" if isinstance(r[k], float) else r[k]) for k in COLUMNS if k in r})
    write_text_atomic(CSV_PATH, buffer.getvalue())
    write_text_atomic(MD_PATH, markdown(rows, projected, context))


def print_committed() -> None:
    if not MD_PATH.is_file():
        print(
            f"no {MD_PATH.relative_to(REPO)} yet: run `nice -n 5 python {Path(__file__).relative_to(REPO)} "
            "--scale 1000000 2000000 5000000` (about an hour)"
        )
        return
    print(
        f"BM25 at scale: the committed table {MD_PATH.relative_to(REPO)} (a --scale run takes about an hour; "
        f"rerun: nice -n 5 python {Path(__file__).relative_to(REPO)} --scale 1000000 2000000 5000000)\n"
    )
    print(MD_PATH.read_text())


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("--_build", "--_build-in-memory", "--_search"):
        kind, *rest = sys.argv[1:]
        result = child_search(*rest) if kind == "--_search" else child_build(*rest, in_memory=kind != "--_build")
        print(json.dumps(result))
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=int, nargs="+", metavar="N", help="corpus sizes to measure")
    parser.add_argument("--work", type=Path, default=Path("/tmp/bm25_scale"), help="corpora and indexes (kept)")
    parser.add_argument(
        "--compare-in-memory",
        action="store_true",
        help="also build the smallest size with the former in-memory bm25s build",
    )
    parser.add_argument(
        "--no-write",
        action="store_true",
        help="leave docs/figures alone (WORK/row_N.json, which --reuse reads, is still written)",
    )
    parser.add_argument(
        "--remeasure-search",
        action="store_true",
        help="with --reuse: rerun the search step on the kept indexes (the build figures are reused)",
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="take a size's figures from an earlier run's WORK/row_N.json instead of measuring it",
    )
    args = parser.parse_args()
    if not args.scale:
        print_committed()
        return
    if any(n < 1000 for n in args.scale):
        parser.error("--scale sizes must be at least 1000")
    args.work.mkdir(parents=True, exist_ok=True)
    print(
        f"machine: {os.cpu_count()} CPUs, {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / GB:.1f} GB, "
        f"1-min load {os.getloadavg()[0]:.1f}, nice {os.nice(0)}"
    )
    rows = []
    for n in sorted(args.scale):
        saved = args.work / f"row_{n}.json"
        if args.reuse and saved.is_file():
            row = json.loads(saved.read_text())
            if not args.remeasure_search and all(k in row for k in COLUMNS):
                rows.append(row)
                print(f"\n-- {n:,} passages: reusing the measurement in {saved}")
                continue
            rows.append(measure(n, args.work, saved=row))  # the index is kept: only the search step
        else:
            rows.append(measure(n, args.work))
        saved.write_text(json.dumps(rows[-1]) + "\n")
    projected = projections(rows)
    built = sorted(r.get("build_measured", "?") for r in rows)
    searched = sorted(r["measured"] for r in rows)
    layouts = ", ".join(sorted({str(r.get("layout", 1)) for r in rows}))
    context = (
        f"BM25 index layout {layouts} (docs/retrieval.md). "
        f"Builds finished {built[0]} to {built[-1]}, searches measured {searched[0]} to {searched[-1]}, "
        f"by `python benchmarks/bench_bm25_scale.py --scale "
        f"{' '.join(str(n) for n in sorted(args.scale))}` (nice {', '.join(sorted({str(r.get('nice', '?')) for r in rows}))}) on {os.cpu_count()} CPU cores "
        f"shared with other jobs (1-min loads in the table). Synthetic passages of 100 words from the "
        f"embedded corpus's word frequencies, titled `Synthetic i`: the title's number is a term of its own, "
        f"so the vocabulary grows by one term a passage (21M terms at 21M passages), faster than a real "
        f"corpus's; what grows with the vocabulary (the build's term tables; the retriever's vocabulary: a "
        f"dict in layout 1, mapped tables in layout 2) "
        f"is projected high rather than low."
    )
    n = min(args.scale)
    former = args.work / f"in_memory_{n}.json"
    if args.compare_in_memory:
        corpus = synthetic_corpus_file(args.work, n)
        index = args.work / f"index_{n}_in_memory"
        shutil.rmtree(index, ignore_errors=True)
        load = os.getloadavg()[0]
        build = run_child(["--_build-in-memory", str(corpus), str(index)], args.work / f"build_{n}_mem.log")
        figures = {
            "build_s": build["build_s"],
            "cpu_s": build["cpu_s"],
            "peak_gb": build["VmHWM"] * 1e6 / GB,
            "load_before": load,
            "load_after": os.getloadavg()[0],
        }
        former.write_text(json.dumps(figures) + "\n")
        shutil.rmtree(index, ignore_errors=True)
    if former.is_file():  # this run's or an earlier one's
        f = json.loads(former.read_text())
        cpu = f" ({f['cpu_s'] / 60:.1f} min CPU)" if "cpu_s" in f else ""
        line = (
            f"Former in-memory build (bm25s Tokenizer + BM25.index, corpus in lists) of the {n / 1e6:g}M corpus: "
            f"{f['build_s'] / 60:.1f} min{cpu}, peak {f['peak_gb']:.2f} GB (1-min load {f['load_before']:.1f} -> "
            f"{f['load_after']:.1f})."
        )
        print(f"\n-- {line}")
        context += "\n\n" + line
    print("\n" + markdown(rows, projected, context))
    if not args.no_write:
        write_outputs(rows, projected, context)
        print(f"wrote {CSV_PATH.relative_to(REPO)} and {MD_PATH.relative_to(REPO)}")


if __name__ == "__main__":
    main()
