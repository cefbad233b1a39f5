"""One retrieval client for the search tool and the ``search_r1`` agent loop.

``RetrievalClient.search(queries, topk)`` (sync) and ``asearch`` (async, for agent loops)
return Search-R1's hit lists, ``[[{"document": {"id", "contents"}, "score"}, ...], ...]``,
from either backend:

- in process: an index folder loaded with :func:`sorl_verl.retrieval.load_retriever`, or
  ``"embedded"`` for :func:`sorl_verl.retrieval.embedded_index` (BM25 over the shipped
  Wikipedia summaries): no server to start;
- over HTTP: a server speaking Search-R1's API (``POST {url}/retrieve`` with
  ``{"queries", "topk", "return_scores": true}`` -> ``{"result": [[hit, ...], ...]}``), e.g.
  ``sorl-retriever``. Timeouts, retries with exponential backoff (and jitter) on
  connection errors, 429 and 5xx, and at most ``max_concurrency`` requests in flight per
  event loop.

:func:`format_passages` renders one query's hits the way Search-R1 shows them to the model.

What is Search-R1's and what is ours: the HTTP payload/reply and ``format_passages`` are
Search-R1's (``search_r1/llm_agent/generation.py``: ``_batch_search`` and
``_passages2string``, github.com/PeterGriffinJin/Search-R1); the retries, the concurrency
limit, the in-process backend and the client cache are ours.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any

EMBEDDED = "embedded"


class RetrievalError(RuntimeError):
    """The retriever failed (after retries) or replied with something that is not Search-R1's shape."""


def format_passages(hits: list[dict]) -> str:
    """Render one query's hits as Search-R1's ``_passages2string`` does.

    Each hit's ``contents`` is ``"<title line>\\n<text>"``; the result has one line per hit,
    ``Doc {i}(Title: {title}) {text}\\n`` with ``i`` from 1. As in Search-R1, the title is the
    first line exactly as stored (Search-R1's wiki corpus stores it in double quotes, and
    they stay) and the text is the rest (its newlines kept).
    """
    lines = []
    for index, hit in enumerate(hits, start=1):
        title, _, text = hit["document"]["contents"].partition("\n")
        lines.append(f"Doc {index}(Title: {title}) {text}\n")
    return "".join(lines)


def _validate_queries(queries: Any) -> list[str]:
    if isinstance(queries, str) or not isinstance(queries, (list, tuple)):
        raise TypeError(f"queries must be a list of strings, got {type(queries).__name__}")
    for position, query in enumerate(queries):
        if not isinstance(query, str):
            raise TypeError(f"queries[{position}] must be a string, got {type(query).__name__}")
    return list(queries)


def _validate_reply(reply: Any, num_queries: int, source: str) -> list[list[dict]]:
    """Check a reply has Search-R1's shape: one list of ``{"document": {"contents"}}`` per query."""
    result = reply.get("result") if isinstance(reply, dict) else reply
    if not isinstance(result, list) or len(result) != num_queries:
        got = f"{len(result)} lists" if isinstance(result, list) else type(result).__name__
        raise RetrievalError(f"{source}: expected 'result' with {num_queries} hit lists, got {got}")
    for query_index, hits in enumerate(result):
        if not isinstance(hits, list):
            raise RetrievalError(f"{source}: result[{query_index}] is {type(hits).__name__}, not a list of hits")
        for hit_index, hit in enumerate(hits):
            document = hit.get("document") if isinstance(hit, dict) else None
            if not isinstance(document, dict) or not isinstance(document.get("contents"), str):
                raise RetrievalError(
                    f"{source}: result[{query_index}][{hit_index}] has no document.contents string "
                    "(is the server asked with return_scores=true?)"
                )
    return result


@dataclass(frozen=True)
class HttpOptions:
    """HTTP client settings (ours; Search-R1 posts once with ``requests`` and no timeout)."""

    timeout_s: float = 30.0
    max_retries: int = 4
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    max_concurrency: int = 64

    def delay(self, attempt: int) -> float:
        """Exponential backoff with +-25% jitter, so retrying clients do not hit the server in step."""
        base = min(self.max_backoff_s, self.backoff_s * (2**attempt))
        return base * random.uniform(0.75, 1.25)


def _retryable_status(status: int) -> bool:
    return status == 429 or status >= 500


