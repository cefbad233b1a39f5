"""``sorl_cpu``: a checkpoint engine that hands the actor's weights to separate rollout workers on CPU.

Infrastructure only. verl's ``separate_async`` trainer syncs weights from the actor workers
to standalone rollout replicas through a checkpoint engine and refuses ``naive`` (the
in-process hand-over of colocated rollouts); verl's engines (nccl, nixl, hccl, mooncake, kimi)
all need an accelerator or RDMA. This one goes through Ray's object store:

- ``build_topology`` (driver) opens a fresh *channel* per sync;
- every actor rank runs ``send_weights`` (producing each full tensor is a collective over the
  FSDP group); the first rank ``ray.put``s the full state dict once and posts its reference
  to a small named mailbox actor;
- each rollout worker's ``receive_weights`` waits on the mailbox for that channel and yields
  the tensors to its server adapter (:class:`sorl_verl.platform.hf_rollout.HFServerAdapter`).

verl imports the module named by ``checkpoint_engine.custom_backend_module`` in every process
that builds an engine, which registers the backend there:

    actor_rollout_ref.rollout.checkpoint_engine.backend=sorl_cpu
    actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=sorl_verl.platform.cpu_checkpoint_engine
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator, Generator
from typing import Any

import ray
import torch
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry

__all__ = ["BACKEND", "RayObjectStoreCheckpointEngine", "MAILBOX_NAME"]

BACKEND = "sorl_cpu"
MAILBOX_NAME = "sorl_cpu_checkpoint_mailbox"
SENDER, RECEIVER, IDLE = "sender", "receiver", "idle"


class _Mailbox:
    """Holds one object reference per channel until every receiver has taken it."""

    def __init__(self) -> None:
        self._slots: dict[str, list] = {}
        self._events: dict[str, asyncio.Event] = {}

    def _event(self, channel: str) -> asyncio.Event:
        return self._events.setdefault(channel, asyncio.Event())

    async def put(self, channel: str, refs: list, num_receivers: int) -> None:
        self._slots[channel] = [refs, num_receivers]
        self._event(channel).set()

    async def take(self, channel: str) -> list:
        await self._event(channel).wait()
        slot = self._slots[channel]
        slot[1] -= 1
        if slot[1] <= 0:  # the last receiver: drop our reference so the object can be freed
            del self._slots[channel], self._events[channel]
        return slot[0]


_MAILBOX_HANDLE = None


def _mailbox():
    """The job's mailbox actor, created by the first process that asks.

    The handle is kept for the life of the process: Ray destroys a (non-detached) actor, named
    or not, once no handle to it is left, so a handle held only for one call could take the
    mailbox down between a sender's ``put`` and a receiver's ``take``.
    """
    global _MAILBOX_HANDLE
    if _MAILBOX_HANDLE is None:
        _MAILBOX_HANDLE = (
            ray.remote(_Mailbox)
            .options(name=MAILBOX_NAME, get_if_exists=True, num_cpus=0, max_concurrency=1000)
            .remote()
        )
    return _MAILBOX_HANDLE


@CheckpointEngineRegistry.register(BACKEND)
class RayObjectStoreCheckpointEngine(CheckpointEngine):
    """Full-state-dict hand-over through Ray's object store (CPU, any number of receivers)."""

    def __init__(self, bucket_size: int = 0, **_: Any) -> None:
        self.bucket_size = bucket_size  # unused: the state dict travels as one object
        self.role = IDLE
        self.channel: str | None = None
        self.num_receivers = 0

    def prepare(self) -> dict[str, Any]:
        return {}

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict]):
        channel = uuid.uuid4().hex
        actor = {
            "role": [SENDER] + [IDLE] * (actor_wg_world_size - 1),
            "channel": [channel] * actor_wg_world_size,
            "num_receivers": [rollout_world_size] * actor_wg_world_size,
        }
        rollout = {
            "role": [RECEIVER] * rollout_world_size,
            "channel": [channel] * rollout_world_size,
            "num_receivers": [rollout_world_size] * rollout_world_size,
        }
        return actor, rollout

    def init_process_group(self, role: str, channel: str, num_receivers: int, **_: Any) -> None:
        self.role, self.channel, self.num_receivers = role, channel, num_receivers
        _mailbox()  # every participant holds a handle from now on (see _mailbox)

    def finalize(self) -> None:
        self.role, self.channel = IDLE, None

    async def send_weights(self, weights: Generator[tuple[str, torch.Tensor], None, None], global_steps=None):
        state = {}
        for name, tensor in weights:  # every rank iterates: each full tensor is a collective
            if self.role == SENDER:
                state[name] = tensor.detach().to("cpu", copy=True).contiguous()
        if self.role != SENDER:
            return {}
        if self.channel is None:
            raise RuntimeError("sorl_cpu checkpoint engine: send_weights before init_process_group")
        await _mailbox().put.remote(self.channel, [ray.put(state)], self.num_receivers)
        return {}

    async def receive_weights(self, global_steps=None) -> AsyncGenerator[tuple[str, torch.Tensor], None]:
        if self.channel is None:
            raise RuntimeError("sorl_cpu checkpoint engine: receive_weights before init_process_group")
        refs = await _mailbox().take.remote(self.channel)
        state = await refs[0]
        for name, tensor in state.items():
            yield name, tensor
