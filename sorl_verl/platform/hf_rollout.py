"""The ``hf`` rollout: verl's rollout-server contract served by HF transformers on CPU.

Infrastructure only. verl 0.9 generates through rollout *replicas* (server actors the agent
loops call token-in/token-out) and a :class:`~verl.workers.rollout.base.BaseRollout`
adapter inside each actor worker that receives the new weights after every update
(``checkpoint_engine.backend=naive``: the hybrid engine's in-process hand-over). verl's
own ``HFRollout`` cannot be instantiated in 0.9.1 and is not a server, so we provide:

- :class:`HFRolloutServer` (a Ray actor): holds an HF copy of the policy, batches the
  concurrent ``generate`` calls of the agent loops (``hf_generate.generate_batch``), and
  swaps in the actor's weights on ``update_weights``. It also speaks the partial-rollout
  protocol of verl's asynchronous trainers (``colocate_async``, ``separate_async``), as
  verl's vLLM server does: ``abort_all_requests`` stops the running batch at the next
  decoding step and returns each unfinished request's partial output with
  ``stop_reason="aborted"``, then keeps the submission gate closed: requests arriving
  while paused wait for ``resume_generation`` (or, with ``reject_request=True``, are
  answered ``aborted`` at once so the client re-routes them). verl's
  ``FullyAsyncLLMServerClient`` resends prompt + partial tokens, so a trajectory is
  continued under the weights installed while paused. Every output carries the weight
  version (``global_steps``) that generated it; a batch never spans a weight update
  (weights change only under the model lock, between batches);
- :class:`HFReplica`: the :class:`RolloutReplica` that launches one server per replica;
- :class:`HFServerAdapter`: the worker-side adapter; all FSDP ranks consume the weight
  generator (it runs collectives), the replica's leader rank ships the full state dict.

Registered as rollout name ``hf`` (``actor_rollout_ref.rollout.name=hf``) when the cpu
platform is selected.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from typing import Any

import ray
import torch

from sorl_verl.platform.hf_generate import GenerationRequest, generate_batch

logger = logging.getLogger("sorl_verl.platform")

SERVER_NAME_PREFIX = "sorl_hf_server_"
ROLLOUT_ENGINE_KEY = "hf"  # rollout.engine_kwargs.hf
# Requests arriving within this window are generated as one batch.
BATCH_WINDOW_S = 0.02


def server_actor_name(replica_rank: int, name_suffix: str = "") -> str:
    return f"{SERVER_NAME_PREFIX}{replica_rank}{name_suffix}"


def _to_plain(config: Any) -> Any:
    from verl.utils.config import omega_conf_to_dataclass

    return omega_conf_to_dataclass(config) if not hasattr(config, "__dataclass_fields__") else config


class HFRolloutServer:
    """Token-in/token-out generation with an HF model; the methods verl calls on a server."""

    def __init__(self, config: Any, model_config: Any, replica_rank: int = 0):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.config = _to_plain(config)
        self.model_config = model_config
        self.replica_rank = replica_rank
        path = getattr(model_config, "local_path", None) or model_config.path
        tokenizer_path = getattr(model_config, "local_tokenizer_path", None) or path
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_path, trust_remote_code=model_config.trust_remote_code)
        # float32 + eager attention: what the CPU actor computes with, so log-probs agree.
        self.model = AutoModelForCausalLM.from_pretrained(
            path,
            torch_dtype=torch.float32,
            attn_implementation="eager",
            trust_remote_code=model_config.trust_remote_code,
        )
        self.model.eval()
        eos = self.model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        if self.tokenizer.eos_token_id is not None and self.tokenizer.eos_token_id not in eos:
            eos.append(self.tokenizer.eos_token_id)
        self.eos_token_ids = eos
        self.pad_token_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos[0]
        # engine_kwargs.hf: min_step_s (see hf_generate.generate_batch); nothing else is accepted
        hf_kwargs = dict((getattr(self.config, "engine_kwargs", None) or {}).get(ROLLOUT_ENGINE_KEY) or {})
        unknown = sorted(set(hf_kwargs) - {"min_step_s"})
        if unknown:
            raise ValueError(f"hf rollout: unknown rollout.engine_kwargs.hf options {unknown} (known: min_step_s)")
        self.min_step_s = float(hf_kwargs.get("min_step_s", 0.0))
        self.global_steps: int | None = None
        self.generator = torch.Generator().manual_seed(int(getattr(self.config, "seed", 0)) + replica_rank)
        self._pending: list[tuple[GenerationRequest, asyncio.Future]] = []
        self._batcher: asyncio.Task | None = None
        self._model_lock: asyncio.Lock | None = None
        self.num_updates = 0
        # partial-rollout protocol: abort flag seen by the decoding thread, submission gate
        self._abort = threading.Event()
        self._paused = False
        self._rejecting = False
        self._resume_event: asyncio.Event | None = None
        self._in_flight: set[str] = set()
        self.asleep = False
        # what happened, for tests and logs
        self.counters = {
            "aborts": 0,
            "aborted_requests": 0,
            "parked_requests": 0,
            "rejected_requests": 0,
            "sleeps": 0,
            "wake_ups": 0,
        }

    def _async_state(self) -> tuple[asyncio.Lock, asyncio.Event]:
        # created lazily: they must belong to the actor's event loop
        if self._model_lock is None:
            self._model_lock = asyncio.Lock()
        if self._resume_event is None:
            self._resume_event = asyncio.Event()
            self._resume_event.set()
        return self._model_lock, self._resume_event

    # -- generation -------------------------------------------------------------------
    def _default_max_tokens(self, prompt_len: int) -> int:
        return min(self.config.response_length, self.config.prompt_length + self.config.response_length - prompt_len)

    def _max_model_len(self) -> int:
        return self.config.max_model_len or (self.config.prompt_length + self.config.response_length)

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,
    ):
        from verl.workers.rollout.replica import TokenOutput

        if image_data is not None or video_data is not None:
            raise NotImplementedError("hf rollout: text only (no image/video inputs)")
        prompt_ids = [int(t) for t in prompt_ids]
        room = self._max_model_len() - len(prompt_ids)
        if room < 1:
            raise ValueError(
                f"hf rollout: prompt length {len(prompt_ids)} leaves no room within max_model_len {self._max_model_len()}"
            )
        request = GenerationRequest.from_sampling_params(
            prompt_ids, sampling_params, default_max_tokens=self._default_max_tokens(len(prompt_ids))
        )
        request.max_tokens = max(1, min(request.max_tokens, room))
        _, resume_event = self._async_state()
        while self._paused:  # the gate is closed between an abort and resume_generation
            if self._rejecting:
                self.counters["rejected_requests"] += 1
                return self._aborted_output(request)
            self.counters["parked_requests"] += 1
            await resume_event.wait()
        self._in_flight.add(request_id)
        try:
            result, version = await self._submit(request)
        finally:
            self._in_flight.discard(request_id)
        return TokenOutput(
            token_ids=result.token_ids,
            log_probs=result.log_probs,
            stop_reason="aborted" if result.finish_reason == "abort" else "completed",
            extra_fields={"global_steps": version, "finish_reason": result.finish_reason},
        )

    def _aborted_output(self, request: GenerationRequest):
        from verl.workers.rollout.replica import TokenOutput

        return TokenOutput(
            token_ids=[],
            log_probs=[] if request.logprobs else None,
            stop_reason="aborted",
            extra_fields={"global_steps": self.global_steps, "finish_reason": "abort"},
        )

    async def _submit(self, request: GenerationRequest):
        """Queue one request for the next batch; returns ``(result, weight version)``."""
        self._async_state()
        future = asyncio.get_running_loop().create_future()
        self._pending.append((request, future))
        if self._batcher is None or self._batcher.done():
            self._batcher = asyncio.create_task(self._run_batches())
        return await future

    async def _run_batches(self):
        while self._pending:
            await asyncio.sleep(BATCH_WINDOW_S)  # let concurrent agent-loop calls join this batch
            # at most rollout.max_num_seqs sequences per batch (as vLLM), first come first served
            limit = int(getattr(self.config, "max_num_seqs", 0) or 0) or len(self._pending)
            batch, self._pending = self._pending[:limit], self._pending[limit:]
            try:
                async with self._model_lock:
                    version = self.global_steps  # weights cannot change while the lock is held
                    results = await asyncio.to_thread(
                        generate_batch,
                        self.model,
                        self.tokenizer,
                        [request for request, _ in batch],
                        self.eos_token_ids,
                        self.pad_token_id,
                        self.generator,
                        self._abort,
                        self.min_step_s,
                    )
            except Exception as error:  # noqa: BLE001 - delivered to every waiting caller
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)
                continue
            for (_, future), result in zip(batch, results, strict=True):
                if not future.done():
                    future.set_result((result, version))

    # -- weights ----------------------------------------------------------------------
    async def update_weights(self, state_dict: dict[str, torch.Tensor], global_steps: int | None = None) -> int:
        """Copy the actor's full (HF-named) parameters into the generation model.

        Returns the number of tensors copied. Unknown names are an error: silently keeping
        stale weights would make rollouts off-policy without anyone noticing.
        """
        model_lock, _ = self._async_state()
        async with model_lock:
            # keep_vars: live parameters, tied aliases (lm_head.weight) included by name
            own = self.model.state_dict(keep_vars=True)
            unknown = sorted(set(state_dict) - set(own))
            if unknown:
                raise KeyError(f"hf rollout: actor sent weights the rollout model does not have: {unknown[:5]}")
            with torch.no_grad():
                for name, tensor in state_dict.items():
                    own[name].copy_(tensor.to(own[name].dtype))
            self.model.tie_weights()
            self.global_steps = global_steps
            self.num_updates += 1
        return len(state_dict)

    async def get_state_dict(self) -> dict[str, torch.Tensor]:
        """The current generation weights (for tests: on-policy checks)."""
        return {k: v.detach().clone() for k, v in self.model.state_dict().items()}

    async def get_num_updates(self) -> int:
        return self.num_updates

    async def set_global_steps(self, global_steps: int):
        self.global_steps = global_steps

    async def get_counters(self) -> dict[str, int]:
        return dict(self.counters)

    # -- lifecycle calls verl makes on every server ------------------------------------
    async def _drain(self) -> None:
        """Wait until the running batch (if any) has returned."""
        model_lock, _ = self._async_state()
        async with model_lock:
            pass

    async def wake_up(self, tags: list[str] | None = None):
        # nothing was freed on CPU (weights and cache stay in host memory)
        self.asleep = False
        self.counters["wake_ups"] += 1

    async def sleep(self):
        """Drain, like verl's vLLM replica before it frees memory; nothing to free on CPU."""
        await self._drain()
        self.asleep = True
        self.counters["sleeps"] += 1

    async def clear_kv_cache(self):
        return None  # the KV cache lives only for one batch

    async def release_kv_cache(self):
        return None

    async def resume_kv_cache(self):
        return None

    async def abort_all_requests(self, reject_request: bool = False, **kwargs) -> dict[str, Any]:
        """Stop generation: running requests return their partial output (``aborted``).

        Closes the submission gate first, so no request starts between the abort and the
        next :meth:`resume_generation`; with ``reject_request`` the requests arriving while
        the gate is closed are answered ``aborted`` instead of waiting (the server is leaving
        the load balancer). Returns when the running batch has stopped, so a weight update
        that follows never races a generation.
        """
        _, resume_event = self._async_state()
        self._paused = True
        self._rejecting = bool(reject_request)
        resume_event.clear()
        request_ids = sorted(self._in_flight)
        self._abort.set()
        await self._drain()
        self.counters["aborts"] += 1
        self.counters["aborted_requests"] += len(request_ids)
        return {"aborted_count": len(request_ids), "request_ids": request_ids}

    async def resume_generation(self):
        """Open the gate again: parked requests (and resent partial rollouts) generate."""
        _, resume_event = self._async_state()
        self._abort.clear()
        self._paused = False
        self._rejecting = False
        resume_event.set()

    async def start_profile(self, **kwargs):
        return None

    async def stop_profile(self):
        return None


