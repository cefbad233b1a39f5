"""Search agents for verl: the ``search_r1`` agent loop, ``SearchTool`` and the retrieval client.

Importing this package registers the ``search_r1`` agent loop with verl's public
``verl.experimental.agent_loop.agent_loop.register`` and imports nothing heavy:
``sorl_verl.plugin`` imports it during ``import verl`` in every process, and verl's registry
module pulls in hydra, ray, transformers and the trainer's config classes (several seconds). So:

- if that module is already imported, the loop is registered now;
- otherwise :func:`sorl_verl._import_hooks.call_after_import` registers it right after the
  module first executes, which is before any agent loop can be looked up
  (``AgentLoopWorker`` reads the registry only after importing that module).

Registering stores the loop's dotted path without importing :mod:`sorl_verl.agent.search_r1_loop`.
It is done here, not with ``@register`` in that module: verl's worker loads an
``agent_loop_config_path`` file into the registry before hydra first imports the loop's module,
and a decorator running then would overwrite that entry and drop its options. Nothing here may
raise into ``import verl``: failures are logged as warnings.

Modules: :mod:`~sorl_verl.agent.retrieval_client` (search over an in-process index or
Search-R1's HTTP API, and Search-R1's passage format), :mod:`~sorl_verl.agent.search_tool`
(``SearchTool`` for verl's ``tool_agent``), :mod:`~sorl_verl.agent.search_r1_loop`,
:mod:`~sorl_verl.agent.segments` (segment mode's episode pool and placement).
"""

from __future__ import annotations

import logging

from sorl_verl._import_hooks import call_after_import

AGENT_LOOP_NAME = "search_r1"
AGENT_LOOP_TARGET = "sorl_verl.agent.search_r1_loop.SearchR1AgentLoop"
REGISTRY_MODULE = "verl.experimental.agent_loop.agent_loop"

_logger = logging.getLogger(__name__)


class _LoopReference:
    """What verl's ``register`` reads of a class: its ``__module__`` and ``__qualname__`` only
    (it stores the dotted path, and hydra imports the loop when a worker instantiates it).

    Registering this reference instead of the class keeps the loop module unimported here: that
    module imports verl's registry module, so importing it from this hook would be circular
    whenever the loop module is the one that first imports verl's registry (tests do).
    """

    __module__, _, __qualname__ = AGENT_LOOP_TARGET.rpartition(".")


def _register(registry_module) -> None:
    # Runs right after verl's registry module loads, so no agent_loop_config_path entry
    # (written later, by AgentLoopWorker) can be overwritten here.
    registry_module.register(AGENT_LOOP_NAME)(_LoopReference)


def register_search_r1() -> None:
    """Make ``search_r1`` resolvable in verl's agent-loop registry."""
    call_after_import(REGISTRY_MODULE, _register)


register_search_r1()
