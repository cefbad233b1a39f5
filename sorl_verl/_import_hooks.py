"""Run a callback right after a module is first imported, without importing it ourselves.

The plugin runs inside ``import verl`` in every process. Some of what we register lives in
verl modules that are expensive to import (the agent-loop registry pulls in hydra, ray and
transformers) or have side effects (the trainer package fixes verl's accelerator platform).
So instead of importing them, we wait: a one-shot meta-path finder wraps the module's loader
and calls our callback as soon as verl itself imports the module.
"""

from __future__ import annotations

import importlib.abc
import logging
import sys
from collections.abc import Callable
from types import ModuleType

__all__ = ["call_after_import"]

_logger = logging.getLogger("sorl_verl")
Callback = Callable[[ModuleType], None]


def _run(callbacks: list[Callback], module: ModuleType) -> None:
    for callback in callbacks:
        try:
            callback(module)
        except Exception:  # noqa: BLE001 - must never break the import of a verl module
            _logger.warning("sorl_verl: hook %r after importing %s failed", callback, module.__name__, exc_info=True)


class _LoaderThenCallbacks(importlib.abc.Loader):
    """Executes the real loader, then the callbacks waiting for this module."""

    def __init__(self, inner: importlib.abc.Loader, callbacks: list[Callback]):
        self._inner = inner
        self._callbacks = callbacks

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        _run(self._callbacks, module)

    def __getattr__(self, name):  # get_source, get_filename, ... for tracebacks and inspect
        return getattr(self._inner, name)


class _AfterImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the spec that the other finders return for a watched module."""

    def __init__(self) -> None:
        self.pending: dict[str, list[Callback]] = {}

    def find_spec(self, fullname, path, target=None):
        callbacks = self.pending.pop(fullname, None)
        if callbacks is None:
            return None
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)
            spec = None if finder is self or find_spec is None else find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _LoaderThenCallbacks(spec.loader, callbacks)
                return spec
        return None


_FINDER = _AfterImportFinder()


def call_after_import(module_name: str, callback: Callback) -> None:
    """Call ``callback(module)`` once ``module_name`` is imported: now if it already is.

    Errors raised by the callback are logged as warnings, never raised into the importer.
    """
    module = sys.modules.get(module_name)
    if module is not None:
        _run([callback], module)
        return
    _FINDER.pending.setdefault(module_name, []).append(callback)
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
