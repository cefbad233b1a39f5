"""CPU support for verl's real trainer: the ``cpu`` platform, FSDP2 on gloo, the ``hf`` rollout.

Infrastructure, not part of the SORL paper. Imported by :mod:`sorl_verl.plugin` on every
``import verl`` (driver and Ray workers). It does nothing unless the cpu platform is
selected explicitly, so GPU machines are unaffected:

- ``VERL_PLATFORM=cpu`` in the environment, or
- a ``trainer.device=cpu`` override on the command line of the process (we then export
  ``VERL_PLATFORM=cpu`` so the Ray workers started by this driver inherit the choice).

When selected, it registers the platform, applies the version-checked shims of
:mod:`sorl_verl.platform.patches` and registers the ``hf`` rollout. The Hydra overrides a
CPU run needs are in :mod:`sorl_verl.platform.cpu_overrides`.
"""

from __future__ import annotations

import os
import re
import sys

PLATFORM_ENV = "VERL_PLATFORM"
ROLLOUT_NAME = "hf"
_DEVICE_OVERRIDE = re.compile(r"^\+{0,2}trainer\.device=['\"]?cpu['\"]?$")


def cpu_selected(argv: list[str] | None = None, environ: dict | None = None) -> bool:
    """True when the cpu platform was chosen explicitly (env var or ``trainer.device=cpu``)."""
    environ = os.environ if environ is None else environ
    if environ.get(PLATFORM_ENV, "").strip().lower() == "cpu":
        return True
    argv = sys.argv if argv is None else argv
    return any(_DEVICE_OVERRIDE.match(arg) for arg in argv[1:])


def register_hf_rollout() -> None:
    """Make ``rollout.name=hf`` resolve in verl's replica and adapter registries."""
    from verl.workers.rollout import base as rollout_base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    from sorl_verl.platform.hf_rollout import get_hf_replica_class

    rollout_base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = "sorl_verl.platform.hf_rollout.HFServerAdapter"
    RolloutReplicaRegistry.register(ROLLOUT_NAME, get_hf_replica_class)


def activate() -> None:
    """Select and set up the cpu platform in this process (idempotent)."""
    os.environ[PLATFORM_ENV] = "cpu"  # inherited by the Ray cluster this process starts
    from sorl_verl.platform import cpu  # noqa: F401  registers PlatformCPU
    from sorl_verl.platform.patches import apply_cpu_patches

    apply_cpu_patches()
    register_hf_rollout()


if cpu_selected():
    activate()
