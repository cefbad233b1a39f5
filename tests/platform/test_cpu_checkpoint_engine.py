"""The ``sorl_cpu`` checkpoint engine hands every receiver the sender's full state dict, once per sync."""

from __future__ import annotations

import asyncio
import os
import tempfile

import pytest
import torch

pytestmark = pytest.mark.slow  # starts a local Ray


@pytest.fixture(scope="module")
def local_ray():
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.pop("RAY_ADDRESS", None)
    ray.init(num_cpus=1, include_dashboard=False, _temp_dir=tempfile.mkdtemp(prefix="sorl_ray_", dir="/tmp"))
    yield ray
    ray.shutdown()


def test_two_syncs_reach_every_receiver(local_ray):
    from verl.checkpoint_engine.base import CheckpointEngineRegistry

    from sorl_verl.platform import cpu_checkpoint_engine as engine_module

    cls = CheckpointEngineRegistry.get(engine_module.BACKEND)
    assert cls is engine_module.RayObjectStoreCheckpointEngine

    async def sync(version: float):
        # 2 actor ranks (rank 1 iterates but does not send), 2 rollout workers
        actor_kwargs, rollout_kwargs = cls.build_topology(2, 2, [{}] * 4)
        actors = [cls(bucket_size=0) for _ in range(2)]
        rollouts = [cls(bucket_size=0) for _ in range(2)]
        for i, engine in enumerate(actors):
            engine.init_process_group(**{k: v[i] for k, v in actor_kwargs.items()})
        for i, engine in enumerate(rollouts):
            engine.init_process_group(**{k: v[i] for k, v in rollout_kwargs.items()})
        weights = {"a.weight": torch.full((2, 3), version), "b.bias": torch.arange(4.0) + version}
        iterated = []

        def generator(rank):
            for name, tensor in weights.items():
                iterated.append(rank)
                yield name, tensor

        async def receive(engine):
            return {name: tensor async for name, tensor in engine.receive_weights()}

        results = await asyncio.gather(
            *[receive(e) for e in rollouts], *[e.send_weights(generator(i)) for i, e in enumerate(actors)]
        )
        for engine in actors + rollouts:
            engine.finalize()
        assert sorted(iterated) == [0, 0, 1, 1]  # every actor rank consumed the weight generator
        return results[:2]

    for version in (1.0, 2.0):  # a fresh channel per sync: the second never sees the first's weights
        received = asyncio.run(sync(version))
        for state in received:
            assert set(state) == {"a.weight", "b.bias"}
            torch.testing.assert_close(state["a.weight"], torch.full((2, 3), version))
            torch.testing.assert_close(state["b.bias"], torch.arange(4.0) + version)


def test_receive_before_topology_is_an_error():
    from sorl_verl.platform.cpu_checkpoint_engine import RayObjectStoreCheckpointEngine

    async def receive():
        return [item async for item in RayObjectStoreCheckpointEngine().receive_weights()]

    with pytest.raises(RuntimeError, match="before init_process_group"):
        asyncio.run(receive())