def _replica_base():
    from verl.workers.rollout.replica import RolloutReplica

    return RolloutReplica


class _LazyReplica:
    """Built on first use so that importing this module does not import verl's rollout stack."""

    cls = None


def get_hf_replica_class():
    """The :class:`RolloutReplica` subclass for ``rollout.name=hf`` (created once)."""
    if _LazyReplica.cls is not None:
        return _LazyReplica.cls

    class HFReplica(_replica_base()):
        """One :class:`HFRolloutServer` per replica, on the node of the replica's first worker."""

        def get_ray_class_with_init_args(self):
            # colocated/standalone rollout workers build their HFServerAdapter from these
            # arguments: it must look the server up under the same (suffixed) name
            ray_cls = super().get_ray_class_with_init_args()
            ray_cls.kwargs["name_suffix"] = self.name_suffix
            return ray_cls

        async def launch_servers(self):
            name = server_actor_name(self.replica_rank, self.name_suffix)
            server_cls = ray.remote(HFRolloutServer)
            self._server_handle = server_cls.options(
                name=name,
                num_cpus=0,  # generation shares the cores with the trainer; nothing to reserve
                max_concurrency=self.max_concurrency,
            ).remote(config=self.config, model_config=self.model_config, replica_rank=self.replica_rank)
            self.servers = [self._server_handle]
            # The load balancer keys servers by address; there is no HTTP endpoint.
            self._server_address = f"hf://{name}"
            await self._server_handle.set_global_steps.remote(None)

        def rollout_worker_use_gpu(self) -> bool:
            return False

    _LazyReplica.cls = HFReplica
    return HFReplica


