"""SORL algorithms registered into verl at import time.

Importing this package registers the policy losses ``turn_ppo``, ``s_ppo``, ``st_ppo``,
``so_ppo`` and the advantage estimator ``turn_gae``, and arranges for the trainer
``sorl_sync`` (verl's V1 sync trainer, handing critic values to ``turn_gae``) to be registered
as soon as verl's trainer package is imported (:mod:`sorl_verl.algos.lazy_trainer`), and for
verl's engine to carry the batch-level clipping-bias correction (:mod:`sorl_verl.algos.correction`).
:mod:`sorl_verl.plugin` imports this package through verl's ``verl.plugins`` entry point, so
``import verl`` alone is enough in every process.
"""

from . import advantages, correction, lazy_trainer, losses  # noqa: F401  (registration happens at import)

lazy_trainer.install()
correction.install()  # the batch-level clipping-bias correction's hook on verl's engine
