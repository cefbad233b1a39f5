"""Entry point of the ``verl.plugins`` group: registers everything sorl-verl adds to verl.

verl imports this module while it is itself being imported, in the driver and in every
Ray worker. verl swallows exceptions raised here (logged at DEBUG only), so the tests
check from a fresh process that each registered name resolves after ``import verl``.
"""

import sorl_verl.algos  # noqa: F401  policy losses and advantage estimators
import sorl_verl.agent  # noqa: F401  search_r1 agent loop
import sorl_verl.platform  # noqa: F401  cpu platform, engine and hf rollout replica
