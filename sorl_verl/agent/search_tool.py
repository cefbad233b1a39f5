"""``SearchTool``: retrieval as a verl ``BaseTool`` for verl's standard ``tool_agent`` loop.

The model calls ``search(query_list=[...])`` in the hermes ``<tool_call>`` format; the tool
returns Search-R1's passage text (``Doc {i}(Title: {title}) {text}``, see
:func:`sorl_verl.agent.retrieval_client.format_passages`) for each query. Use it with
``actor_rollout_ref.rollout.multi_turn.tool_config_path=examples/configs/search_tool.yaml``.

Ours, not Search-R1's: Search-R1 itself parses ``<search>`` tags (that is the ``search_r1``
agent loop); this tool is for chat models that call functions. The schema follows verl's
former Search-R1-like tool (``query_list``); several queries are answered in one request.

Tool config (``config:`` in the YAML; every key optional):
    retriever: ``"embedded"`` (default), an index folder, or an http(s) URL of a Search-R1 server
    topk: passages per query (default 3, Search-R1's)
    timeout_s, max_retries, backoff_s, max_concurrency: HTTP client settings (see ``HttpOptions``)
"""

from __future__ import annotations

import logging
from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from sorl_verl.agent.retrieval_client import EMBEDDED, HttpOptions, RetrievalError, format_passages, get_client

logger = logging.getLogger(__name__)

DEFAULT_SCHEMA = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Searches Wikipedia for passages relevant to each query.",
        "parameters": {
            "type": "object",
            "properties": {
                "query_list": {
                    "type": "array",
                    "description": "One or more search queries (short, keyword-style).",
                }
            },
            "required": ["query_list"],
        },
    },
}


def parse_query_list(parameters: dict[str, Any]) -> list[str]:
    """``query_list`` as a list of non-empty strings (a bare string is accepted as one query)."""
    queries = parameters.get("query_list") if isinstance(parameters, dict) else None
    if isinstance(queries, str):
        queries = [queries]
    if not isinstance(queries, list) or not queries:
        raise ValueError("'query_list' must be a non-empty list of strings")
    bad = [q for q in queries if not isinstance(q, str) or not q.strip()]
    if bad:
        raise ValueError(f"'query_list' must contain non-empty strings, got {bad[0]!r}")
    return [q.strip() for q in queries]


def render_results(queries: list[str], hit_lists: list[list[dict]]) -> str:
    """One query: its passages as Search-R1 prints them; several: one block per query, headed by it."""
    if len(queries) == 1:
        return format_passages(hit_lists[0]).strip()
    blocks = [
        f"Results for query {q!r}:\n{format_passages(hits).strip()}" for q, hits in zip(queries, hit_lists, strict=True)
    ]
    return "\n\n".join(blocks)


class SearchTool(BaseTool):
    """Wikipedia search over the in-process BM25 index or a Search-R1 retrieval server."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None = None):
        config = dict(config or {})
        self.retriever_spec = str(config.get("retriever", EMBEDDED))
        self.topk = int(config.get("topk", 3))
        if self.topk <= 0:
            raise ValueError(f"SearchTool: topk must be positive, got {self.topk}")
        defaults = HttpOptions()
        self.http_options = HttpOptions(
            timeout_s=float(config.get("timeout_s", defaults.timeout_s)),
            max_retries=int(config.get("max_retries", defaults.max_retries)),
            backoff_s=float(config.get("backoff_s", defaults.backoff_s)),
            max_backoff_s=float(config.get("max_backoff_s", defaults.max_backoff_s)),
            max_concurrency=int(config.get("max_concurrency", defaults.max_concurrency)),
        )
        super().__init__(config, tool_schema)

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema:
        return OpenAIFunctionToolSchema.model_validate(DEFAULT_SCHEMA)

    @property
    def client(self):
        # Resolved lazily and cached per process: the index loads on the first call, not at import.
        return get_client(self.retriever_spec, self.http_options)

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[ToolResponse, float, dict]:
        try:
            queries = parse_query_list(parameters)
        except ValueError as error:
            return ToolResponse(text=f"Error: {error}."), 0.0, {"search_error": 1}
        try:
            hit_lists = await self.client.asearch(queries, topk=self.topk)
        except RetrievalError as error:
            logger.warning("SearchTool: %s", error)
            return ToolResponse(text=f"Error: search failed: {error}"), 0.0, {"search_error": 1}
        metrics = {"num_queries": len(queries), "num_hits": sum(len(hits) for hits in hit_lists), "search_error": 0}
        return ToolResponse(text=render_results(queries, hit_lists)), 0.0, metrics
