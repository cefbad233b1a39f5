"""Pyserini (Lucene BM25) beside our BM25 on the embedded corpus: queries/s, recall@3, top-3 overlap.

Pyserini is not a dependency of sorl-verl; run this in a throwaway virtual environment that can
also import sorl-verl (docs/retrieval.md, "Pyserini", has the measured figures)::

    python3 -m venv /tmp/pyserini_venv
    echo /work/main/.venv/lib/python3.11/site-packages > /tmp/pyserini_venv/lib/python3.11/site-packages/zz_project.pth
    /tmp/pyserini_venv/bin/pip install --no-deps pyserini==0.25.0 pyjnius onnxruntime openai tiktoken sentencepiece
    JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64 OPENAI_API_KEY=unused \\
        /tmp/pyserini_venv/bin/python benchmarks/pyserini/compare_embedded.py --work /tmp/pyserini_work

pyserini 0.25.0 is the newest release whose Anserini jar is Java 11 bytecode (runs on Debian's
OpenJDK 17); 0.35.0 and later are Java 21 bytecode. ``OPENAI_API_KEY`` only has to be set: pyserini
0.25 builds an OpenAI client when ``pyserini.search`` is imported, and the client refuses an empty
key (nothing is sent anywhere). Both sides use k1=0.9, b=0.4; the analyzers differ (Lucene's
English analyzer with Porter stemming vs ours, see docs/retrieval.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sorl_verl.retrieval import embedded_corpus_path, embedded_index  # noqa: E402
from sorl_verl.retrieval.corpus import iter_corpus  # noqa: E402
from sorl_verl.retrieval.quality import load_questions  # noqa: E402


def build_lucene(work: Path) -> Path:
    docs, index = work / "docs", work / "lucene_index"
    if not index.is_dir():
        docs.mkdir(parents=True, exist_ok=True)
        with open(docs / "docs.jsonl", "w", encoding="utf-8") as f:
            for doc in iter_corpus(embedded_corpus_path()):
                f.write(json.dumps({"id": doc.id, "contents": doc.contents}, ensure_ascii=False) + "\n")
        subprocess.run([sys.executable, "-m", "pyserini.index.lucene", "--collection", "JsonCollection",
                        "--input", str(docs), "--index", str(index), "--generator", "DefaultLuceneDocumentGenerator",
                        "--threads", "1", "--storeRaw"], check=True)
    return index


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="folder for the Lucene index (built once)")
    parser.add_argument("--threads", type=int, default=2, help="threads of pyserini's batch_search")
    args = parser.parse_args()
    from pyserini.search.lucene import LuceneSearcher

    questions = load_questions(embedded_corpus_path())
    texts = [q.text for q in questions]
    searcher = LuceneSearcher(str(build_lucene(args.work)))
    searcher.set_bm25(0.9, 0.4)
    ours = embedded_index()
    out = {"num_questions": len(questions)}

    started = time.perf_counter()
    lucene = [[hit.docid for hit in searcher.search(q, 3)] for q in texts]
    out["pyserini_qps_one_query_at_a_time"] = len(texts) / (time.perf_counter() - started)
    started = time.perf_counter()
    searcher.batch_search(texts, [str(i) for i in range(len(texts))], k=3, threads=args.threads)
    out[f"pyserini_qps_batch_search_{args.threads}_threads"] = len(texts) / (time.perf_counter() - started)
    started = time.perf_counter()
    mine = []
    for start in range(0, len(texts), 512):
        mine += [[hit["document"]["id"] for hit in hits] for hits in ours.search(texts[start : start + 512], topk=3)]
    out["ours_qps_batches_of_512"] = len(texts) / (time.perf_counter() - started)

    for kind in ("description", "first_sentence", "all"):
        rows = [i for i, q in enumerate(questions) if kind in ("all", q.kind)]
        out[f"{kind}/recall@3_pyserini"] = sum(questions[i].answer_id in lucene[i] for i in rows) / len(rows)
        out[f"{kind}/recall@3_ours"] = sum(questions[i].answer_id in mine[i] for i in rows) / len(rows)
        out[f"{kind}/top3_overlap"] = sum(len(set(lucene[i]) & set(mine[i])) for i in rows) / (3 * len(rows))
        out[f"{kind}/top1_agreement"] = sum(bool(lucene[i]) and bool(mine[i]) and lucene[i][0] == mine[i][0]
                                            for i in rows) / len(rows)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
