"""CPU support for verl's real trainer: the ``cpu`` platform, FSDP2 on gloo, the ``hf`` rollout.

Infrastructure, not part of the SORL paper. Imported by :mod:`sorl_verl.plugin` on every
``import verl`` (driver and Ray workers). It does nothing unless the cpu platform is
selected explicitly, so GPU machines are unaffected:

- ``VERL_PLATFORM=cpu`` in the environment (verl's own platform override): the platform is
  set up when this package is imported, or
- ``trainer.device=cpu`` in the trainer's config (on the command line or in a config file), in
  a process with no CUDA or NPU device: verl's entry points (``main_ppo``, the async and SFT
  trainers) first call ``verl.utils.device.auto_set_device(config)``, which replaces the device
  by the detected platform's, and with no accelerator verl's detection falls back to ``cuda``.
  Only there (and only on verl 0.9.x) a shim of that function selects the cpu platform instead,
  then exports ``VERL_PLATFORM=cpu`` so the Ray workers this driver starts inherit the choice.
  Where an accelerator is visible nothing of ours wraps verl, and ``trainer.device`` follows
  verl's own rule (the accelerator wins); ``VERL_PLATFORM=cpu`` selects the CPU there.

Selecting it registers the platform, applies :func:`sorl_verl.platform.patches.apply_cpu_patches`
(version-checked shims and registrations, including the ``hf`` rollout). The Hydra overrides a
CPU run needs are in :mod:`sorl_verl.platform.cpu_overrides`.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping

from sorl_verl._import_hooks import call_after_import
from sorl_verl._verl_version import verl_patchable

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


def _shim_auto_set_device(device_module) -> None:
    """Let ``trainer.device=cpu`` select the cpu platform, where verl would override it wrongly.

    Only in a process with no CUDA/NPU device (verl's own ``is_cuda_available`` and
    ``is_npu_available`` flags), on a patchable verl: elsewhere verl's function stays untouched.
    """
    if device_module.is_cuda_available or device_module.is_npu_available or not verl_patchable():
        return
    from sorl_verl.platform.patches import apply_shim

    apply_shim(
        device_module,
        "auto_set_device",
        _select_cpu_from_config,
        # no public hook sees the config before verl replaces trainer.device by its fallback 'cuda'
        "without an accelerator verl sets trainer.device=cpu to its fallback 'cuda'; the entry points read it here first",
    )


if cpu_selected():
    activate()
else:
    call_after_import("verl.utils.device", _shim_auto_set_device)
