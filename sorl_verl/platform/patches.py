"""The few changes verl 0.9.1 needs to train on a CPU, applied only when the cpu platform is selected.

Infrastructure only. verl's public registration calls are used where verl has one
(``EngineRegistry.register``, ``RolloutReplicaRegistry.register``, ``PlatformRegistry.register``,
``set_platform``). What remains are shims: each replaces one name at the one place verl
reads it, through :func:`apply_shim`, which records the original and the reason in
:data:`SHIMS`. They are checked against the verl versions they were written for
(:func:`sorl_verl._verl_version.verl_patchable`, verl 0.9.x): on another version we refuse to
patch with a clear message instead of silently changing unknown code.

When the cpu platform is selected (never otherwise):

1. process group backend (shim): ``engine_workers`` calls ``initialize_global_process_group_ray()``
   whose default backend is ``"cpu:gloo,{device}:{backend}"``; torch rejects ``cpu:gloo,cpu:gloo``
   ("Duplicate device type cpu"), so that call site gets ``"gloo"`` as its default.
2. FSDP engines for device ``cpu`` (public registration): verl registers its FSDP/FSDP2 engines
   for ``cuda`` and ``npu`` only; the same classes serve ``cpu`` (FSDP2 on gloo).
3. FSDP2 offload without pinned memory (shim): the reference model (``forward_only``) always gets
   ``CPUOffloadPolicy(pin_memory=True)``, and pinning needs an accelerator runtime. The FSDP
   engine's call to ``apply_fsdp2`` receives the same policy unpinned; nothing else sees it.
4. critic value-head loader (shim): ``load_valuehead_model`` hard-codes ``flash_attention_2``,
   which does not exist without CUDA. The token-classification head is loaded with the
   attention in the model config (``eager`` from the CPU overrides); any other model goes to
   verl's own loader unchanged.
5. ``rollout.name=hf`` (``register_hf_rollout``): the replica class through
   ``RolloutReplicaRegistry.register``; verl 0.9.1 has no registration call for the worker-side
   adapter, so its entry in ``verl.workers.rollout.base._ROLLOUT_REGISTRY`` is a shim.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from sorl_verl._import_hooks import call_after_import
from sorl_verl._verl_version import PATCHABLE_VERL, TESTED_VERL, installed_verl, verl_patchable

logger = logging.getLogger("sorl_verl.platform")

ROLLOUT_NAME = "hf"
MISSING = object()  # ``Shim.original`` of a mapping entry that did not exist


@dataclass(frozen=True)
class Shim:
    """One replaced name in verl: where, why, and what was there before."""

    target: str  # "module.attribute" or "module.mapping[key]"
    reason: str
    original: Any
    replacement: Any


SHIMS: dict[str, Shim] = {}

_applied = False


def check_verl_version() -> None:
    """Raise if the installed verl is not one the CPU shims were written for."""
    if not verl_patchable():
        raise RuntimeError(
            f"sorl_verl's cpu platform patches verl internals and was tested with verl {TESTED_VERL} "
            f"(accepts {PATCHABLE_VERL}); installed verl is {installed_verl()}. "
            f"Install verl=={TESTED_VERL} to train on CPU (GPU runs do not use these patches)."
        )


def apply_shim(owner: Any, name: Any, make: Callable[[Any], Any], reason: str, *, label: str | None = None) -> Shim:
    """Replace ``owner.name`` (or ``owner[name]`` for a mapping) by ``make(original)``, once.

    Records the original and the reason in :data:`SHIMS` under ``label`` (default: the
    owner's module name and ``name``); a second call for the same label returns the first
    record without patching again. For a mapping entry that did not exist, the original is
    :data:`MISSING`.
    """
    is_item = isinstance(owner, MutableMapping)
    target = label or f"{getattr(owner, '__name__', type(owner).__name__)}.{name}"
    if target in SHIMS:
        return SHIMS[target]
    original = owner.get(name, MISSING) if is_item else getattr(owner, name)
    replacement = make(original)
    if is_item:
        owner[name] = replacement
    else:
        setattr(owner, name, replacement)
    SHIMS[target] = shim = Shim(target, reason, original, replacement)
    return shim


# -- 1. process group backend --------------------------------------------------------------


def _gloo_by_default(original):
    @functools.wraps(original)
    def initialize_global_process_group_ray(timeout_second=None, backend=None):
        return original(timeout_second=timeout_second, backend=backend or "gloo")

    return initialize_global_process_group_ray


def _shim_process_group(engine_workers) -> None:
    apply_shim(
        engine_workers,
        "initialize_global_process_group_ray",
        _gloo_by_default,
        "verl's default backend 'cpu:gloo,cpu:gloo' is rejected by torch; gloo alone serves the cpu device",
    )


# -- 2. FSDP engines for device cpu --------------------------------------------------------


def _register_fsdp_engines_for_cpu() -> None:
    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp import transformer_impl

    for model_type, engine_cls in (
        ("language_model", transformer_impl.FSDPEngineWithLMHead),
        ("value_model", transformer_impl.FSDPEngineWithValueHead),
    ):
        EngineRegistry.register(model_type=model_type, backend=["fsdp", "fsdp2"], device="cpu")(engine_cls)


# -- 3. FSDP2 offload without pinned memory ------------------------------------------------


def unpin_offload_policy(fsdp_kwargs: dict) -> dict:
    """``fsdp_kwargs`` with a pinned ``CPUOffloadPolicy`` replaced by an unpinned one (a copy)."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    policy = fsdp_kwargs.get("offload_policy")
    if isinstance(policy, CPUOffloadPolicy) and policy.pin_memory:
        return {**fsdp_kwargs, "offload_policy": CPUOffloadPolicy(pin_memory=False)}
    return fsdp_kwargs


def _apply_fsdp2_unpinned(original):
    @functools.wraps(original)
    def apply_fsdp2(model, fsdp_kwargs, config):
        return original(model, unpin_offload_policy(fsdp_kwargs), config)

    return apply_fsdp2


def _shim_offload_policy(transformer_impl) -> None:
    apply_shim(
        transformer_impl,
        "apply_fsdp2",
        _apply_fsdp2_unpinned,
        "the reference model gets CPUOffloadPolicy(pin_memory=True); pinning needs an accelerator runtime",
    )


# -- 4. critic value-head loader -----------------------------------------------------------


def _valuehead_with_config_attention(original):
    @functools.wraps(original)
    def load_valuehead_model(local_path, torch_dtype, model_config, trust_remote_code):
        from transformers import AutoModelForTokenClassification

        try:  # verl's first choice, with the configured attention instead of flash_attention_2
            return AutoModelForTokenClassification.from_pretrained(
                pretrained_model_name_or_path=local_path,
                torch_dtype=torch_dtype,
                config=model_config,
                attn_implementation=getattr(model_config, "_attn_implementation", None) or "eager",
                trust_remote_code=trust_remote_code,
            )
        except Exception:  # not a token-classification model: verl's own fallback (trl value head)
            return original(local_path, torch_dtype, model_config, trust_remote_code)

    return load_valuehead_model


def _shim_valuehead_loader(model_utils) -> None:
    apply_shim(
        model_utils,
        "load_valuehead_model",
        _valuehead_with_config_attention,
        "verl hard-codes flash_attention_2 for the critic's head; it does not exist without CUDA",
    )


# -- 5. the hf rollout ---------------------------------------------------------------------


def register_hf_rollout() -> None:
    """Make ``rollout.name=hf`` resolve in verl's replica and adapter registries."""
    from verl.workers.rollout import base as rollout_base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    from sorl_verl.platform.hf_rollout import get_hf_replica_class

    RolloutReplicaRegistry.register(ROLLOUT_NAME, get_hf_replica_class)
    apply_shim(
        rollout_base._ROLLOUT_REGISTRY,
        (ROLLOUT_NAME, "async"),
        lambda _: "sorl_verl.platform.hf_rollout.HFServerAdapter",
        "verl 0.9.1 has no registration call for a rollout's worker-side adapter",
        label="verl.workers.rollout.base._ROLLOUT_REGISTRY[('hf', 'async')]",
    )


def apply_cpu_patches() -> None:
    """Register and shim everything the cpu platform needs (idempotent). Only when it is selected.

    The shims of modules verl has not imported yet are applied right after verl imports them
    (:func:`sorl_verl._import_hooks.call_after_import`), so selecting the platform stays cheap.
    """
    global _applied
    if _applied:
        return
    check_verl_version()
    call_after_import("verl.workers.engine_workers", _shim_process_group)
    call_after_import("verl.workers.engine.fsdp.transformer_impl", _shim_offload_policy)
    call_after_import("verl.utils.model", _shim_valuehead_loader)
    _register_fsdp_engines_for_cpu()
    register_hf_rollout()
    _applied = True
    logger.info("sorl_verl: cpu platform patches applied to verl %s", installed_verl())
