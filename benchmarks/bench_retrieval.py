"""Retrieval benchmark: BM25 throughput against rank_bm25, retrieval quality, server latency.

    python benchmarks/bench_retrieval.py                 # 10k embedded corpus + server (about a minute)
    python benchmarks/bench_retrieval.py --synthetic 1000000   # adds a synthetic 1M-passage corpus (~10 min, ~8 GB)

Figures printed:

* recall@3 of the right article on the embedded Wikipedia corpus (questions from
  descriptions and first sentences with the title removed, see ``sorl_verl.retrieval.quality``);
* BM25 queries/s for batches of 512 queries, top-3: our ``BM25Retriever`` (bm25s) and
  ``rank_bm25.BM25Okapi`` on the same tokens and the same queries, in the same run, and the
  ratio (target >= 20x). rank_bm25 scores every document in Python, so on large corpora it
  is timed on a subset of the queries (printed) and its rate is extrapolated per query;
* server latency p50/p99 for single-query requests from 32 concurrent clients on
  127.0.0.1, server in its own process (target p99 < 100 ms on the 10k corpus), and with
  ``--load 1000`` the same for 1000 concurrent clients beside it (target 0 errors, p99 <= 400 ms).

    python benchmarks/bench_retrieval.py --server-only --load 1000   # just the two server runs
    python benchmarks/bench_retrieval.py --server-only --drain       # and SIGTERM under load
    python benchmarks/bench_retrieval.py --no-server                 # no server; Pyserini beside ours when installed

Synthetic corpus (ours): passages of 100 words drawn independently from the embedded
corpus's word frequencies (so stopword share and the term-frequency tail look like real
text); queries are 5 distinct non-stopword words of a random passage.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import random
import re
import resource
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

import httptools
import httpx
import numpy as np
import uvloop
from rank_bm25 import BM25Okapi

from sorl_verl.retrieval import build_index, embedded_corpus_path, load_retriever
from sorl_verl.retrieval.bm25 import top_k_rows
from sorl_verl.retrieval.corpus import iter_corpus, write_jsonl_atomic
from sorl_verl.retrieval.quality import load_questions, recall_at_k

BATCH = 512
TOPK = 3


def ours_queries_per_s(retriever, queries: list[str], repeats: int = 3) -> float:
    """Best of ``repeats`` passes over ``queries`` in batches of 512."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(0, len(queries), BATCH):
            retriever.search(queries[i : i + BATCH], topk=TOPK)
        best = min(best, time.perf_counter() - start)
    return len(queries) / best


def rank_bm25_queries_per_s(model: BM25Okapi, query_terms: list[list[str]]) -> float:
    start = time.perf_counter()
    for terms in query_terms:
        top_k_rows(model.get_scores(terms), TOPK)
    return len(query_terms) / (time.perf_counter() - start)


def compare_bm25(name: str, retriever, doc_texts: list[str], queries: list[str], rank_bm25_queries: int) -> None:
    """Both corpora here use row numbers as document ids, which the top-1 check relies on."""
    print(
        f"\n-- BM25 throughput, {name}: {len(retriever):,} docs, {len(queries)} queries, batches of {BATCH}, top-{TOPK}"
    )
    ours = ours_queries_per_s(retriever, queries)
    print(f"   ours             : {ours:10.1f} queries/s  (BM25Retriever on bm25s arrays)")
    start = time.perf_counter()
    doc_terms = [retriever.terms(t) for t in doc_texts]
    model = BM25Okapi(doc_terms, k1=0.9, b=0.4)
    del doc_terms
    print(f"   rank_bm25 build  : {time.perf_counter() - start:.1f} s (same tokens, k1=0.9 b=0.4)")
    subset = queries[:rank_bm25_queries]
    theirs = rank_bm25_queries_per_s(model, [retriever.terms(q) for q in subset])
    note = "" if len(subset) == len(queries) else f"  (timed on the first {len(subset)} of the {len(queries)} queries)"
    print(f"   rank_bm25        : {theirs:10.2f} queries/s{note}")
    print(f"   ratio            : {ours / theirs:10.1f}x   (target >= 20x)")
    ours_top1 = [hits[0]["document"]["id"] if hits else None for hits in retriever.search(subset[:50], topk=1)]
    theirs_top1 = [str(int(np.argmax(model.get_scores(retriever.terms(q))))) for q in subset[:50]]
    agree = np.mean([a == b for a, b in zip(ours_top1, theirs_top1, strict=True)])
    print(f"   top-1 agreement  : {agree:.2f} on {len(ours_top1)} queries (Lucene vs Okapi idf, so not exactly 1)")
    del model


