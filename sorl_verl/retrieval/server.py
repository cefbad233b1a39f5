"""Retrieval server: ``sorl-retriever`` / ``python -m sorl_verl.retrieval.server``.

HTTP API, exactly Search-R1's ``retrieval_server.py``::

    POST /retrieve  {"queries": ["q1", ...], "topk": 3 | null, "return_scores": false}
      -> {"result": [[{"id", "contents"}, ...], ...]}                          (return_scores false)
      -> {"result": [[{"document": {"id", "contents"}, "score": 1.5}, ...], ...]}  (return_scores true)

plus ``GET /health`` (ours). ``topk`` null or absent means the server's ``--topk``;
``return_scores`` defaults to false, as in Search-R1. Other paths are 404, other methods 405 (with
``Allow``), both with a JSON ``detail``. The app is a plain ASGI callable served by uvicorn on uvloop
and httptools (ours: Search-R1 uses FastAPI, whose per-request machinery cost more CPU than the search).

Bad input never reaches the retriever and always gets a 4xx with ``{"detail": "<what is wrong>"}``
(ours): 400 body is not JSON (malformed, invalid UTF-8, nested too deep, an integer too long to
parse), 408 body not received within ``read_timeout_s`` (a slow or short body), 413 body over
``max_body_bytes``, 422 a missing or mistyped field, ``topk`` outside ``1..max_topk``, more than
``max_batch`` queries, a query over ``max_query_chars`` characters or with a lone surrogate, or
more than ``max_request_chars`` query characters in one request (the per-request cost bound).
Only a failing retriever is a 500. A client that disconnects is dropped without a log line.
Binds 127.0.0.1 unless ``--host`` says otherwise.

Shutdown (ours): the first SIGTERM or SIGINT starts a drain: ``/health`` answers 503, new requests
get 503 with ``Retry-After`` and ``Connection: close`` (the client retries elsewhere or later),
requests already received are answered normally; the server exits 0 once no request is left, none
has arrived for ``LINGER_S`` (so connections already queued are answered rather than reset) and no
connection is open, or when ``--grace-s`` has passed. Waiting for the open connections matters: a
keep-alive connection whose last answer came before the drain was told nothing of it, and closing
it races its client's next request (seen: 158 of 200 looping clients failed with "Can not write
request body" when the drain ended on a loaded machine after 0.5 s without arrivals). Each such
connection closes on its next answer (a 503 with ``Connection: close``) or, idle, after uvicorn's
keep-alive timeout (``KEEP_ALIVE_S``). A second signal stops at once. A connection that completes
its TCP handshake in the instant the listening socket closes is still reset: no server can avoid that.

Batching (ours): requests are queued to one worker task that takes everything waiting (up to
``max_batch`` queries), runs one ``retriever.search`` for all of them with the largest
``topk`` asked, in a worker thread so the event loop keeps accepting connections, and cuts
each request's share back to its own ``topk``. No request ever waits for a timer: under
light load a batch is one request, under heavy load batches fill up while the previous one
runs. The BM25 retriever splits each batch over ``--search-threads`` threads (default: the
CPUs this process may use).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import signal
import sys
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from sorl_verl.retrieval import _cli

try:  # installed with verl (through tensordict); json is the fallback
    import orjson
except ImportError:  # pragma: no cover - depends on the environment
    orjson = None

DEFAULT_TOPK = 3
DEFAULT_MAX_TOPK = 100
DEFAULT_MAX_BATCH = 512
DEFAULT_MAX_BODY_BYTES = 1 << 20
# A BM25 search costs about 1 ms per kilobyte of query text: these caps bound what one query
# (~8 ms) and one request (~0.25 s) can cost, so a short query never waits seconds behind huge ones.
DEFAULT_MAX_QUERY_CHARS = 8192
DEFAULT_MAX_REQUEST_CHARS = 1 << 18
DEFAULT_READ_TIMEOUT_S = 10.0
DEFAULT_GRACE_S = 30.0
# A drain lasts at least this long, and ends only after this long without a new request, so that
# connections already queued in the kernel are accepted and answered (503) rather than reset.
LINGER_S = 0.5
# uvicorn's idle keep-alive timeout (its default): how long a drain waits at most for an idle client.
KEEP_ALIVE_S = 5.0


class HTTPError(Exception):
    """An answer other than 200: ``status`` with ``{"detail": detail}`` and extra ``headers``."""

    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None):
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.headers = headers or {}


@dataclass
class _Pending:
    queries: list[str]
    topk: int
    future: asyncio.Future = field(repr=False)


class MicroBatcher:
    """Greedy request batching in front of a blocking ``search(queries, topk)``."""

    def __init__(self, search, max_batch: int):
        self._search = search
        self._max_batch = max_batch
        self._queue: asyncio.Queue[_Pending] | None = None
        self._worker: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="retrieval")
        self.batch_sizes: deque[int] = deque(maxlen=10_000)  # queries per recent search call, for tests and stats

    async def search(self, queries: list[str], topk: int) -> list[list[dict]]:
        """Search results for ``queries``; raises ``HTTPError(500)`` if the retriever fails."""
        # (Re)start the worker in the running loop: test clients may run each request in a new loop.
        if self._worker is None or self._worker.done() or self._worker.get_loop() is not asyncio.get_running_loop():
            self._queue = asyncio.Queue()
            self._worker = asyncio.get_running_loop().create_task(self._run())
        future = asyncio.get_running_loop().create_future()
        await self._queue.put(_Pending(queries, topk, future))
        return await future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        carry: _Pending | None = None
        while True:
            batch = [carry or await self._queue.get()]
            carry = None
            size = len(batch[0].queries)
            while not self._queue.empty():
                item = self._queue.get_nowait()
                if size + len(item.queries) > self._max_batch:
                    carry = item
                    break
                batch.append(item)
                size += len(item.queries)
            queries = [q for item in batch for q in item.queries]
            topk = max(item.topk for item in batch)
            self.batch_sizes.append(len(queries))
            try:
                results = await loop.run_in_executor(self._executor, self._search, queries, topk)
                if len(results) != len(queries):
                    raise RuntimeError(f"retriever returned {len(results)} result lists for {len(queries)} queries")
            except Exception as e:  # reported to every caller of this batch; the worker lives on
                error = HTTPError(500, f"retrieval failed: {type(e).__name__}: {e}")
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(error)
                continue
            offset = 0
            for item in batch:
                share = results[offset : offset + len(item.queries)]
                offset += len(item.queries)
                if not item.future.done():  # the client may have gone away
                    item.future.set_result([hits[: item.topk] for hits in share])

    async def close(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
        self._executor.shutdown(wait=False, cancel_futures=True)


@dataclass(frozen=True)
class Limits:
    """What one request may ask for (see the module docstring)."""

    default_topk: int = DEFAULT_TOPK
    max_topk: int = DEFAULT_MAX_TOPK
    max_batch: int = DEFAULT_MAX_BATCH
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_query_chars: int = DEFAULT_MAX_QUERY_CHARS
    max_request_chars: int = DEFAULT_MAX_REQUEST_CHARS
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S

    def __post_init__(self):
        for name in ("max_topk", "max_batch", "max_body_bytes", "max_query_chars", "max_request_chars"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not 1 <= self.default_topk <= self.max_topk:
            raise ValueError(f"default_topk must be in 1..max_topk={self.max_topk}, got {self.default_topk}")
        if not self.read_timeout_s > 0:
            raise ValueError(f"read_timeout_s must be positive, got {self.read_timeout_s}")


def _parse_request(body: bytes, limits: Limits) -> tuple[list[str], int, bool]:
    try:
        payload = json.loads(body)
    except RecursionError:
        raise HTTPError(400, "request body is not valid JSON: nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer over Python's digit limit
        raise HTTPError(400, f"request body is not valid JSON: {str(e)[:200]}") from None
    if not isinstance(payload, dict):
        raise HTTPError(422, f"request body must be a JSON object, got {type(payload).__name__}")
    if "queries" not in payload:
        raise HTTPError(422, "field 'queries' is required (a list of strings)")
    queries = payload["queries"]
    if not isinstance(queries, list):
        raise HTTPError(422, f"field 'queries' must be a list of strings, got {type(queries).__name__}")
    if len(queries) > limits.max_batch:
        raise HTTPError(422, f"{len(queries)} queries in one request; the cap is {limits.max_batch} (max_batch)")
    total = 0
    for i, query in enumerate(queries):
        if not isinstance(query, str):
            raise HTTPError(422, f"queries[{i}] must be a string, got {type(query).__name__}")
        if len(query) > limits.max_query_chars:
            raise HTTPError(
                422, f"queries[{i}] has {len(query)} characters; the cap is {limits.max_query_chars} (max_query_chars)"
            )
        try:
            query.encode("utf-8")
        except UnicodeEncodeError:
            raise HTTPError(422, f"queries[{i}] is not valid Unicode (a lone surrogate)") from None
        total += len(query)
    if total > limits.max_request_chars:
        raise HTTPError(
            422, f"{total} query characters in one request; the cap is {limits.max_request_chars} (max_request_chars)"
        )
    topk = payload.get("topk")
    if topk is None:
        topk = limits.default_topk
    elif isinstance(topk, bool) or not isinstance(topk, int):
        raise HTTPError(422, f"field 'topk' must be an integer or null, got {type(topk).__name__}")
    elif not 1 <= topk <= limits.max_topk:
        raise HTTPError(422, f"field 'topk' must be between 1 and {limits.max_topk}, got {topk}")
    return_scores = payload.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise HTTPError(422, f"field 'return_scores' must be true or false, got {type(return_scores).__name__}")
    return queries, topk, return_scores


class _ClientGone(Exception):
    """The client closed the connection before its request body arrived."""


def _header(scope: dict, name: bytes) -> bytes | None:
    """The value of request header ``name`` (lower case), or None."""
    for key, value in scope["headers"]:
        if key == name:
            return value
    return None


async def _read_body(scope: dict, receive, limits: Limits) -> bytes:
    """The request body from ASGI ``receive`` messages, within the size cap and the read timeout."""
    declared = _header(scope, b"content-length")
    if declared is not None and declared.isdigit() and (len(declared) > 18 or int(declared) > limits.max_body_bytes):
        raise HTTPError(
            413,
            f"request body of {declared[:20].decode()} bytes exceeds the cap of {limits.max_body_bytes} bytes",
            headers={"Connection": "close"},
        )
    chunks, size = [], 0
    try:
        async with asyncio.timeout(limits.read_timeout_s):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise _ClientGone
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > limits.max_body_bytes:
                    raise HTTPError(
                        413,
                        f"request body exceeds the cap of {limits.max_body_bytes} bytes",
                        headers={"Connection": "close"},
                    )
                chunks.append(chunk)
                if not message.get("more_body", False):
                    break
    except TimeoutError:
        raise HTTPError(
            408,
            f"request body not received within {limits.read_timeout_s:g} s (read_timeout_s)",
            headers={"Connection": "close"},
        ) from None
    return b"".join(chunks)


def encode_json(payload) -> bytes:
    """``payload`` as UTF-8 JSON: orjson when installed (0.5 us for a top-3 reply of 2 KB as measured, against
    25 us for ``json.dumps``, whose cost ran on the event loop's thread: 16% of its samples at 200
    clients), else ``json.dumps(ensure_ascii=False)``. Both parse to the same value (except NaN and
    infinity, which orjson writes as ``null`` and json as non-JSON ``NaN``/``Infinity``; a search
    score is finite); what orjson refuses (an integer beyond 64 bits, a lone surrogate, a non-string
    key) goes to ``json``."""
    if orjson is not None:
        try:
            return orjson.dumps(payload)
        except TypeError:  # orjson.JSONEncodeError is a TypeError
            pass
    return json.dumps(payload, ensure_ascii=False).encode()


async def _send_json(send, status: int, payload, headers: dict[str, str]) -> None:
    """One whole ASGI answer: ``payload`` as UTF-8 JSON, with a Content-Length."""
    body = encode_json(payload)
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(name.lower().encode(), value.encode()) for name, value in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


@dataclass
class Lifecycle:
    """Drain state shared by the app and :class:`DrainingServer`."""

    draining: bool = False
    drain_started: float = 0.0
    last_arrival: float = 0.0
    answered_while_draining: int = 0
    refused_while_draining: int = 0


class RetrievalApp:
    """The ASGI app: ``POST /retrieve`` and ``GET /health`` (module docstring), nothing else (404/405).

    A plain ASGI callable rather than a web framework: the request path is the server's CPU cost per
    request, and a framework's routing, request objects and middleware cost more than the search.
    """

    def __init__(self, retriever, limits: Limits):
        self.retriever = retriever
        self.limits = limits
        self.batcher = MicroBatcher(retriever.search, limits.max_batch)
        self.lifecycle = Lifecycle()
        self._routes = {"/retrieve": (("POST",), self._retrieve), "/health": (("GET", "HEAD"), self._health)}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # websockets: uvicorn refuses the handshake
        headers = {}
        try:
            methods, handler = self._routes.get(scope["path"], ((), None))
            if handler is None:
                raise HTTPError(404, "Not Found")
            if scope["method"] not in methods:
                raise HTTPError(405, "Method Not Allowed", {"Allow": ", ".join(methods)})
            status, payload, headers = await handler(scope, receive)
        except HTTPError as e:
            status, payload, headers = e.status, {"detail": e.detail}, e.headers
        except _ClientGone:
            return  # nobody to answer; uvicorn logs nothing for a disconnected client
        await _send_json(send, status, payload, headers)

    async def _lifespan(self, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.batcher.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _health(self, scope, receive) -> tuple[int, dict, dict]:
        if self.lifecycle.draining:
            return 503, {"status": "draining"}, {"Connection": "close"}
        retriever, limits = self.retriever, self.limits
        return (
            200,
            {
                "status": "ok",
                "method": getattr(retriever, "method", type(retriever).__name__),
                "num_docs": len(retriever) if hasattr(retriever, "__len__") else None,
                "default_topk": limits.default_topk,
                "max_topk": limits.max_topk,
                "max_batch": limits.max_batch,
            },
            {},
        )

    async def _retrieve(self, scope, receive) -> tuple[int, dict, dict]:
        lifecycle = self.lifecycle
        lifecycle.last_arrival = time.monotonic()
        if lifecycle.draining:
            lifecycle.refused_while_draining += 1
            raise HTTPError(
                503, "the retrieval server is shutting down; retry later", {"Retry-After": "1", "Connection": "close"}
            )
        body = await _read_body(scope, receive, self.limits)
        queries, topk, return_scores = _parse_request(body, self.limits)
        results = await self.batcher.search(queries, topk) if queries else []
        if not return_scores:
            results = [[hit["document"] for hit in hits] for hits in results]
        headers = {}
        if lifecycle.draining:  # received before the drain began: answered, then the connection closes
            lifecycle.answered_while_draining += 1
            headers = {"Connection": "close"}
        return 200, {"result": results}, headers


def create_app(
    retriever,
    default_topk: int = DEFAULT_TOPK,
    max_topk: int = DEFAULT_MAX_TOPK,
    max_batch: int = DEFAULT_MAX_BATCH,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_query_chars: int = DEFAULT_MAX_QUERY_CHARS,
    max_request_chars: int = DEFAULT_MAX_REQUEST_CHARS,
    read_timeout_s: float = DEFAULT_READ_TIMEOUT_S,
) -> RetrievalApp:
    """ASGI app serving ``retriever`` (anything with ``search(queries, topk)``)."""
    limits = Limits(
        default_topk, max_topk, max_batch, max_body_bytes, max_query_chars, max_request_chars, read_timeout_s
    )
    return RetrievalApp(retriever, limits)


def _draining_server_class():
    import uvicorn

    class DrainingServer(uvicorn.Server):
        """uvicorn's server with a drain on the first SIGTERM/SIGINT (see the module docstring)."""

        def __init__(self, config, grace_s: float):
            super().__init__(config)
            self.grace_s = grace_s
            self.lifecycle: Lifecycle = config.app.lifecycle

        def handle_exit(self, sig, frame) -> None:
            if self.lifecycle.draining:  # a second signal: uvicorn's own (immediate) shutdown
                super().handle_exit(sig, frame)
                return
            self.lifecycle.drain_started = time.monotonic()
            self.lifecycle.draining = True

        async def on_tick(self, counter: int) -> bool:
            lifecycle = self.lifecycle
            if lifecycle.draining and not self.should_exit:
                now = time.monotonic()
                quiet = (
                    not self.server_state.tasks
                    and not self.server_state.connections
                    and now - lifecycle.drain_started >= LINGER_S
                    and now - lifecycle.last_arrival >= LINGER_S
                )
                if quiet or now - lifecycle.drain_started >= self.grace_s:
                    self.should_exit = True
            return await super().on_tick(counter)

    return DrainingServer


