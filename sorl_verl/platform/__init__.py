"""CPU support for verl's real trainer: the ``cpu`` platform, FSDP2 on gloo, the ``hf`` rollout.

Infrastructure, not part of the SORL paper. Imported by :mod:`sorl_verl.plugin` on every
``import verl`` (driver and Ray workers). It does nothing unless the cpu platform is
selected explicitly, so GPU machines are unaffected:

- ``VERL_PLATFORM=cpu`` in the environment (verl's own platform override): the platform is
  set up when this package is imported, or
- ``trainer.device=cpu`` in the trainer's config (on the command line or in a config file):
  verl's entry points (``main_ppo``, the async and SFT trainers) first call
  ``verl.utils.device.auto_set_device(config)``, which would switch the device to the detected
  accelerator; :func:`auto_set_device` wraps it and selects the cpu platform there instead,
  then exports ``VERL_PLATFORM=cpu`` so the Ray workers this driver starts inherit the choice.

Selecting it registers the platform, applies :func:`sorl_verl.platform.patches.apply_cpu_patches`
(version-checked shims and registrations, including the ``hf`` rollout). The Hydra overrides a
CPU run needs are in :mod:`sorl_verl.platform.cpu_overrides`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping

from sorl_verl._import_hooks import call_after_import

PLATFORM_ENV = "VERL_PLATFORM"


def cpu_selected(environ: Mapping[str, str] | None = None) -> bool:
    """True when ``VERL_PLATFORM=cpu`` is set (case and spaces ignored, as verl reads it)."""
    environ = os.environ if environ is None else environ
    return environ.get(PLATFORM_ENV, "").strip().lower() == "cpu"


def config_selects_cpu(config) -> bool:
    """True when a trainer config asks for ``trainer.device=cpu``."""
    trainer = getattr(config, "trainer", None) if config is not None else None
    return str(getattr(trainer, "device", "") or "").strip().lower() == "cpu"


def activate() -> None:
    """Select and set up the cpu platform in this process (idempotent)."""
    os.environ[PLATFORM_ENV] = "cpu"  # verl's platform choice; inherited by the Ray cluster this process starts
    from verl.plugin.platform import get_platform, set_platform

    from sorl_verl.platform.cpu import PlatformCPU  # registers the platform
    from sorl_verl.platform.patches import apply_cpu_patches

    if get_platform().device_name != "cpu":  # resolved before the config selected cpu
        set_platform(PlatformCPU())
    apply_cpu_patches()


def _select_cpu_from_config(original):
    @functools.wraps(original)
    def auto_set_device(config) -> None:
        if config_selects_cpu(config):
            activate()
        return original(config)

    return auto_set_device


def _wrap_auto_set_device(device_module) -> None:
    # Installed in every process, whatever the verl version: it only reads the config, and
    # activate() checks the verl version before patching anything.
    from sorl_verl.platform.patches import apply_shim

    apply_shim(
        device_module,
        "auto_set_device",
        _select_cpu_from_config,
        "verl's entry points read trainer.device here first; trainer.device=cpu selects the cpu platform",
    )


if cpu_selected():
    activate()
else:
    call_after_import("verl.utils.device", _wrap_auto_set_device)
