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
    http: HTTP client settings for a URL retriever, the same mapping as the ``search_r1`` loop's
        (``timeout_s``, ``deadline_s``, ``max_retries``, ``backoff_s``, ``max_backoff_s``,
        ``max_concurrency``; see ``HttpOptions``). The former flat keys (``timeout_s: 30`` beside
        ``retriever``) are still read, with a deprecation warning.

Retrieval failures (after the client's retries, within its deadline) raise
:class:`~sorl_verl.agent.retrieval_client.RetrievalError`, as in the ``search_r1`` loop: an outage
is the environment's fault, not an observation the policy should be trained on. Note that verl
0.9.1's ``tool_agent`` loop catches every exception a tool raises
(``tool_agent_loop.py``, ``ToolAgentLoop._call_tool``) and shows its message to the model as the
tool's reply; we leave that verl behaviour alone. Bad arguments written by the model
(``query_list`` missing or not strings) are the model's action and get an error message as the
tool's reply.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from sorl_verl.agent.retrieval_client import EMBEDDED, HttpOptions, format_passages, get_client

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


_FLAT_HTTP_KEYS = ("timeout_s", "deadline_s", "max_retries", "backoff_s", "max_backoff_s", "max_concurrency")


def http_options_from_tool_config(config: dict) -> HttpOptions:
    """``HttpOptions`` from the tool config's ``http:`` mapping (or, deprecated, its flat keys)."""
    flat = {key: config[key] for key in _FLAT_HTTP_KEYS if key in config}
    if flat and config.get("http") is not None:
        raise ValueError(f"SearchTool config: HTTP options both flat {sorted(flat)} and under 'http'; keep 'http' only")
    if flat:
        message = (
            f"SearchTool config: flat HTTP keys {sorted(flat)} are deprecated; "
            f"nest them under 'http:' (as in examples/configs/search_tool.yaml)"
        )
        warnings.warn(message, DeprecationWarning, stacklevel=3)
        logger.warning(message)
        return HttpOptions.from_config(flat, "SearchTool config")
    return HttpOptions.from_config(config.get("http"), "SearchTool config http")


class SearchTool(BaseTool):
    """Wikipedia search over the in-process BM25 index or a Search-R1 retrieval server."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema | None = None):
        config = dict(config or {})
        self.retriever_spec = str(config.get("retriever", EMBEDDED))
        self.topk = int(config.get("topk", 3))
        if self.topk <= 0:
            raise ValueError(f"SearchTool: topk must be positive, got {self.topk}")
        self.http_options = http_options_from_tool_config(config)
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
        # A RetrievalError propagates: see the module docstring for the policy and its reason.
        hit_lists = await self.client.asearch(queries, topk=self.topk)
        metrics = {"num_queries": len(queries), "num_hits": sum(len(hits) for hits in hit_lists), "search_error": 0}
        return ToolResponse(text=render_results(queries, hit_lists)), 0.0, metrics
