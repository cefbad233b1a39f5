"""Retrieval server: ``sorl-retriever`` / ``python -m sorl_verl.retrieval.server``.

HTTP API, exactly Search-R1's ``retrieval_server.py``::

    POST /retrieve  {"queries": ["q1", ...], "topk": 3 | null, "return_scores": false}
      -> {"result": [[{"id", "contents"}, ...], ...]}                          (return_scores false)
      -> {"result": [[{"document": {"id", "contents"}, "score": 1.5}, ...], ...]}  (return_scores true)

plus ``GET /health`` (ours). ``topk`` null or absent means the server's ``--topk``;
``return_scores`` defaults to false, as in Search-R1. Bad input gets a 4xx with
``{"detail": "<what is wrong>"}``: 400 body is not JSON, 413 body over ``max_body_bytes``,
422 a missing or mistyped field, ``topk`` outside ``1..max_topk`` or more than ``max_batch``
queries. Binds 127.0.0.1 unless ``--host`` says otherwise.

Batching (ours): requests are queued to one worker task that takes everything waiting (up to
``max_batch`` queries), runs one ``retriever.search`` for all of them with the largest
``topk`` asked, in a worker thread so the event loop keeps accepting connections, and cuts
each request's share back to its own ``topk``. No request ever waits for a timer: under
light load a batch is one request, under heavy load batches fill up while the previous one
runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import Response

DEFAULT_TOPK = 3
DEFAULT_MAX_TOPK = 100
DEFAULT_MAX_BATCH = 512
DEFAULT_MAX_BODY_BYTES = 1 << 20


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
        """Search results for ``queries``; raises ``HTTPException(500)`` if the retriever fails."""
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
                error = HTTPException(500, f"retrieval failed: {type(e).__name__}: {e}")
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


def _parse_request(body: bytes, default_topk: int, max_topk: int, max_batch: int) -> tuple[list[str], int, bool]:
    try:
        payload = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise HTTPException(400, f"request body is not valid JSON: {e}") from None
    if not isinstance(payload, dict):
        raise HTTPException(422, f"request body must be a JSON object, got {type(payload).__name__}")
    if "queries" not in payload:
        raise HTTPException(422, "field 'queries' is required (a list of strings)")
    queries = payload["queries"]
    if not isinstance(queries, list):
        raise HTTPException(422, f"field 'queries' must be a list of strings, got {type(queries).__name__}")
    for i, query in enumerate(queries):
        if not isinstance(query, str):
            raise HTTPException(422, f"queries[{i}] must be a string, got {type(query).__name__}")
    if len(queries) > max_batch:
        raise HTTPException(422, f"{len(queries)} queries in one request; the cap is {max_batch} (max_batch)")
    topk = payload.get("topk")
    if topk is None:
        topk = default_topk
    elif isinstance(topk, bool) or not isinstance(topk, int):
        raise HTTPException(422, f"field 'topk' must be an integer or null, got {type(topk).__name__}")
    elif not 1 <= topk <= max_topk:
        raise HTTPException(422, f"field 'topk' must be between 1 and {max_topk}, got {topk}")
    return_scores = payload.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise HTTPException(422, f"field 'return_scores' must be true or false, got {type(return_scores).__name__}")
    return queries, topk, return_scores


def create_app(
    retriever,
    default_topk: int = DEFAULT_TOPK,
    max_topk: int = DEFAULT_MAX_TOPK,
    max_batch: int = DEFAULT_MAX_BATCH,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> FastAPI:
    """FastAPI app serving ``retriever`` (anything with ``search(queries, topk)``)."""
    if not 1 <= default_topk <= max_topk:
        raise ValueError(f"default_topk must be in 1..max_topk={max_topk}, got {default_topk}")
    batcher = MicroBatcher(retriever.search, max_batch)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        yield
        await batcher.close()

    app = FastAPI(title="sorl-verl retriever", lifespan=lifespan)
    app.state.batcher = batcher

    @app.get("/health")
    async def health():
        return {
            "status": "ok",
            "method": getattr(retriever, "method", type(retriever).__name__),
            "num_docs": len(retriever) if hasattr(retriever, "__len__") else None,
            "default_topk": default_topk,
            "max_topk": max_topk,
            "max_batch": max_batch,
        }

    @app.post("/retrieve")
    async def retrieve(request: Request):
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_body_bytes:
            raise HTTPException(413, f"request body of {declared} bytes exceeds the cap of {max_body_bytes} bytes")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_body_bytes:
                raise HTTPException(413, f"request body exceeds the cap of {max_body_bytes} bytes")
            chunks.append(chunk)
        queries, topk, return_scores = _parse_request(b"".join(chunks), default_topk, max_topk, max_batch)
        results = await batcher.search(queries, topk) if queries else []
        if not return_scores:
            results = [[hit["document"] for hit in hits] for hits in results]
        # Serialised here: FastAPI's generic encoder walks every hit and costs more than the search.
        return Response(json.dumps({"result": results}, ensure_ascii=False), media_type="application/json")

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="sorl-retriever", description="Serve a retrieval index over HTTP (Search-R1 API).")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--index", help="index folder built by sorl-index")
    source.add_argument("--embedded", action="store_true", help="serve the BM25 index of the shipped Wikipedia corpus")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1; 0.0.0.0 exposes it)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--topk", type=int, default=DEFAULT_TOPK, help="topk when a request leaves it null")
    parser.add_argument("--max-topk", type=int, default=DEFAULT_MAX_TOPK)
    parser.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH, help="most queries in one request")
    parser.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)

    import uvicorn

    from sorl_verl.retrieval import embedded_index, load_retriever

    try:
        retriever = embedded_index() if args.embedded else load_retriever(args.index)
    except (FileNotFoundError, ValueError, ImportError) as e:
        print(f"sorl-retriever: error: {e}", file=sys.stderr)
        sys.exit(2)
    app = create_app(retriever, default_topk=args.topk, max_topk=args.max_topk, max_batch=args.max_batch,
                     max_body_bytes=args.max_body_bytes)
    print(f"sorl-retriever: {getattr(retriever, 'method', '?')} index, serving http://{args.host}:{args.port}/retrieve",
          flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
