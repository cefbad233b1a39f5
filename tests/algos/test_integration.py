"""The losses and the estimator as verl sees them: registration in a fresh process through the
entry point, verl's own ``ppo_loss`` wrapper with an ``ActorConfig`` composed from verl's own
Hydra config and our overrides, and SO-GRPO (``so_ppo`` + verl's ``grpo`` advantages)."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import verl
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from tensordict import TensorDict
from verl import DataProto
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo.core_algos import get_policy_loss_fn
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.utils import tensordict_utils as tu
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.utils.losses import ppo_loss

from sorl_verl.algos.config import SorlPolicyLossConfig
from sorl_verl.algos.correction import batch_correction
from sorl_verl.algos.losses import compute_policy_loss_st_ppo
from sorl_verl.recipes import METRIC_PREFIX

REPO = Path(__file__).resolve().parents[2]


def venv_python() -> str:
    candidate = REPO / ".venv" / "bin" / "python"
    return str(candidate) if candidate.exists() else sys.executable


def test_import_verl_alone_registers_everything_in_a_fresh_process():
    script = textwrap.dedent(
        """
        import sys
        import verl  # nothing else: the verl.plugins entry point must do the rest
        from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_policy_loss_fn

        failures = []
        for name in ("turn_ppo", "s_ppo", "st_ppo", "so_ppo"):
            try:
                fn = get_policy_loss_fn(name)
                if fn.__module__ != "sorl_verl.algos.losses":
                    failures.append(f"{name} -> {fn.__module__}")
            except ValueError as error:
                failures.append(f"{name}: {error}")
        try:
            estimator = get_adv_estimator_fn("turn_gae")
            if estimator.__name__ != "compute_turn_gae_advantage_return":
                failures.append(f"turn_gae -> {estimator}")
        except ValueError as error:
            failures.append(f"turn_gae: {error}")
        from verl.trainer.ppo.v1 import get_trainer_cls

        if get_trainer_cls("sorl_sync").__module__ != "sorl_verl.algos.trainer":
            failures.append("sorl_sync")
        if failures:
            import sorl_verl.plugin  # verl swallows plugin errors: surface the real one
            print("FAILED", failures)
            sys.exit(1)
        print("OK")
        """
    )
    env = {**os.environ, "VERL_USE_EXTERNAL_PLUGINS": "auto"}
    result = subprocess.run(
        [venv_python(), "-c", script], capture_output=True, text=True, timeout=300, cwd="/", env=env
    )
    assert result.returncode == 0 and result.stdout.strip().endswith("OK"), result.stdout + result.stderr


def compose_actor_config(*overrides):
    config_dir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        config = compose(
            config_name="ppo_trainer",
            overrides=[
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                "actor_rollout_ref.rollout.n=2",
                *overrides,
            ],
        )
    OmegaConf.resolve(config)
    return omega_conf_to_dataclass(config.actor_rollout_ref.actor)


def ppo_loss_inputs(rows=4, prompt_len=3, response_len=10, seed=0, advantages=None):
    """What verl's engine hands ppo_loss: full-sequence log-probs and a padded TensorDict."""
    generator = torch.Generator().manual_seed(seed)
    mask = torch.rand(rows, response_len, generator=generator) < 0.7
    mask[:, 0] = True
    old = -torch.rand(rows, response_len, generator=generator)
    new = (old + 0.5 * torch.randn(rows, response_len, generator=generator)).requires_grad_(True)
    if advantages is None:
        advantages = torch.randn(rows, response_len, generator=generator)
    full = torch.zeros(rows, prompt_len + response_len)
    full = torch.cat([full[:, : prompt_len - 1], new, full[:, prompt_len - 1 + response_len :]], dim=1)
    data = TensorDict(
        {
            "prompts": torch.ones(rows, prompt_len, dtype=torch.long),
            "responses": torch.ones(rows, response_len, dtype=torch.long),
            "attention_mask": torch.ones(rows, prompt_len + response_len, dtype=torch.long),
            "response_mask": mask.long(),
            "old_log_probs": old,
            "advantages": advantages,
        },
        batch_size=[rows],
    )
    tu.assign_non_tensor(data, dp_size=1, batch_num_tokens=int(mask.sum()), global_batch_size=rows)
    return {"log_probs": full.reshape(-1)}, data, (old, new, advantages, mask)


def test_ppo_loss_wrapper_with_composed_actor_config_and_our_policy_loss_class():
    actor = compose_actor_config(
        "actor_rollout_ref.actor.policy_loss._target_=sorl_verl.algos.config.SorlPolicyLossConfig",
        "actor_rollout_ref.actor.policy_loss.loss_mode=st_ppo",
        "+actor_rollout_ref.actor.policy_loss.normalization=absolute",
        "+actor_rollout_ref.actor.policy_loss.kappa=0.004",
        "+actor_rollout_ref.actor.policy_loss.norm_scope=sequence",
    )
    assert isinstance(actor.policy_loss, SorlPolicyLossConfig)
    assert actor.policy_loss.normalization == "absolute" and actor.policy_loss.kappa == 0.004
    model_output, data, (old, new, advantages, mask) = ppo_loss_inputs()
    loss, metrics = ppo_loss(actor, model_output, data)
    loss.backward()
    assert metrics["actor/sorl/norm_scale"].aggregate() < 1.0  # absolute mode with a small kappa bites
    assert "actor/pg_loss" in metrics

    direct_new = new.detach().clone().requires_grad_(True)
    direct_loss, direct_metrics = compute_policy_loss_st_ppo(
        old_log_prob=old,
        log_prob=direct_new,
        advantages=advantages,
        response_mask=mask,
        loss_agg_mode=actor.loss_agg_mode,
        config=actor,
        rollout_is_weights=None,
    )
    direct_loss.backward()
    assert torch.isclose(loss, direct_loss)
    assert torch.allclose(new.grad, direct_new.grad)
    assert metrics["actor/sorl/norm_scale"].aggregate() == pytest.approx(direct_metrics["actor/sorl/norm_scale"])