def quality(retriever) -> None:
    questions = load_questions(embedded_corpus_path())
    print("\n-- Retrieval quality, embedded Wikipedia (10,033 articles), BM25, recall@3 of the right article")
    for kind in ("description", "first_sentence"):
        subset = [q for q in questions if q.kind == kind]
        print(f"   {kind:15s}: {recall_at_k(retriever, subset, k=3):.3f}  ({len(subset)} questions)")


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux ``/proc``); NaN elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_server(index_dir: Path) -> tuple[subprocess.Popen, str]:
    """``sorl-retriever`` on a free loopback port, in its own process; waits for /health."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sorl_verl.retrieval.server",
            "--index",
            str(index_dir),
            "--port",
            str(port),
            "--log-level",
            "error",
        ],
        stdout=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while True:
        try:
            httpx.get(url + "/health", timeout=1).raise_for_status()
            return proc, url
        except httpx.TransportError:
            if time.time() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("retrieval server did not start") from None
            time.sleep(0.2)


class HttpConnection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection that POSTs JSON and reads JSON answers, one at a time.

    The load generator's client (ours): a real socket, a Content-Length on every request, the answer
    parsed by httptools (the C parser uvicorn uses; status, headers, Content-Length or chunked framing)
    and its body decoded as JSON. It shares the CPUs with the server: aiohttp's or httpx's per-request
    cost would dominate the figure, and so did asyncio streams'.
    """

    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.reply: asyncio.Future | None = None
        self.body: list[bytes] = []

    @classmethod
    async def open(cls, host: str, port: int) -> HttpConnection:
        _, connection = await asyncio.get_running_loop().create_connection(lambda: cls(host, port), host, port)
        return connection

    @property
    def closed(self) -> bool:
        return self.transport is None or self.transport.is_closing()

    async def post_json(self, path: str, payload) -> tuple[int, object]:
        """``(status, decoded JSON body)`` of one request; closes the connection when the answer says so."""
        body = json.dumps(payload).encode()
        self.body = []
        self.reply = asyncio.get_running_loop().create_future()
        self.transport.write(
            b"POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (path.encode(), self.host.encode(), self.port, len(body), body)
        )
        status, data = await self.reply
        return status, json.loads(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # asyncio.Protocol and httptools callbacks
    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(ValueError(f"malformed HTTP answer: {e}"))
            self.transport.close()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        if self.reply is not None and not self.reply.done():
            self.reply.set_result((self.parser.get_status_code(), b"".join(self.body)))
        if not self.parser.should_keep_alive():
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or ConnectionResetError("the server closed the connection"))

    def _fail(self, error: Exception) -> None:
        if self.reply is not None and not self.reply.done():
            self.reply.set_exception(error)


def is_search_r1_answer(answer, queries: int, topk: int) -> bool:
    """Whether ``answer`` is Search-R1's ``return_scores`` reply: ``queries`` lists of at most ``topk``
    ``{"document": {"id", "contents"}, "score"}`` hits."""
    result = answer.get("result") if isinstance(answer, dict) else None
    return (
        isinstance(result, list)
        and len(result) == queries
        and all(isinstance(hits, list) and len(hits) <= topk for hits in result)
        and all(
            isinstance(hit, dict)
            and isinstance(hit.get("document"), dict)
            and {"id", "contents"} <= hit["document"].keys()
            and isinstance(hit.get("score"), float)
            for hits in result
            for hit in hits
        )
    )


