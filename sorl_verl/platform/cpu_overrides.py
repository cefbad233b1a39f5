"""The Hydra overrides that make ``python -m verl.trainer.main_ppo`` run on a CPU machine.

Infrastructure only. One place for the e2e tests, the quick start and users:

    python -m verl.trainer.main_ppo $(python -m sorl_verl.platform.cpu_overrides) <your overrides>

Each entry says why it is needed. Later overrides on the command line win, so a caller
can still change any of them (e.g. ``trainer.n_gpus_per_node=2`` with ``num_workers=2``).
"""

from __future__ import annotations

import sys

_FP32 = "{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}"


def cpu_overrides(num_workers: int = 1, fast_start: bool = True) -> list[str]:
    """Hydra overrides for a CPU run with ``num_workers`` FSDP2 ranks (gloo).

    Args:
        num_workers: training ranks (and rollout replicas, one per rank); each is a Ray
            actor on a *logical* GPU slot.
        fast_start: one agent-loop worker, one reward worker, no dataloader workers, one
            TransferQueue storage unit: Ray starts in ~1m45s instead of ~4.5 min on 2 cores.
    """
    overrides = [
        # selects sorl_verl's cpu platform in this process; exported to the Ray workers
        "trainer.device=cpu",
        f"trainer.n_gpus_per_node={num_workers}",
        "trainer.nnodes=1",
        # verl places workers on Ray GPU bundles (RayResourcePool use_gpu=True is hard-coded):
        # give Ray logical GPUs; over-subscribe logical CPUs because TransferQueue and the
        # agent-loop/reward workers each ask for num_cpus=1 and deadlock silently on 2 cores.
        f"++ray_kwargs.ray_init.num_gpus={num_workers}",
        "ray_kwargs.ray_init.num_cpus=32",
        # FSDP1 needs a GPU for sync_module_states; FSDP2 (fully_shard) runs on gloo.
        "actor_rollout_ref.actor.strategy=fsdp2",
        "actor_rollout_ref.actor.fsdp_config.strategy=fsdp2",
        "actor_rollout_ref.ref.strategy=fsdp2",
        "actor_rollout_ref.ref.fsdp_config.strategy=fsdp2",
        "critic.strategy=fsdp2",
        "critic.fsdp.strategy=fsdp2",
        # fp32 compute (FSDP2 mixed precision off; verl's default is bf16 autocast): CPU bf16
        # matmuls are slow, and the HF rollout generates in fp32, so rollout and actor
        # log-probs agree.
        f"++actor_rollout_ref.actor.fsdp_config.mixed_precision={_FP32}",
        f"++actor_rollout_ref.ref.fsdp_config.mixed_precision={_FP32}",
        f"++critic.fsdp.mixed_precision={_FP32}",
        # no flash-attention / fused kernels / torch.compile on CPU
        "actor_rollout_ref.model.use_remove_padding=False",
        "+actor_rollout_ref.model.override_config.attn_implementation=eager",
        "critic.model.use_remove_padding=False",
        "+critic.model.override_config.attn_implementation=eager",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        "critic.model.enable_gradient_checkpointing=False",
        "actor_rollout_ref.actor.use_torch_compile=False",
        "actor_rollout_ref.actor.fsdp_config.use_torch_compile=False",
        "actor_rollout_ref.ref.use_torch_compile=False",
        "actor_rollout_ref.ref.fsdp_config.use_torch_compile=False",
        "critic.fsdp.use_torch_compile=False",
        # the HF-transformers rollout (sorl_verl.platform.hf_rollout), weights handed over
        # in-process after every update (on-policy, like the GPU hybrid engine)
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.mode=async",
        "actor_rollout_ref.rollout.checkpoint_engine.backend=naive",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.dtype=float32",
        "actor_rollout_ref.rollout.free_cache_engine=False",
        "actor_rollout_ref.rollout.enforce_eager=True",
    ]
    if fast_start:
        overrides += [
            "actor_rollout_ref.rollout.agent.num_workers=1",
            "reward.num_workers=1",
            "data.dataloader_num_workers=0",
            "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
        ]
    return overrides


if __name__ == "__main__":
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    print(" ".join(cpu_overrides(workers)))
