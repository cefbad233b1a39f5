"""One retrieval client for the search tool and the ``search_r1`` agent loop.

``RetrievalClient.search(queries, topk)`` (sync) and ``asearch`` (async, for agent loops)
return Search-R1's hit lists, ``[[{"document": {"id", "contents"}, "score"}, ...], ...]``,
from either backend:

- in process: an index folder loaded with :func:`sorl_verl.retrieval.load_retriever`, or
  ``"embedded"`` for :func:`sorl_verl.retrieval.embedded_index` (BM25 over the shipped
  Wikipedia summaries): no server to start;
- over HTTP: a server speaking Search-R1's API (``POST {url}/retrieve`` with
  ``{"queries", "topk", "return_scores": true}`` -> ``{"result": [[hit, ...], ...]}``), e.g.
  ``sorl-retriever``. One retry loop (the blocking ``search`` runs ``asearch`` on a background
  event loop): retries with exponential backoff (and jitter) on connection errors, 429 and 5xx,
  a total deadline per call (:class:`HttpOptions`), and at most ``max_concurrency`` requests in
  flight per event loop.

Queries longer than :data:`MAX_QUERY_CHARS` are cut to it before they are sent (both backends):
a query is whatever the policy wrote between tags, and a server refuses over-long ones.

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
from dataclasses import dataclass, fields
from typing import Any

EMBEDDED = "embedded"
# Longest query sent, in characters (ours). Search-R1 sends queries as written; a policy can write
# kilobytes of garbage between <search> tags, which the server refuses (its cap, default 8192, is
# larger) and which would cost a BM25 search time proportional to its length.
MAX_QUERY_CHARS = 4096


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
    return [query[:MAX_QUERY_CHARS] for query in queries]


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
    """HTTP client settings (ours; Search-R1 posts once with ``requests`` and no timeout).

    ``deadline_s`` bounds one ``search`` call in total: waiting for a concurrency slot, every
    attempt (a server trickling its reply a byte at a time included), and the backoff sleeps.
    ``timeout_s`` bounds each network operation of one attempt (connect, each read, each write).
    Configured as one nested mapping, ``http: {timeout_s: 30, deadline_s: 60, ...}``, in both the
    ``search_r1`` agent-loop config and the ``SearchTool`` config (:meth:`from_config`).
    """

    timeout_s: float = 30.0
    deadline_s: float = 60.0
    max_retries: int = 4
    backoff_s: float = 0.5
    max_backoff_s: float = 8.0
    max_concurrency: int = 64

    def __post_init__(self):
        for name in ("timeout_s", "deadline_s", "backoff_s", "max_backoff_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
                raise ValueError(f"http.{name} must be a finite number >= 0, got {value!r}")
        for name, minimum in (("max_retries", 0), ("max_concurrency", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"http.{name} must be an integer >= {minimum}, got {value!r}")
        if self.timeout_s == 0 or self.deadline_s == 0:
            raise ValueError("http.timeout_s and http.deadline_s must be positive")

    @classmethod
    def from_config(cls, mapping: Any, where: str = "http") -> HttpOptions:
        """Options from a config mapping (a dict or an OmegaConf node); unknown keys are an error."""
        if mapping is None:
            return cls()
        if not hasattr(mapping, "keys"):
            raise ValueError(f"{where} must be a mapping of HttpOptions fields, got {type(mapping).__name__}")
        values = {str(key): mapping[key] for key in mapping.keys()}
        known = {f.name: f.type for f in fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ValueError(f"{where}: unknown option(s) {unknown}; known: {sorted(known)}")
        try:
            return cls(**{name: _coerce(value, known[name]) for name, value in values.items()})
        except ValueError as error:
            raise ValueError(f"{where}: {error}") from None

    def delay(self, attempt: int) -> float:
        """Exponential backoff with +-25% jitter, so retrying clients do not hit the server in step."""
        base = min(self.max_backoff_s, self.backoff_s * (2**attempt))
        return base * random.uniform(0.75, 1.25)


def _coerce(value: Any, annotation: str) -> Any:
    """YAML/CLI values to the field's type (``"30"`` -> 30.0); anything else is left for validation."""
    if isinstance(value, bool):
        return value
    try:
        if annotation == "float" and isinstance(value, (int, float, str)):
            return float(value)
        if annotation == "int" and isinstance(value, (int, str)):
            return int(value)
    except ValueError:
        pass
    return value


def _retryable_status(status: int) -> bool:
    return status == 429 or status >= 500


class _BackgroundLoop:
    """One event loop in a daemon thread, so the blocking ``search`` runs the same retry loop as ``asearch``."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def run(cls, coroutine):
        with cls._lock:
            if cls._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="retrieval-client", daemon=True).start()
                cls._loop = loop
        return asyncio.run_coroutine_threadsafe(coroutine, cls._loop).result()


class _HttpBackend:
    def __init__(self, url: str, options: HttpOptions):
        url = url.rstrip("/")
        self.url = url if url.endswith("/retrieve") else url + "/retrieve"
        self.options = options
        # httpx's async pool and asyncio.Semaphore belong to one event loop: keep one per loop.
        self._per_loop: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _payload(self, queries: list[str], topk: int) -> dict:
        return {"queries": queries, "topk": topk, "return_scores": True}

    def _check(self, response, num_queries: int, attempts: int, elapsed: float) -> list[list[dict]]:
        if response.status_code >= 400:
            raise RetrievalError(
                f"retriever {self.url}: HTTP {response.status_code} (attempt {attempts}, {elapsed:.1f} s): "
                f"{response.text[:500]}"
            )
        try:
            reply = response.json()
        except ValueError as error:
            raise RetrievalError(f"retriever {self.url}: reply is not JSON: {error}") from error
        return _validate_reply(reply, num_queries, f"retriever {self.url}")

    def search(self, queries: list[str], topk: int) -> list[list[dict]]:
        return _BackgroundLoop.run(self.asearch(queries, topk))

    def _loop_state(self):
        import httpx

        loop = asyncio.get_running_loop()
        state = self._per_loop.get(loop)
        if state is None:
            state = (httpx.AsyncClient(timeout=self.options.timeout_s), asyncio.Semaphore(self.options.max_concurrency))
            self._per_loop[loop] = state
        return state

    async def asearch(self, queries: list[str], topk: int) -> list[list[dict]]:
        """The one retry loop: retries transport errors, 429 and 5xx with backoff, all within ``deadline_s``."""
        import httpx

        client, semaphore = self._loop_state()
        options = self.options
        start = time.monotonic()
        attempts, last = 0, "no attempt finished"
        try:
            async with asyncio.timeout(options.deadline_s):
                for attempt in range(options.max_retries + 1):
                    attempts += 1
                    try:
                        async with semaphore:
                            response = await client.post(self.url, json=self._payload(queries, topk))
                    except httpx.TransportError as error:
                        last = f"{type(error).__name__}: {error}"
                    else:
                        if not _retryable_status(response.status_code):
                            return self._check(response, len(queries), attempts, time.monotonic() - start)
                        last = f"HTTP {response.status_code}: {response.text[:200]}"
                    if attempt < options.max_retries:
                        await asyncio.sleep(options.delay(attempt))
        except TimeoutError:
            raise RetrievalError(
                f"retriever {self.url}: no reply within the deadline of {options.deadline_s:g} s "
                f"({attempts} attempt(s), {time.monotonic() - start:.1f} s elapsed); last error: {last}"
            ) from None
        raise RetrievalError(
            f"retriever {self.url}: failed after {attempts} attempt(s) in {time.monotonic() - start:.1f} s: {last}"
        )


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