def load_run(url: str, questions: list[str], clients: int, requests_per_client: int) -> dict:
    """``clients`` concurrent clients, each with its own keep-alive connection, sending
    ``requests_per_client`` single-query requests one after another (after 2 warm-up requests each,
    which open the connections). An answer counts when it is a 200 whose JSON is one list of ``TOPK``
    hits with a document and a score (Search-R1's shape). Bounded: every request has a 60 s timeout,
    and errors are counted, not retried. Runs on uvloop, as the server does."""
    host, port = url.removeprefix("http://").rsplit(":", 1)

    async def run():
        latencies: list[float] = []
        errors: list[str] = []
        connections: list[HttpConnection | None] = [None] * clients

        async def client(worker: int, count: int, record: bool):
            for i in range(count):
                payload = {
                    "queries": [questions[(worker * count + i) % len(questions)]],
                    "topk": TOPK,
                    "return_scores": True,
                }
                start = time.perf_counter()
                try:
                    async with asyncio.timeout(60):
                        if connections[worker] is None or connections[worker].closed:
                            connections[worker] = await HttpConnection.open(host, int(port))
                        status, answer = await connections[worker].post_json("/retrieve", payload)
                except (OSError, TimeoutError, ValueError) as e:
                    errors.append(type(e).__name__)
                    if connections[worker] is not None:
                        connections[worker].close()
                        connections[worker] = None
                    continue
                if status != 200:
                    errors.append(f"HTTP {status}")
                    continue
                if not is_search_r1_answer(answer, queries=1, topk=TOPK):
                    errors.append("wrong answer shape")
                    continue
                if record:
                    latencies.append(time.perf_counter() - start)

        try:
            await asyncio.gather(*(client(w, 2, False) for w in range(clients)))  # warm-up: connections open
            start = time.perf_counter()
            await asyncio.gather(*(client(w, requests_per_client, True) for w in range(clients)))
            return latencies, errors, time.perf_counter() - start
        finally:
            for connection in connections:
                if connection is not None:
                    connection.close()

    latencies, errors, wall = uvloop.run(run())
    ms = np.array(latencies) * 1000 if latencies else np.array([float("nan")])
    return {
        "clients": clients,
        "requests": len(latencies),
        "errors": len(errors),
        "wall": wall,
        "rate": len(latencies) / wall,
        "p50": np.percentile(ms, 50),
        "p90": np.percentile(ms, 90),
        "p99": np.percentile(ms, 99),
        "max": ms.max(),
        "error_kinds": sorted(set(errors))[:5],
    }


