"""Register the ``sorl_sync`` trainer when verl's V1 trainer package is imported, not before.

Importing verl's trainer modules has side effects (it resolves verl's accelerator platform and
caches it), so doing it from the plugin, while ``import verl`` runs in every Ray worker and
before other plugins have registered their platforms, would be wrong. Instead
:func:`sorl_verl._import_hooks.call_after_import` waits for ``verl.trainer.ppo.v1`` (which verl's ``main_ppo`` imports right before
calling ``get_trainer_cls``) and imports :mod:`sorl_verl.algos.trainer` right after it.
"""

from __future__ import annotations

import importlib

from sorl_verl._import_hooks import call_after_import

__all__ = ["TRAINER_PACKAGE", "install"]

TRAINER_PACKAGE = "verl.trainer.ppo.v1"
_OUR_TRAINER = "sorl_verl.algos.trainer"


def _import_our_trainer(_trainer_package) -> None:
    # A failure is logged as a warning by call_after_import and does not break verl's own
    # trainers (the user may not want sorl_sync); selecting sorl_sync then fails with verl's
    # "Unknown trainer".
    importlib.import_module(_OUR_TRAINER)
    importlib.import_module("sorl_verl.algos.async_trainers")  # sorl_colocate_async, sorl_separate_async
    importlib.import_module("sorl_verl.algos.segment_trainer")  # sorl_segment


def install() -> None:
    """Arrange for ``sorl_sync`` to be registered whenever verl's V1 trainers are."""
    call_after_import(TRAINER_PACKAGE, _import_our_trainer)
