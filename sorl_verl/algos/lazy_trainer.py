"""Register the ``sorl_sync`` trainer when verl's V1 trainer package is imported, not before.

Importing verl's trainer modules has side effects (it resolves verl's accelerator platform and
caches it), so doing it from the plugin, while ``import verl`` runs in every Ray worker and
before other plugins have registered their platforms, would be wrong. Instead a one-shot
import hook waits for ``verl.trainer.ppo.v1`` (which verl's ``main_ppo`` imports right before
calling ``get_trainer_cls``) and imports :mod:`sorl_verl.algos.trainer` right after it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import logging
import sys

__all__ = ["TRAINER_PACKAGE", "install"]

TRAINER_PACKAGE = "verl.trainer.ppo.v1"
_OUR_TRAINER = "sorl_verl.algos.trainer"


class _RegisterAfterExec(importlib.abc.Loader):
    """Runs the real loader, then imports our trainer module."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _import_our_trainer()

    def __getattr__(self, name):
        return getattr(self._loader, name)


class _TrainerPackageFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != TRAINER_PACKAGE:
            return None
        sys.meta_path.remove(self)  # one shot
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _RegisterAfterExec(spec.loader)
        return spec


def _import_our_trainer() -> None:
    # A failure here must not break verl's own trainers (the user may not want sorl_sync):
    # warn loudly instead; selecting sorl_sync then fails with verl's "Unknown trainer".
    try:
        importlib.import_module(_OUR_TRAINER)
    except Exception as error:  # noqa: BLE001
        logging.getLogger(__name__).warning("sorl-verl: trainer 'sorl_sync' not registered: %r", error)


def install() -> None:
    """Arrange for ``sorl_sync`` to be registered whenever verl's V1 trainers are (idempotent)."""
    if TRAINER_PACKAGE in sys.modules:
        _import_our_trainer()
        return
    if not any(isinstance(finder, _TrainerPackageFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _TrainerPackageFinder())