def own_cpu_seconds() -> float:
    """User + system CPU seconds of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def server_latency(index_dir: Path, load: int = 0) -> None:
    """32 concurrent clients (target p99 < 100 ms), and with ``load`` also ``load`` clients
    (target: 0 errors, p99 <= 400 ms), printed side by side from one server, each with the CPU time
    the server and this process (the load generator) spent per request, warm-up requests included."""
    questions = [q.text for q in load_questions(embedded_corpus_path())]
    random.Random(0).shuffle(questions)
    proc, url = start_server(index_dir)
    runs = []
    try:
        for clients, per_client in [(32, 100)] + ([(load, 5)] if load else []):
            server_before, client_before = process_cpu_seconds(proc.pid), own_cpu_seconds()
            run = load_run(url, questions, clients, per_client)
            sent = clients * (2 + per_client)
            run["server_ms"] = 1000 * (process_cpu_seconds(proc.pid) - server_before) / sent
            run["client_ms"] = 1000 * (own_cpu_seconds() - client_before) / sent
            run["loadavg"] = os.getloadavg()[0]
            runs.append(run)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    print(f"\n-- Server latency, 10k corpus, single-query requests, top-{TOPK}, 127.0.0.1, server in its own process")
    print(
        f"   {'clients':>8} {'requests':>9} {'errors':>7} {'req/s':>7} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} "
        f"{'max ms':>8} {'server':>7} {'client':>7} {'load':>5}   target"
    )
    for run, target in zip(runs, ["p99 < 100 ms", "0 errors, p99 <= 400 ms"], strict=False):
        print(
            f"   {run['clients']:>8} {run['requests']:>9} {run['errors']:>7} {run['rate']:>7.0f} {run['p50']:>8.1f} "
            f"{run['p90']:>8.1f} {run['p99']:>8.1f} {run['max']:>8.1f} {run['server_ms']:>7.3f} {run['client_ms']:>7.3f} "
            f"{run['loadavg']:>5.1f}   {target}" + (f"  errors: {run['error_kinds']}" if run["errors"] else "")
        )
    print("   server / client: CPU ms per request of the server process and of this one (the load generator);")
    print("   load: the 1-minute load after the run")


def drain_under_load(index_dir: Path, clients: int = 200, before_signal: int = 1000) -> None:
    """SIGTERM while ``clients`` clients loop on single-query requests: every request must get an HTTP
    answer (200, or 503 once the drain began) and the server must exit 0. Each client stops at its
    first non-200 answer or refused connection; bounded by 60 s before and 40 s after the signal."""
    import signal

    proc, url = start_server(index_dir)
    statuses: list[int] = []
    failures: list[str] = []

    host, port = url.removeprefix("http://").rsplit(":", 1)

    async def client(worker: int):
        connection = None
        try:
            while True:
                try:
                    async with asyncio.timeout(30):
                        if connection is None or connection.closed:
                            connection = await HttpConnection.open(host, int(port))
                        status, _ = await connection.post_json(
                            "/retrieve", {"queries": [f"capital {worker}"], "topk": 1}
                        )
                except ConnectionRefusedError:  # the server has closed its socket
                    return
                except (OSError, TimeoutError, ValueError) as error:
                    failures.append(type(error).__name__)
                    return
                statuses.append(status)
                if status != 200:
                    return
        finally:
            if connection is not None:
                connection.close()

    async def run():
        tasks = [asyncio.create_task(client(w)) for w in range(clients)]
        give_up = time.monotonic() + 60
        while len(statuses) < before_signal and time.monotonic() < give_up:
            await asyncio.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        await asyncio.wait(tasks, timeout=40)
        return signalled

    signalled = uvloop.run(run())
    try:
        code = proc.wait(timeout=40)
    except subprocess.TimeoutExpired:
        code = "none (killed after 40 s)"
        proc.kill()
    print(f"\n-- SIGTERM under load: {clients} clients, signal after {before_signal} answers")
    print(
        f"   answers {len(statuses)} (200: {statuses.count(200)}, 503: {statuses.count(503)}), "
        f"transport errors {len(failures)} {sorted(set(failures))}, exit code {code}, "
        f"exited {time.monotonic() - signalled:.1f} s after the signal   (target: 0 errors, exit 0)"
    )


def synthetic_texts(passages: int, words_per_passage: int = 100, seed: int = 0) -> Iterator[str]:
    """The synthetic passages, generated 50,000 at a time (memory does not grow with ``passages``)."""
    counts = Counter()
    for doc in iter_corpus(embedded_corpus_path()):
        counts.update(re.findall(r"\w+", doc.contents.lower()))
    vocab = np.array(list(counts))
    probs = np.array(list(counts.values()), dtype=np.float64)
    probs /= probs.sum()
    rng = np.random.default_rng(seed)
    chunk = 50_000
    for start in range(0, passages, chunk):
        n = min(chunk, passages - start)
        words = vocab[rng.choice(len(vocab), size=(n, words_per_passage), p=probs)]
        yield from (" ".join(row) for row in words)


def synthetic_rows(texts: Iterable[str]) -> Iterator[dict]:
    """Corpus rows of the synthetic passages: ids are row numbers, titles ``"Synthetic i"``."""
    return ({"id": str(i), "contents": f'"Synthetic {i}"\n{t}'} for i, t in enumerate(texts))


def synthetic_corpus(path: Path, passages: int, words_per_passage: int = 100, seed: int = 0) -> list[str]:
    """Write ``passages`` synthetic passages as corpus JSONL; returns their texts."""
    texts = list(synthetic_texts(passages, words_per_passage, seed))
    write_jsonl_atomic(synthetic_rows(texts), path)
    return texts


def _pyserini_missing(err: ImportError) -> None:
    print(f"error: --pyserini: the comparison cannot run here: {err}", file=sys.stderr)
    sys.exit(2)


def load_pyserini_compare():
    """``benchmarks/pyserini/compare.py`` as a module (a script beside this one, not a package)."""
    path = Path(__file__).resolve().parent / "pyserini" / "compare.py"
    spec = importlib.util.spec_from_file_location("sorl_bench_pyserini_compare", path)
    compare = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare)
    return compare


def pyserini_section(work: Path, passages: int, required: bool = False) -> None:
    """Pyserini beside ours (``benchmarks/pyserini/compare.py``), or why it cannot run here
    (``required``: exit with status 2 and that reason instead of skipping)."""
    compare = load_pyserini_compare()
    print(f"\n-- Pyserini (Lucene BM25) vs ours: the embedded corpus and {passages:,} synthetic passages")
    try:
        rows = compare.pyserini_comparison(passages=(passages,), work=work)
    except ImportError as err:  # PyseriniUnavailable: names what to install
        if required:
            _pyserini_missing(err)
        print(f"   skipped: {err}")
        return
    print(compare.format_table(rows))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--synthetic",
        type=int,
        default=0,
        metavar="N",
        help="also benchmark a synthetic corpus of N passages (the throughput target's size: 1000000)",
    )
    parser.add_argument(
        "--rank-bm25-queries",
        type=int,
        default=16,
        help="queries timed for rank_bm25 on the synthetic corpus (it is slow there)",
    )
    parser.add_argument("--no-server", action="store_true")
    parser.add_argument(
        "--load",
        type=int,
        default=0,
        metavar="N",
        help="also run N concurrent clients against the server (the load target's size: 1000)",
    )
    parser.add_argument("--server-only", action="store_true", help="only the server sections")
    parser.add_argument("--drain", action="store_true", help="also SIGTERM the server under load (200 clients)")
    lucene = parser.add_mutually_exclusive_group()
    lucene.add_argument(
        "--pyserini",
        action="store_true",
        help="require Pyserini (Lucene) vs ours on the embedded corpus and the --synthetic size (default 10k): "
        "queries/s, recall@3, top-3 overlap (benchmarks/pyserini/compare.py); exit with status 2, naming what "
        "to install, when pyserini or Java is missing. Without this flag the comparison still runs when it "
        "can and is skipped, with the reason, when not",
    )
    lucene.add_argument("--no-pyserini", action="store_true", help="skip the Pyserini comparison")
    args = parser.parse_args()
    if args.pyserini and args.server_only:
        parser.error("--pyserini and --server-only: the comparison is not a server section")
    if args.pyserini:  # before minutes of other sections, not after
        from sorl_verl.retrieval.lucene import PyseriniUnavailable, require_pyserini

        try:
            require_pyserini()
        except PyseriniUnavailable as err:
            _pyserini_missing(err)
    if args.load < 0 or args.load > 5000:
        parser.error("--load must be between 0 and 5000")
    print(f"machine: {os.cpu_count()} CPUs, 1-min load {os.getloadavg()[0]:.1f} at start")

    with tempfile.TemporaryDirectory(prefix="bench_retrieval_") as tmp:
        tmp = Path(tmp)
        start = time.perf_counter()
        index_10k = build_index(embedded_corpus_path(), tmp / "wiki_bm25", show_progress=False)
        print(f"built the 10k BM25 index in {time.perf_counter() - start:.1f} s")
        if not args.server_only:
            retriever = load_retriever(index_10k)
            quality(retriever)
            questions = [q.text for q in load_questions(embedded_corpus_path())]
            random.Random(0).shuffle(questions)
            doc_texts = [doc.contents for doc in iter_corpus(embedded_corpus_path())]
            compare_bm25("embedded Wikipedia", retriever, doc_texts, questions[: 4 * BATCH], BATCH)
        if not args.no_server:
            server_latency(index_10k, load=args.load)
            if args.drain:
                drain_under_load(index_10k)

        if not (args.no_pyserini or args.server_only):
            pyserini_section(tmp / "pyserini", args.synthetic or 10_000, required=args.pyserini)

        if args.synthetic:
            n = args.synthetic
            print(f"\n-- Synthetic corpus: {n:,} passages of 100 words")
            start = time.perf_counter()
            texts = synthetic_corpus(tmp / "synthetic.jsonl", n)
            print(f"   generated in {time.perf_counter() - start:.1f} s")
            start = time.perf_counter()
            index_big = build_index(tmp / "synthetic.jsonl", tmp / "synthetic_bm25", show_progress=True)
            print(f"   sorl-index (BM25) built it in {time.perf_counter() - start:.1f} s")
            big = load_retriever(index_big)
            rng = random.Random(1)
            queries = []
            while len(queries) < BATCH:
                words = sorted({w for w in texts[rng.randrange(n)].split() if big.terms(w)})
                queries.append(" ".join(rng.sample(words, min(5, len(words)))))
            compare_bm25(f"synthetic {n:,}", big, texts, queries, args.rank_bm25_queries)


if __name__ == "__main__":
    main()
