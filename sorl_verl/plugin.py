"""Entry point of the ``verl.plugins`` group: registers everything sorl-verl adds to verl.

verl imports this module while it is itself being imported, in the driver and in every
Ray worker. verl swallows exceptions raised here and logs them at DEBUG only, so each part
is imported on its own and a failure is logged as a warning naming the part: one broken
optional dependency must not silently unregister the losses. The tests check from a fresh
process that every registered name resolves after ``import verl``.
"""

import importlib
import logging

_logger = logging.getLogger("sorl_verl")

PARTS = (
    "sorl_verl.algos",  # policy losses, advantage estimators
    "sorl_verl.agent",  # search_r1 agent loop
    "sorl_verl.platform",  # cpu platform, engine and hf rollout replica (inactive unless selected)
)


def _register_all() -> None:
    for name in PARTS:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - reported, then the other parts still register
            _logger.warning("sorl_verl: failed to register %s", name, exc_info=True)


_register_all()
