"""verl's ``cpu`` platform: device ``cpu``, collectives over ``gloo``, no accelerator.

Infrastructure only (nothing here is from the SORL paper). verl 0.9 resolves every device
question through :func:`verl.plugin.platform.get_platform`; this class answers them for a
machine without an accelerator. Selected only explicitly (``VERL_PLATFORM=cpu``): its
``is_platform_available`` is always ``False``, so auto-detection on a GPU machine (or on
a machine whose GPU is not visible) never picks it.
"""

from __future__ import annotations

import os
import types
from contextlib import contextmanager
from typing import Any

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry


def _host_memory() -> tuple[int, int]:
    """(free, total) bytes of host memory: what ``mem_get_info`` means on a CPU."""
    try:
        import psutil

        vm = psutil.virtual_memory()
        return int(vm.available), int(vm.total)
    except ImportError:  # psutil is a verl dependency; keep a safe answer anyway
        return 0, 0


def _zero(*args: Any, **kwargs: Any) -> int:
    return 0


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


def _build_device_module() -> types.ModuleType:
    """A ``torch.cuda``-shaped namespace for the calls verl makes on ``get_torch_device()``.

    ``torch.cpu`` provides streams, events, ``synchronize`` and ``device_count``; the rest
    (memory statistics, RNG state, device name, allocator/IPC hooks) has no CPU meaning,
    so it answers with the host-side equivalent (RNG state, host memory) or a no-op.
    """
    module = types.ModuleType("sorl_verl_cpu_device")
    for name in ("Stream", "Event", "StreamContext", "stream", "current_stream", "synchronize", "device_count"):
        setattr(module, name, getattr(torch.cpu, name))
    module.is_available = lambda: True
    module.is_initialized = lambda: True
    module.current_device = lambda: torch.device("cpu")
    module.set_device = _noop  # one device; verl calls set_device(local_rank)
    module.get_device_name = lambda *a, **k: "CPU"  # flops_counter looks this up
    module.get_device_capability = lambda *a, **k: (None, None)
    module.empty_cache = _noop
    module.ipc_collect = _noop
    module.reset_peak_memory_stats = _noop
    module.set_per_process_memory_fraction = _noop
    module.mem_get_info = lambda *a, **k: _host_memory()
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
        setattr(module, name, _zero)
    module.memory_stats = lambda *a, **k: {}
    # verl saves/restores "the device RNG" in checkpoints: on CPU that is torch's default generator.
    module.get_rng_state = lambda *a, **k: torch.get_rng_state()
    module.set_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    module.manual_seed = lambda seed: torch.manual_seed(seed)
    module.manual_seed_all = lambda seed: torch.manual_seed(seed)
    module.nvtx = types.SimpleNamespace(range=lambda *a, **k: contextmanager(lambda: (yield))())
    return module


CPU_DEVICE_MODULE = _build_device_module()


@PlatformRegistry.register(platform="cpu")
class PlatformCPU(PlatformBase):
    """The host CPU as verl's device; ``gloo`` for collectives; Ray's logical GPUs as slots."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return CPU_DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Never auto-detected: only VERL_PLATFORM=cpu (or trainer.device=cpu) selects it.
        return False

    def current_device(self) -> torch.device:
        # verl uses the result as a ``.to(...)`` target: an int would mean cuda:<int>.
        return torch.device("cpu")

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        # Ray sets it for actors holding logical GPUs; harmless without CUDA.
        return "CUDA_VISIBLE_DEVICES"

    def ray_resource_name(self) -> str:
        # verl places workers on Ray "GPU" bundles (RayResourcePool use_gpu=True is hard-coded),
        # so on CPU Ray is started with logical GPUs (``ray_init.num_gpus``) that stand for slots.
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return []

    def is_ipc_supported(self) -> bool:
        return False

    def get_device_uuid(self, device_id: int) -> str:
        return f"cpu-{os.getpid()}-{device_id}"

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def cudart(self) -> None:
        return None
