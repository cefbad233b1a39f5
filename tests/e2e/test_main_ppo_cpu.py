"""verl's real ``main_ppo`` on CPU: 2 synchronous steps, search_r1 loop, hf rollout, tiny model.

The run checks: both steps logged; the SORL diagnostics (``actor/sorl/...``) in the logged
metrics; the saved actor weights differ from the initial ones; rollout log-probs agree with
the actor's (on-policy weight hand-over); and the response mask marks exactly the tokens the
rollout server generated (observations and prompts 0).
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

pytestmark = pytest.mark.e2e


def expected_mask(record: dict) -> list[int]:
    """1 where the response token was produced by one of the trajectory's generate calls."""
    prompt, response = record["prompt_ids"], record["response_ids"]
    full = prompt + response
    mask = [0] * len(response)
    for call in record["calls"]:
        sent = call["prompt_ids"]
        assert full[: len(sent)] == sent, "a generate call's prompt is not a prefix of the trajectory"
        offset = len(sent) - len(prompt)
        # the loop may drop trailing tokens of a turn (e.g. a stray EOS before an observation)
        for j, token in enumerate(call["token_ids"]):
            if offset + j >= len(response) or response[offset + j] != token:
                break
            mask[offset + j] = 1
    return mask


def check_run(result, loss_mode: str):
    assert result.returncode == 0, result.log[-6000:]
    steps = result.step_metrics()
    assert sorted(steps)[-2:] == [1, 2], f"steps logged: {sorted(steps)}"
    for step in (1, 2):
        data = steps[step]
        sorl = [key for key in data if key.startswith("actor/sorl/")]
        if loss_mode != "vanilla":
            assert sorl, f"no actor/sorl/ metrics at step {step}: {sorted(data)[:40]}"
        # rollout log-probs come from the weights the actor just trained (on-policy hand-over)
        assert data["training/rollout_probs_diff_max"] < 1e-3, data["training/rollout_probs_diff_max"]

    # weights changed: the saved HF weights after step 2 differ from the initial model
    saved = sorted(result.out_dir.glob("ckpt/global_step_2/actor/huggingface/*.safetensors"))
    assert saved, [str(p) for p in result.out_dir.glob("ckpt/**/*")][:20]
    return saved


def assert_weights_changed(saved_files, initial_model_dir):
    initial = load_file(str(initial_model_dir / "model.safetensors"))
    after = {}
    for path in saved_files:
        after.update(load_file(str(path)))
    common = sorted(set(initial) & set(after))
    assert common, (sorted(initial)[:5], sorted(after)[:5])
    changed = [name for name in common if not torch.allclose(initial[name].float(), after[name].float())]
    assert len(changed) >= len(common) // 2, f"only {len(changed)}/{len(common)} tensors changed"


def assert_masks_exact(probes):
    assert probes, "the mask probe recorded no trajectory"
    multi_turn = 0
    for record in probes:
        assert len(record["response_mask"]) == len(record["response_ids"])
        assert record["response_mask"] == expected_mask(record)
        multi_turn += len(record["calls"]) > 1
    # observations (search results or the invalid-action message) were interleaved somewhere
    assert multi_turn > 0
    assert any(0 in record["response_mask"] for record in probes)


# The KL loss brings up the reference model (FSDP2 offload on CPU).
KL_LOSS = ["actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.01"]


def test_sorl_sync_st_ppo_turn_gae_critic_and_kl_two_steps(e2e_assets, main_ppo, tmp_path):
    """One run through every part of verl's synchronous path that SORL touches: the ``sorl_sync``
    trainer handing the critic's values to ``turn_gae``, a critic (value head on CPU), the reference
    model for the KL loss, and the ST-PPO loss (turn ratios and the clipping-bias correction) in
    verl's actor worker.

    The other losses run through verl's own ``ppo_loss`` in-process
    (tests/algos/test_integration.py, every loss mode) and, in the worker, through the asynchronous
    runs (``so_ppo``: tests/e2e/test_async_cpu.py and test_math_async_cpu.py); the plugin registers
    every loss in every worker whichever one is selected (tests/agent/test_registration.py).
    """
    result = main_ppo(
        e2e_assets,
        tmp_path / "run_sorl_sync",
        [
            "actor_rollout_ref.actor.policy_loss.loss_mode=st_ppo",
            "algorithm.adv_estimator=turn_gae",
            "critic.enable=True",
            "trainer.v1.trainer_mode=sorl_sync",
            f"critic.model.path={e2e_assets[1]}",
            *KL_LOSS,
        ],
    )
    saved = check_run(result, "st_ppo")
    assert_weights_changed(saved, e2e_assets[1])
    assert_masks_exact(result.probes)
    for step in (1, 2):
        data = result.step_metrics()[step]
        assert "critic/vf_loss" in data and data["critic/vf_loss"] > 0, sorted(k for k in data if "critic" in k)
        assert "actor/kl_loss" in data, sorted(k for k in data if k.startswith("actor/"))
        # the turn-level ratio of ST-PPO, not only the token-level diagnostics, reached the logger
        assert "actor/sorl/turn_ratio_max" in data, sorted(k for k in data if k.startswith("actor/sorl/"))
