"""Search agents for verl: the ``search_r1`` agent loop, ``SearchTool`` and the retrieval client.

Importing this package registers the ``search_r1`` agent loop with verl's agent-loop
registry and imports nothing heavy: ``sorl_verl.plugin`` imports it during ``import verl``
in every process, and verl's registry module (``verl.experimental.agent_loop.agent_loop``)
pulls in hydra, ray, transformers and the trainer's config classes (several seconds). So:

- if that module is already imported, the entry is added now;
- otherwise a one-shot import hook adds it right after the module first executes, which
  is before any agent loop can be looked up (``AgentLoopWorker`` reads the registry only
  after importing that module).

The entry is what verl's ``@register`` would write, ``{"_target_": "<module>.<class>"}``;
hydra imports ``sorl_verl.agent.search_r1_loop`` when the first ``search_r1`` trajectory
starts. Nothing here may raise into ``import verl``: failures are logged as warnings.

Modules: :mod:`~sorl_verl.agent.retrieval_client` (search over an in-process index or
Search-R1's HTTP API, and Search-R1's passage format), :mod:`~sorl_verl.agent.search_tool`
(``SearchTool`` for verl's ``tool_agent``), :mod:`~sorl_verl.agent.search_r1_loop`.
"""

from __future__ import annotations

import importlib.abc
import logging
import sys

AGENT_LOOP_NAME = "search_r1"
AGENT_LOOP_TARGET = "sorl_verl.agent.search_r1_loop.SearchR1AgentLoop"
REGISTRY_MODULE = "verl.experimental.agent_loop.agent_loop"

_logger = logging.getLogger(__name__)


def _add_registry_entry(registry_module) -> None:
    try:
        registry_module._agent_loop_registry.setdefault(AGENT_LOOP_NAME, {"_target_": AGENT_LOOP_TARGET})
    except Exception:  # noqa: BLE001 - must never break verl's own import
        _logger.warning("sorl_verl: could not register the %s agent loop", AGENT_LOOP_NAME, exc_info=True)


class _LoaderThatRegisters(importlib.abc.Loader):
    """Wraps the registry module's loader: executes it, then adds our entry."""

    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        _add_registry_entry(module)

    def __getattr__(self, name):  # get_source, get_filename, ... for tracebacks and inspect
        return getattr(self._inner, name)


class _RegisterOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; for the registry module it wraps the spec the other finders return."""

    def find_spec(self, fullname, path, target=None):
        if fullname != REGISTRY_MODULE:
            return None
        _remove_hook()  # one shot, and no recursion while the other finders look
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)
            spec = find_spec(fullname, path, target) if find_spec else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _LoaderThatRegisters(spec.loader)
                return spec
        return None


def _remove_hook() -> None:
    sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, _RegisterOnImport)]


def register_search_r1() -> None:
    """Make ``search_r1`` resolvable in verl's agent-loop registry (idempotent)."""
    module = sys.modules.get(REGISTRY_MODULE)
    if module is not None and hasattr(module, "_agent_loop_registry"):
        _add_registry_entry(module)
    elif not any(isinstance(finder, _RegisterOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegisterOnImport())


register_search_r1()