@pytest.mark.parametrize("loss_mode", ["turn_ppo", "s_ppo", "st_ppo", "so_ppo"])
def test_ppo_loss_wrapper_with_verl_default_policy_loss_config(loss_mode):
    """No ``_target_`` override: verl builds its own PolicyLossConfig; each name runs with its defaults."""
    actor = compose_actor_config(f"actor_rollout_ref.actor.policy_loss.loss_mode={loss_mode}")
    assert type(actor.policy_loss).__name__ == "PolicyLossConfig"
    model_output, data, (_, new, _, _) = ppo_loss_inputs(seed=1)
    optimizer = torch.optim.SGD([new], lr=0.0)
    with batch_correction(optimizer) as corr:
        loss, metrics = ppo_loss(actor, model_output, data)
        loss.backward()
        optimizer.step()
    assert torch.isfinite(loss) and new.grad.abs().sum() > 0
    normalized = loss_mode != "turn_ppo"
    assert (corr.metrics()["actor/sorl/norm_scale"].aggregate() < 1.0) == normalized
    if normalized:  # outside an engine step the batch scope refuses to run
        with pytest.raises(RuntimeError, match="norm_scope=batch"):
            ppo_loss(actor, *ppo_loss_inputs(seed=1)[:2])


def test_a_token_level_loss_logs_no_sorl_metric_and_so_ppo_logs_its_turn_clipping():
    """What leaves a token-level method's turn-clip cell of the stability table empty: verl's own
    loss logs nothing under ``actor/sorl/``, where SO-GRPO's loss logs the turn clip fraction."""
    model_output, data, _ = ppo_loss_inputs(seed=2)
    _, metrics = ppo_loss(
        compose_actor_config("actor_rollout_ref.actor.policy_loss.loss_mode=vanilla"), model_output, data
    )
    assert "actor/pg_loss" in metrics and not [key for key in metrics if key.startswith(METRIC_PREFIX)]

    model_output, data, (_, new, _, _) = ppo_loss_inputs(seed=2)
    with batch_correction(torch.optim.SGD([new], lr=0.0)):
        _, metrics = ppo_loss(
            compose_actor_config("actor_rollout_ref.actor.policy_loss.loss_mode=so_ppo"), model_output, data
        )
    assert 0.0 <= metrics[METRIC_PREFIX + "clipfrac_turn"].aggregate() <= 1.0


def test_so_grpo_is_so_ppo_on_verl_grpo_advantages():
    rows, response_len = 6, 10
    generator = torch.Generator().manual_seed(2)
    mask = torch.rand(rows, response_len, generator=generator) < 0.7
    mask[:, 0] = True
    scores = torch.zeros(rows, response_len)
    last = torch.arange(response_len)[None, :].expand(rows, -1).masked_fill(~mask, -1).max(dim=1).values
    scores[torch.arange(rows), last] = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    data = DataProto.from_dict(
        tensors={"token_level_rewards": scores, "response_mask": mask.long()},
        non_tensors={"uid": np.array(["a", "a", "a", "b", "b", "b"], dtype=object)},
    )
    data = compute_advantage(data, adv_estimator="grpo", config=AlgoConfig(adv_estimator="grpo"))
    advantages = data.batch["advantages"]
    assert torch.all((advantages != 0).any(dim=1))  # both groups have signal

    actor = compose_actor_config("actor_rollout_ref.actor.policy_loss.loss_mode=so_ppo")
    model_output, td, (old, new, _, _) = ppo_loss_inputs(rows=rows, advantages=advantages, seed=3)
    td["response_mask"] = mask.long()
    tu.assign_non_tensor(td, batch_num_tokens=int(mask.sum()))
    with batch_correction():
        loss, metrics = ppo_loss(actor, model_output, td)
        loss.backward()
    st_ppo_new = new.detach().clone().requires_grad_(True)
    with batch_correction():
        st_loss, _ = get_policy_loss_fn("st_ppo")(
            old_log_prob=old,
            log_prob=st_ppo_new,
            advantages=advantages,
            response_mask=mask,
            loss_agg_mode=actor.loss_agg_mode,
            config=actor,
            rollout_is_weights=None,
        )
        st_loss.backward()
    assert torch.isfinite(loss) and torch.isclose(loss, st_loss)
    assert torch.allclose(new.grad, st_ppo_new.grad) and new.grad.abs().sum() > 0