class _HttpBackend:
    def __init__(self, url: str, options: HttpOptions):
        url = url.rstrip("/")
        self.url = url if url.endswith("/retrieve") else url + "/retrieve"
        self.options = options
        # httpx's async pool and asyncio.Semaphore belong to one event loop: keep one per loop.
        self._per_loop: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._sync_client = None
        self._sync_lock = threading.Lock()

    def _payload(self, queries: list[str], topk: int) -> dict:
        return {"queries": queries, "topk": topk, "return_scores": True}

    def _fail(self, attempts: int, last: str) -> RetrievalError:
        return RetrievalError(f"retriever {self.url}: failed after {attempts} attempt(s): {last}")

    def _check(self, response, num_queries: int) -> list[list[dict]]:
        if response.status_code >= 400:
            raise RetrievalError(f"retriever {self.url}: HTTP {response.status_code}: {response.text[:500]}")
        try:
            reply = response.json()
        except ValueError as error:
            raise RetrievalError(f"retriever {self.url}: reply is not JSON: {error}") from error
        return _validate_reply(reply, num_queries, f"retriever {self.url}")

    def search(self, queries: list[str], topk: int) -> list[list[dict]]:
        import httpx

        with self._sync_lock:
            if self._sync_client is None:
                self._sync_client = httpx.Client(timeout=self.options.timeout_s)
        last = ""
        for attempt in range(self.options.max_retries + 1):
            try:
                response = self._sync_client.post(self.url, json=self._payload(queries, topk))
            except httpx.TransportError as error:
                last = f"{type(error).__name__}: {error}"
            else:
                if not _retryable_status(response.status_code):
                    return self._check(response, len(queries))
                last = f"HTTP {response.status_code}: {response.text[:200]}"
            if attempt < self.options.max_retries:
                time.sleep(self.options.delay(attempt))
        raise self._fail(self.options.max_retries + 1, last)

    def _loop_state(self):
        import httpx

        loop = asyncio.get_running_loop()
        state = self._per_loop.get(loop)
        if state is None:
            state = (httpx.AsyncClient(timeout=self.options.timeout_s), asyncio.Semaphore(self.options.max_concurrency))
            self._per_loop[loop] = state
        return state

    async def asearch(self, queries: list[str], topk: int) -> list[list[dict]]:
        import httpx

        client, semaphore = self._loop_state()
        last = ""
        for attempt in range(self.options.max_retries + 1):
            try:
                async with semaphore:
                    response = await client.post(self.url, json=self._payload(queries, topk))
            except httpx.TransportError as error:
                last = f"{type(error).__name__}: {error}"
            else:
                if not _retryable_status(response.status_code):
                    return self._check(response, len(queries))
                last = f"HTTP {response.status_code}: {response.text[:200]}"
            if attempt < self.options.max_retries:
                await asyncio.sleep(self.options.delay(attempt))
        raise self._fail(self.options.max_retries + 1, last)


class _InProcessBackend:
    def __init__(self, retriever, name: str):
        self.retriever = retriever
        self.name = name
        # Retrievers are not promised to be thread-safe; searches are CPU-bound under the GIL anyway.
        self._lock = threading.Lock()

    def search(self, queries: list[str], topk: int) -> list[list[dict]]:
        with self._lock:
            hits = self.retriever.search(queries, topk=topk)
        return _validate_reply(hits, len(queries), f"retriever {self.name}")

    async def asearch(self, queries: list[str], topk: int) -> list[list[dict]]:
        # Off the event loop, so concurrent trajectories keep generating while one searches.
        return await asyncio.to_thread(self.search, queries, topk)


class RetrievalClient:
    """``search(queries, topk)`` over an in-process retriever or Search-R1's HTTP API.

    Build one with :meth:`from_spec` (or :func:`get_client`, which caches per process):
    ``"embedded"``, an index folder, or an ``http(s)://`` URL (with or without ``/retrieve``).
    """

    def __init__(self, backend: _HttpBackend | _InProcessBackend, spec: str):
        self._backend = backend
        self.spec = spec

    @classmethod
    def from_retriever(cls, retriever, name: str = "in-process") -> RetrievalClient:
        """Wrap any object with ``search(queries, topk) -> list[list[hit]]`` (tests, custom retrievers)."""
        return cls(_InProcessBackend(retriever, name), name)

    @classmethod
    def from_spec(cls, spec: str, http: HttpOptions | None = None) -> RetrievalClient:
        if not isinstance(spec, str) or not spec:
            raise ValueError(f"retriever must be 'embedded', an index folder or an http(s) URL, got {spec!r}")
        if spec.startswith(("http://", "https://")):
            return cls(_HttpBackend(spec, http or HttpOptions()), spec)
        from sorl_verl import retrieval

        retriever = retrieval.embedded_index() if spec == EMBEDDED else retrieval.load_retriever(spec)
        return cls.from_retriever(retriever, name=spec)

    @staticmethod
    def _check_topk(topk: int) -> int:
        if isinstance(topk, bool) or not isinstance(topk, int) or topk <= 0:
            raise ValueError(f"topk must be a positive integer, got {topk!r}")
        return topk

    def search(self, queries: list[str], topk: int = 3) -> list[list[dict]]:
        queries = _validate_queries(queries)
        if not queries:
            return []
        return self._backend.search(queries, self._check_topk(topk))

    async def asearch(self, queries: list[str], topk: int = 3) -> list[list[dict]]:
        queries = _validate_queries(queries)
        if not queries:
            return []
        return await self._backend.asearch(queries, self._check_topk(topk))


_clients: dict[tuple, RetrievalClient] = {}
_clients_lock = threading.Lock()


def get_client(spec: str, http: HttpOptions | None = None) -> RetrievalClient:
    """The process-wide client for ``spec``: an index is loaded once per process, not per trajectory.

    verl builds a new agent loop (and a tool per worker) for every trajectory, so the loaded
    index must outlive them.
    """
    key = (spec, http)
    with _clients_lock:
        client = _clients.get(key)
        if client is None:
            client = RetrievalClient.from_spec(spec, http)
            _clients[key] = client
        return client
