"""Memory-mapped corpus (sorl_verl.retrieval.corpus.MmapCorpus) beside loading the corpus into lists.

::

    python benchmarks/artifacts/bench_mmap_corpus.py --passages 300000

Writes a synthetic corpus with bench_retrieval's generator, then, each in a fresh process:
``mmap`` builds the offset table (timed), opens the corpus, reads 20,000 random rows; ``lists``
reads every row into ``ids``/``contents`` lists (what an index folder's ``docs.jsonl`` loader does).
Prints one line per mode: seconds, rows/s, anonymous and file-backed resident memory added, peak (VmHWM).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]


def memory_mb() -> dict:
    """This process's resident memory in MB: anonymous (its own objects) and file-backed (mapped
    file pages: shared, reclaimable page cache), and the peak of the total (VmHWM)."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return {k: int(fields[k].split()[0]) / 1024 for k in ("RssAnon", "RssFile", "VmHWM")}


def run_mode(mode: str, corpus: Path, reads: int) -> dict:
    import numpy as np

    baseline = memory_mb()
    started = time.perf_counter()
    if mode == "mmap":
        from sorl_verl.retrieval.corpus import MmapCorpus

        docs = MmapCorpus(corpus, show_progress=False)
        opened = time.perf_counter() - started
        rows = np.random.default_rng(0).integers(0, len(docs), reads)
        started_reads = time.perf_counter()
        for row in rows:
            docs[row]
        reads_per_s = reads / (time.perf_counter() - started_reads)
        table_mb = (docs.offsets_dir / "offsets.npy").stat().st_size / 2**20
        count = len(docs)
    else:
        from sorl_verl.retrieval.corpus import iter_corpus

        ids, contents = [], []
        for doc in iter_corpus(corpus):
            ids.append(doc.id)
            contents.append(doc.contents)
        opened = time.perf_counter() - started
        reads_per_s, table_mb, count = None, None, len(ids)
    memory = memory_mb()
    return {
        "mode": mode,
        "rows": count,
        "open_s": round(opened, 2),
        "random_reads_per_s": reads_per_s and round(reads_per_s),
        "anon_mb_added": round(memory["RssAnon"] - baseline["RssAnon"], 1),
        "file_mb_added": round(memory["RssFile"] - baseline["RssFile"], 1),
        "peak_mb": round(memory["VmHWM"], 1),
        "offsets_mb": table_mb and round(table_mb, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--passages", type=int, default=300_000)
    parser.add_argument("--reads", type=int, default=20_000)
    parser.add_argument("--mode", choices=("mmap", "lists"), help=argparse.SUPPRESS)
    parser.add_argument("--corpus", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        print(json.dumps(run_mode(args.mode, args.corpus, args.reads)))
        return
    from bench_retrieval import synthetic_corpus

    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "synthetic.jsonl"
        synthetic_corpus(corpus, args.passages)
        print(f"corpus: {args.passages:,} passages, {corpus.stat().st_size / 2**20:.0f} MB")
        for mode in ("mmap", "mmap", "lists"):  # the second mmap run finds the table built
            out = subprocess.run(
                [sys.executable, __file__, "--mode", mode, "--corpus", str(corpus), "--reads", str(args.reads)],
                check=True,
                capture_output=True,
                text=True,
            )
            print(out.stdout.strip())


if __name__ == "__main__":
    main()