def _base_rollout():
    from verl.workers.rollout.base import BaseRollout

    return BaseRollout


class HFServerAdapter(_base_rollout()):
    """In each actor worker: forwards the weights verl's checkpoint engine hands over."""

    def __init__(
        self, config, model_config, device_mesh, *args, replica_rank: int = -1, name_suffix: str = "", **kwargs
    ):
        super().__init__(config, model_config, device_mesh)
        # the replica's suffix as it used it (already "_x"), see HFReplica.get_ray_class_with_init_args
        self.name_suffix = name_suffix
        rank = int(os.environ.get("RANK", 0))
        rollout_world_size = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        self.replica_rank = rank // rollout_world_size if replica_rank == -1 else replica_rank
        self.is_leader_rank = rank % rollout_world_size == 0
        self.sleep_level = 2
        self._server = None

    def _server_handle(self):
        if self._server is None:
            self._server = ray.get_actor(server_actor_name(self.replica_rank, self.name_suffix))
        return self._server

    async def update_weights(self, weights, wire_format: str = "named_tensors", global_steps=None, **kwargs):
        if wire_format != "named_tensors":
            raise NotImplementedError(f"hf rollout: weight wire format {wire_format!r} (use checkpoint_engine naive)")
        if kwargs.get("peft_config") is not None:
            raise NotImplementedError("hf rollout: LoRA adapters are not supported; merge them (lora.merge=True)")
        # Every rank iterates: producing each full tensor is a collective over the FSDP group.
        # A checkpoint engine's receive_weights may be an async generator (sorl_cpu, nccl).
        state = {}
        if hasattr(weights, "__aiter__"):
            async for name, tensor in weights:
                if self.is_leader_rank:
                    state[name] = tensor.detach().to("cpu", copy=True).contiguous()
        else:
            for name, tensor in weights:
                if self.is_leader_rank:
                    state[name] = tensor.detach().to("cpu", copy=True).contiguous()
        if self.is_leader_rank:
            await self._server_handle().update_weights.remote(state, global_steps)

    async def resume(self, tags: list[str]):
        if self.is_leader_rank:
            await self._server_handle().wake_up.remote(tags)

    async def release(self):
        if self.is_leader_rank:
            await self._server_handle().sleep.remote()
