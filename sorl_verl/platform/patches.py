"""The few changes verl 0.9.1 needs to train on a CPU, applied only when the cpu platform is selected.

Infrastructure only. Each shim is narrow, says why it exists, and is checked against the
verl versions it was written for (:data:`TESTED_VERL_VERSIONS`): on another version we
refuse to patch with a clear message instead of silently changing unknown code.

Shims (all no-ops unless ``VERL_PLATFORM=cpu``):

1. process group backend: verl builds ``"cpu:gloo,{device}:{backend}"``, which torch rejects
   when device is ``cpu`` and backend ``gloo`` ("Duplicate device type cpu"): pass ``"gloo"``.
2. FSDP engines registered for device ``cpu``: verl registers its FSDP/FSDP2 engines for
   ``cuda`` and ``npu`` only (the classes are device-agnostic with FSDP2 on gloo).
3. FSDP2 CPU offload without pinned memory: the reference model (``forward_only``) always gets
   ``CPUOffloadPolicy(pin_memory=True)``; pinning needs an accelerator runtime.
4. critic value-head loader: ``load_valuehead_model`` hard-codes ``flash_attention_2``; on CPU
   we load the token-classification head with the attention set in the model config (eager).
"""

from __future__ import annotations

import functools
import logging

import verl

logger = logging.getLogger("sorl_verl.platform")

TESTED_VERL_VERSIONS = ("0.9.1",)

_applied = False


def check_verl_version() -> None:
    """Raise if the installed verl is not one the CPU shims were tested against."""
    if verl.__version__ not in TESTED_VERL_VERSIONS:
        raise RuntimeError(
            f"sorl_verl's cpu platform patches verl internals and was tested with verl "
            f"{', '.join(TESTED_VERL_VERSIONS)}; installed verl is {verl.__version__}. "
            "Install verl==0.9.1 to train on CPU (GPU runs do not use these patches)."
        )


def _patch_process_group() -> None:
    import verl.utils.distributed as dist_utils

    original = dist_utils.initialize_global_process_group_ray
    if getattr(original, "_sorl_cpu", False):
        return

    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        # "cpu:gloo,cpu:gloo" is rejected by torch: gloo alone serves the cpu device.
        return original(timeout_second=timeout_second, backend=backend or "gloo")

    initialize_global_process_group_ray._sorl_cpu = True
    dist_utils.initialize_global_process_group_ray = initialize_global_process_group_ray
    # engine_workers binds the name at import; rebind it there if it is already imported.
    import sys

    workers = sys.modules.get("verl.workers.engine_workers")
    if workers is not None:
        workers.initialize_global_process_group_ray = initialize_global_process_group_ray


def _register_fsdp_engines_for_cpu() -> None:
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp import transformer_impl

    for model_type, engine_cls in (
        ("language_model", transformer_impl.FSDPEngineWithLMHead),
        ("value_model", transformer_impl.FSDPEngineWithValueHead),
    ):
        for backend in ("fsdp", "fsdp2"):
            registry = EngineRegistry._engines.setdefault(model_type, {}).setdefault(backend, {})
            registry.setdefault("cpu", engine_cls)


def _unpinned_cpu_offload() -> None:
    from verl.workers.engine.fsdp import transformer_impl

    base = transformer_impl.CPUOffloadPolicy
    if getattr(base, "_sorl_cpu", False):
        return

    class UnpinnedCPUOffloadPolicy(base):
        """``CPUOffloadPolicy`` that never pins host memory (pinning needs CUDA)."""

        _sorl_cpu = True

        def __init__(self, pin_memory: bool = True, **kwargs):
            super().__init__(pin_memory=False, **kwargs)

    transformer_impl.CPUOffloadPolicy = UnpinnedCPUOffloadPolicy


def _cpu_valuehead_loader() -> None:
    import verl.utils.model as model_utils

    if getattr(model_utils.load_valuehead_model, "_sorl_cpu", False):
        return

    def load_valuehead_model(local_path, torch_dtype, model_config, trust_remote_code):
        # A per-token scalar head; attention comes from model_config (eager on CPU) instead of
        # verl's hard-coded flash_attention_2, which does not exist without CUDA.
        from transformers import AutoModelForTokenClassification

        model_config.num_labels = 1
        return AutoModelForTokenClassification.from_pretrained(
            local_path,
            torch_dtype=torch_dtype,
            config=model_config,
            attn_implementation=getattr(model_config, "_attn_implementation", None) or "eager",
            trust_remote_code=trust_remote_code,
        )

    load_valuehead_model._sorl_cpu = True
    model_utils.load_valuehead_model = load_valuehead_model


def apply_cpu_patches() -> None:
    """Apply every CPU shim once (idempotent). Call only when the cpu platform is selected."""
    global _applied
    if _applied:
        return
    check_verl_version()
    _patch_process_group()
    _register_fsdp_engines_for_cpu()
    _unpinned_cpu_offload()
    _cpu_valuehead_loader()
    _applied = True
    logger.info("sorl_verl: cpu platform patches applied to verl %s", verl.__version__)