def uvicorn_config(app: RetrievalApp, host: str, port: int, log_level: str = "warning"):
    """uvicorn's settings for ``app``. uvicorn picks uvloop and httptools when they are installed
    (setup.py asks for both). Its access log is on only at ``info`` and below, and X-Forwarded-For is
    not read: both cost time on every request."""
    import uvicorn

    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        timeout_graceful_shutdown=5,
        timeout_keep_alive=KEEP_ALIVE_S,
        lifespan="on",
        access_log=log_level in ("info", "debug", "trace"),
        proxy_headers=False,
    )


def serve(
    app: RetrievalApp, host: str, port: int, grace_s: float = DEFAULT_GRACE_S, log_level: str = "warning"
) -> None:
    """Run ``app`` with uvicorn until a signal, then drain (module docstring); returns when done.

    Sets this process's garbage collection for serving: the objects that exist now (the index's)
    are frozen out of it, and young objects are collected every 100,000 allocations instead of 700.
    A batch allocates thousands of short-lived hit dicts, and the default collected about 250 times
    per 7,000 requests at 1000 clients, 0.13-0.14 s of CPU (about 0.02 ms a request; measured with gc.callbacks).
    """
    gc.freeze()
    gc.set_threshold(100_000)
    config = uvicorn_config(app, host, port, log_level)
    server = _draining_server_class()(config, grace_s)
    # uvicorn re-raises the signals it handled once it has shut down; the drain consumes the first
    # one, so the process then returns normally (exit 0) instead of dying of the signal.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        server.run()
    finally:
        signal.signal(signal.SIGTERM, previous)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sorl-retriever", description="Serve a retrieval index over HTTP (Search-R1 API)."
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--index", help="index folder built by sorl-index")
    source.add_argument("--embedded", action="store_true", help="serve the BM25 index of the shipped Wikipedia corpus")
    source.add_argument(
        "--faiss-index",
        help="a FAISS index file as Search-R1 publishes it (e5_Flat.index), served as "
        "it is; needs --corpus and --encoder (sorl_verl.retrieval.artifacts)",
    )
    artifacts = parser.add_argument_group("Search-R1 artifacts (with --faiss-index)")
    artifacts.add_argument(
        "--corpus",
        help="corpus JSONL whose row i is FAISS id i (wiki-18.jsonl); memory-mapped, "
        "with an offset table built once beside it",
    )
    artifacts.add_argument(
        "--encoder",
        help="the encoder the index was built with: HF model name or folder "
        "(intfloat/e5-base-v2; e5 names get query: prefixes), bundled-minilm, or hashing:DIM",
    )
    artifacts.add_argument(
        "--faiss-gpu",
        choices=("auto", "yes", "no"),
        default="auto",
        help="search on the GPUs (fp16, sharded): auto = when faiss has GPUs",
    )
    parser.add_argument(
        "--search-threads",
        type=_cli.POSITIVE_INT,
        default=None,
        help="BM25: threads one batch of queries is split over (default: the CPUs this process may "
        "use; each keeps a float32 buffer of 4 bytes per document)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1; 0.0.0.0 exposes it)")
    parser.add_argument("--port", type=_cli.PORT, default=8000, help="1..65535 (default 8000)")
    parser.add_argument(
        "--topk", type=_cli.POSITIVE_INT, default=DEFAULT_TOPK, help="topk when a request leaves it null"
    )
    parser.add_argument("--max-topk", type=_cli.POSITIVE_INT, default=DEFAULT_MAX_TOPK)
    parser.add_argument(
        "--max-batch", type=_cli.POSITIVE_INT, default=DEFAULT_MAX_BATCH, help="most queries in one request"
    )
    parser.add_argument("--max-body-bytes", type=_cli.POSITIVE_INT, default=DEFAULT_MAX_BODY_BYTES)
    parser.add_argument(
        "--max-query-chars",
        type=_cli.POSITIVE_INT,
        default=DEFAULT_MAX_QUERY_CHARS,
        help="longest query, in characters (422 beyond)",
    )
    parser.add_argument(
        "--max-request-chars",
        type=_cli.POSITIVE_INT,
        default=DEFAULT_MAX_REQUEST_CHARS,
        help="most query characters in one request (422 beyond): bounds one request's cost",
    )
    parser.add_argument(
        "--read-timeout-s",
        type=_cli.float_in(0, low_open=True),
        default=DEFAULT_READ_TIMEOUT_S,
        help="seconds to receive a request body (408 beyond)",
    )
    parser.add_argument(
        "--grace-s",
        type=_cli.float_in(0),
        default=DEFAULT_GRACE_S,
        help="longest drain after SIGTERM/SIGINT before exiting anyway",
    )
    parser.add_argument(
        "--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug", "trace")
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.topk > args.max_topk:
        parser.error(f"--topk {args.topk} exceeds --max-topk {args.max_topk}")

    if args.faiss_index is None and (args.corpus or args.encoder):
        parser.error("--corpus and --encoder go with --faiss-index")
    if args.faiss_index is not None and not (args.corpus and args.encoder):
        parser.error("--faiss-index needs --corpus (the JSONL whose row i is FAISS id i) and --encoder")

    from sorl_verl.retrieval import embedded_index, load_retriever

    try:
        if args.faiss_index is not None:
            retriever = load_retriever(
                faiss_index=args.faiss_index,
                corpus=args.corpus,
                encoder=args.encoder,
                faiss_gpu={"auto": None, "yes": True, "no": False}[args.faiss_gpu],
            )
        else:
            retriever = embedded_index() if args.embedded else load_retriever(args.index)
    except (OSError, ValueError, ImportError, RuntimeError) as e:  # OSError: a missing file or encoder model
        print(f"sorl-retriever: error: {e}", file=sys.stderr)
        sys.exit(2)
    if args.search_threads is not None and hasattr(retriever, "set_search_threads"):
        retriever.set_search_threads(args.search_threads)
    app = create_app(
        retriever,
        default_topk=args.topk,
        max_topk=args.max_topk,
        max_batch=args.max_batch,
        max_body_bytes=args.max_body_bytes,
        max_query_chars=args.max_query_chars,
        max_request_chars=args.max_request_chars,
        read_timeout_s=args.read_timeout_s,
    )
    print(
        f"sorl-retriever: {getattr(retriever, 'method', '?')} index, serving http://{args.host}:{args.port}/retrieve",
        flush=True,
    )
    try:
        serve(app, args.host, args.port, grace_s=args.grace_s, log_level=args.log_level)
    except KeyboardInterrupt:  # a second Ctrl-C during the drain
        sys.exit(130)


if __name__ == "__main__":
    main()
