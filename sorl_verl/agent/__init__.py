"""Search agents for verl: the ``search_r1`` agent loop, ``SearchTool`` and the retrieval client.

Importing this package registers the ``search_r1`` agent loop with verl's agent-loop
registry and imports nothing heavy: ``sorl_verl.plugin`` imports it during ``import verl``
in every process, and verl's registry module (``verl.experimental.agent_loop.agent_loop``)
pulls in hydra, ray, transformers and the trainer's config classes (several seconds). So:

- if that module is already imported, the entry is added now;
- otherwise :func:`sorl_verl._import_hooks.call_after_import` adds it right after the
  module first executes, which is before any agent loop can be looked up
  (``AgentLoopWorker`` reads the registry only after importing that module).

The entry is what verl's ``@register`` would write, ``{"_target_": "<module>.<class>"}``;
hydra imports ``sorl_verl.agent.search_r1_loop`` when the first ``search_r1`` trajectory
starts. Nothing here may raise into ``import verl``: failures are logged as warnings.

Modules: :mod:`~sorl_verl.agent.retrieval_client` (search over an in-process index or
Search-R1's HTTP API, and Search-R1's passage format), :mod:`~sorl_verl.agent.search_tool`
(``SearchTool`` for verl's ``tool_agent``), :mod:`~sorl_verl.agent.search_r1_loop`.
"""

from __future__ import annotations

import logging

from sorl_verl._import_hooks import call_after_import

AGENT_LOOP_NAME = "search_r1"
AGENT_LOOP_TARGET = "sorl_verl.agent.search_r1_loop.SearchR1AgentLoop"
REGISTRY_MODULE = "verl.experimental.agent_loop.agent_loop"

_logger = logging.getLogger(__name__)


def _add_registry_entry(registry_module) -> None:
    # setdefault: an entry from verl's agent_loop_config_path (with its options) wins.
    registry_module._agent_loop_registry.setdefault(AGENT_LOOP_NAME, {"_target_": AGENT_LOOP_TARGET})


def register_search_r1() -> None:
    """Make ``search_r1`` resolvable in verl's agent-loop registry (idempotent)."""
    call_after_import(REGISTRY_MODULE, _add_registry_entry)


register_search_r1()
