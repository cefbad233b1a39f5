"""Search agents for verl: the ``search_r1`` agent loop, ``SearchTool`` and the retrieval client.

Importing this package registers the ``search_r1`` agent loop with verl's public
``verl.experimental.agent_loop.agent_loop.register`` and imports nothing heavy:
``sorl_verl.plugin`` imports it during ``import verl`` in every process, and verl's registry
module pulls in hydra, ray, transformers and the trainer's config classes (several seconds). So:

- if that module is already imported, the loop is registered now;
- otherwise :func:`sorl_verl._import_hooks.call_after_import` registers it right after the
  module first executes, which is before any agent loop can be looked up
  (``AgentLoopWorker`` reads the registry only after importing that module).

Registering imports :mod:`sorl_verl.agent.search_r1_loop` (light once verl's module is loaded).
It is done here, not with ``@register`` in that module: verl's worker loads an
``agent_loop_config_path`` file into the registry before hydra first imports the loop's module,
and a decorator running then would overwrite that entry and drop its options. Nothing here may
raise into ``import verl``: failures are logged as warnings.

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


def _register(registry_module) -> None:
    # Runs right after verl's registry module loads, so no agent_loop_config_path entry
    # (written later, by AgentLoopWorker) can be overwritten here.
    from sorl_verl.agent.search_r1_loop import SearchR1AgentLoop

    registry_module.register(AGENT_LOOP_NAME)(SearchR1AgentLoop)


def register_search_r1() -> None:
    """Make ``search_r1`` resolvable in verl's agent-loop registry."""
    call_after_import(REGISTRY_MODULE, _register)


register_search_r1()
