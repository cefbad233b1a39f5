"""turn_gae against a slow reference, through verl's own advantage dispatch, and through the
``sorl_sync`` trainer's advantage step (with an in-memory stand-in for verl's TransferQueue); the
segment trainer's bootstrap value (V after an unfinished segment) the same three ways."""

import numpy as np
import pytest
import torch
import verl.utils.torch_functional as verl_F
from omegaconf import OmegaConf
from verl import DataProto
from verl.trainer.config import AlgoConfig
from verl.trainer.ppo.core_algos import get_adv_estimator_fn
from verl.trainer.ppo.ray_trainer import compute_advantage
from verl.utils import tensordict_utils as tu

from sorl_verl.algos.advantages import compute_turn_gae_advantage_return, provide_critic_values, turn_gae_core


def reference_turn_gae(rewards, values, mask, gamma, lam, bootstrap=None):
    """Row by row, turn by turn, in Python; ``bootstrap[row]``: V after the row's last turn (default 0)."""
    rows, length = mask.shape
    advantages = torch.zeros(rows, length, dtype=torch.float64)
    returns = torch.zeros(rows, length, dtype=torch.float64)
    for row in range(rows):
        on = mask[row].tolist()
        starts = [t for t in range(length) if on[t] and (t == 0 or not on[t - 1])]
        if not starts:
            continue
        turns = []
        for start in starts:
            end = start
            while end + 1 < length and on[end + 1]:
                end += 1
            turns.append(list(range(start, end + 1)))
        # rewards up to the next turn's start belong to the turn; before the first turn -> first turn
        bounds = [0] + starts[1:] + [length]
        turn_rewards = [float(rewards[row, bounds[k] : bounds[k + 1]].sum()) for k in range(len(starts))]
        turn_values = [float(values[row, start]) for start in starts]
        gae = 0.0
        turn_adv = [0.0] * len(starts)
        for k in reversed(range(len(starts))):
            after = float(bootstrap[row]) if bootstrap is not None else 0.0
            next_value = turn_values[k + 1] if k + 1 < len(starts) else after
            delta = turn_rewards[k] + gamma * next_value - turn_values[k]
            gae = delta + gamma * lam * gae
            turn_adv[k] = gae
        for k, turn in enumerate(turns):
            advantages[row, turn] = turn_adv[k]
            returns[row, turn] = turn_adv[k] + turn_values[k]
    return advantages, returns


def random_episode(rows=5, length=20, seed=0):
    generator = torch.Generator().manual_seed(seed)
    mask = torch.rand(rows, length, generator=generator) < 0.6
    mask[2] = False  # no turn at all
    mask[3, 0] = False  # a reward before the first turn
    rewards = torch.zeros(rows, length, dtype=torch.float64)
    rewards[:, -1] = torch.randn(rows, generator=generator, dtype=torch.float64)  # final score, maybe off-mask
    rewards += (
        0.1
        * torch.randn(rows, length, generator=generator, dtype=torch.float64)
        * (torch.rand(rows, length, generator=generator) < 0.2)
    )
    values = torch.randn(rows, length, generator=generator, dtype=torch.float64)
    return rewards, values, mask


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.9, 0.95), (0.5, 0.0)])
def test_core_matches_reference(gamma, lam):
    for seed in range(4):
        rewards, values, mask = random_episode(seed=seed)
        advantages, returns = turn_gae_core(rewards, values, mask, gamma, lam)
        ref_advantages, ref_returns = reference_turn_gae(rewards, values, mask, gamma, lam)
        assert torch.allclose(advantages.double(), ref_advantages, atol=1e-5)
        assert torch.allclose(returns.double(), ref_returns, atol=1e-5)


def test_single_turn_rows_reduce_to_one_step_td():
    mask = torch.tensor([[1, 1, 1, 0, 0]], dtype=torch.bool)
    rewards = torch.tensor([[0.0, 0.0, 0.0, 0.0, 2.0]])  # final score on a padding token
    values = torch.tensor([[0.5, 9.0, 9.0, 9.0, 9.0]])
    advantages, returns = turn_gae_core(rewards, values, mask, gamma=0.9, lam=0.9)
    assert advantages[0].tolist() == pytest.approx([1.5, 1.5, 1.5, 0.0, 0.0])
    assert returns[0].tolist() == pytest.approx([2.0, 2.0, 2.0, 0.0, 0.0])


def test_registered_estimator_whitens_and_needs_values():
    rewards, values, mask = random_episode(seed=7)
    config = AlgoConfig(gamma=0.9, lam=0.95)
    fn = get_adv_estimator_fn("turn_gae")
    assert fn is compute_turn_gae_advantage_return
    advantages, returns = fn(token_level_rewards=rewards, response_mask=mask, config=config, values=values)
    raw, ref_returns = reference_turn_gae(rewards, values, mask, 0.9, 0.95)
    expected = verl_F.masked_whiten(raw, mask.double()) * mask
    assert torch.allclose(advantages.double(), expected, atol=1e-5)
    assert torch.allclose(returns.double(), ref_returns, atol=1e-5)
    with pytest.raises(ValueError, match="trainer.v1.trainer_mode=sorl_sync"):
        fn(token_level_rewards=rewards, response_mask=mask, config=config)
    with pytest.raises(ValueError, match="shape"):
        fn(token_level_rewards=rewards, response_mask=mask, config=config, values=values[:, :-1])


def test_through_verl_compute_advantage_dispatch():
    rewards, values, mask = random_episode(seed=8)
    data = DataProto.from_dict(
        tensors={"token_level_rewards": rewards.float(), "response_mask": mask.long(), "values": values.float()},
        non_tensors={"uid": np.array([f"u{i // 2}" for i in range(mask.shape[0])], dtype=object)},
    )
    config = AlgoConfig(adv_estimator="turn_gae", gamma=0.9, lam=0.95)
    with provide_critic_values(data.batch["values"]):
        out = compute_advantage(data, adv_estimator="turn_gae", gamma=0.9, lam=0.95, config=config)
    expected, expected_returns = compute_turn_gae_advantage_return(
        rewards.float(), mask, config=config, values=values.float()
    )
    assert torch.allclose(out.batch["advantages"], expected)
    assert torch.allclose(out.batch["returns"], expected_returns)
    # Outside the block verl's dispatch has no values to give: a clear error, not a silent fallback.
    with pytest.raises(ValueError, match="critic.enable=True"):
        compute_advantage(data, adv_estimator="turn_gae", config=config)


class FakeTransferQueue:
    """In-memory stand-in for the TransferQueue calls the advantage step makes."""

    def __init__(self, fields):
        self.fields = dict(fields)
        self.put = {}

    def kv_batch_get(self, keys, partition_id, select_fields):
        return tu.get_tensordict({name: self.fields[name] for name in select_fields if name in self.fields})

    def kv_batch_put(self, keys, partition_id, fields):
        self.put.update(dict(fields.items()))
        return BatchMeta(keys)


class BatchMeta:
    def __init__(self, keys, tags=None):
        self.keys = keys
        self.tags = tags if tags is not None else [{} for _ in keys]
        self.partition_id = "train"
        self.extra_info = {}

    def __len__(self):
        return len(self.keys)


def nested(rows):
    return torch.nested.as_nested_tensor(rows, layout=torch.jagged)


def advantage_step(monkeypatch, trainer_name, fields, tags=None):
    """Run a registered trainer's ``_compute_advantage`` alone on ``fields``; the fields it wrote."""
    import transfer_queue
    from verl.trainer.ppo.v1 import get_trainer_cls

    store = FakeTransferQueue(fields)
    monkeypatch.setattr(transfer_queue, "kv_batch_get", store.kv_batch_get)
    monkeypatch.setattr(transfer_queue, "kv_batch_put", store.kv_batch_put)
    trainer_cls = get_trainer_cls(trainer_name)
    trainer = trainer_cls.__new__(trainer_cls)  # only the advantage step is exercised
    trainer.config = OmegaConf.create(
        {
            "algorithm": {"adv_estimator": "turn_gae", "gamma": 0.9, "lam": 0.95, "use_kl_in_reward": False},
            "actor_rollout_ref": {"rollout": {"n": 1}},
        }
    )
    rows = len(fields["response_mask"])
    trainer._compute_advantage(BatchMeta([f"k{i}" for i in range(rows)], tags), metrics={})
    return store.put


def test_sorl_sync_trainer_hands_critic_values_to_turn_gae(monkeypatch):
    from verl.trainer.ppo.v1 import get_trainer_cls

    rewards, values, mask = random_episode(rows=4, length=12, seed=9)
    lengths = [12, 9, 12, 7]  # ragged responses, as the V1 trainer stores them
    fields = {
        "uid": torch.arange(4),
        "response_mask": nested([mask[i, : lengths[i]].long() for i in range(4)]),
        "rm_scores": nested([rewards[i, : lengths[i]].float() for i in range(4)]),
        "values": nested([values[i, : lengths[i]].float() for i in range(4)]),
    }
    put = advantage_step(monkeypatch, "sorl_sync", fields)
    advantages = put["advantages"]
    padded_mask = torch.zeros(4, 12, dtype=torch.bool)
    padded_rewards = torch.zeros(4, 12, dtype=torch.float64)
    padded_values = torch.zeros(4, 12, dtype=torch.float64)
    for i, n in enumerate(lengths):
        padded_mask[i, :n] = mask[i, :n]
        padded_rewards[i, :n] = rewards[i, :n].float().double()
        padded_values[i, :n] = values[i, :n].float().double()
    raw, _ = reference_turn_gae(padded_rewards, padded_values, padded_mask, 0.9, 0.95)
    expected = verl_F.masked_whiten(raw, padded_mask.double()) * padded_mask
    for i, n in enumerate(lengths):
        assert torch.allclose(advantages[i].double(), expected[i, :n], atol=1e-5)

    # Without the hook verl's own sync trainer cannot run turn_gae.
    plain = get_trainer_cls("sync")
    assert issubclass(get_trainer_cls("sorl_sync"), plain)
    with pytest.raises(ValueError, match="sorl_sync"):
        advantage_step(monkeypatch, "sync", fields)


def segment_batch(seed=0, rows=6, width=16):
    """Segments of the segment trainer: ragged rows; an unfinished one (``goes_on``) ends with an
    extra mask-0 token and reward 0, a finished one has its final reward on its last token."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(6, width + 1, (rows,), generator=generator)
    goes_on = torch.tensor([True, False, True, True, False, True])[:rows]
    mask = (torch.rand(rows, width, generator=generator) < 0.7).long()
    rewards = torch.zeros(rows, width, dtype=torch.float64)
    values = torch.randn(rows, width, generator=generator, dtype=torch.float64)
    for row in range(rows):
        n = int(lengths[row])
        mask[row, n:] = 0
        values[row, n:] = 0
        if goes_on[row]:
            mask[row, n - 1] = 0  # the bootstrap position
        else:
            rewards[row, n - 1] = float(torch.randn(1, generator=generator))
    mask[0, : int(lengths[0]) - 1] = 1  # one row is a single long turn
    return rewards, values, mask, lengths, goes_on


def slow_bootstrap(values, lengths, goes_on):
    """V after each row's last turn, row by row: the value at its last token if the episode goes on."""
    return [float(values[row, lengths[row] - 1]) if goes_on[row] else 0.0 for row in range(len(lengths))]


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.9, 0.95), (0.7, 0.0)])
def test_segment_bootstrap_matches_reference(gamma, lam):
    from sorl_verl.algos.segment_trainer import bootstrap_values

    rewards, values, mask, lengths, goes_on = segment_batch(seed=int(gamma * 10 + lam * 100))
    bootstrap = bootstrap_values(values, lengths, goes_on)
    assert bootstrap.tolist() == slow_bootstrap(values, lengths, goes_on)  # only unfinished rows
    advantages, returns = turn_gae_core(rewards, values, mask, gamma, lam, bootstrap)
    expected, expected_returns = reference_turn_gae(
        rewards, values, mask, gamma, lam, slow_bootstrap(values, lengths, goes_on)
    )
    assert torch.allclose(advantages.double(), expected, atol=1e-6)
    assert torch.allclose(returns.double(), expected_returns, atol=1e-6)
    # the bootstrap changes the unfinished rows, and only them
    plain, _ = turn_gae_core(rewards, values, mask, gamma, lam)
    changed = (advantages - plain).abs().sum(dim=1) > 1e-9
    assert torch.equal(changed, goes_on & (bootstrap != 0))
    # a zero bootstrap is exactly the whole-episode estimator
    zero, _ = turn_gae_core(rewards, values, mask, gamma, lam, torch.zeros(len(lengths), dtype=torch.float64))
    assert torch.equal(zero, plain)


def test_registered_estimator_takes_the_bootstrap_with_the_values():
    rewards, values, mask, lengths, goes_on = segment_batch(seed=4)
    bootstrap = torch.tensor(slow_bootstrap(values, lengths, goes_on))
    with provide_critic_values(values.float(), bootstrap.float()):
        advantages, _ = compute_turn_gae_advantage_return(rewards.float(), mask, config={"gamma": 0.9, "lam": 0.95})
    raw, _ = reference_turn_gae(rewards, values.float().double(), mask, 0.9, 0.95, bootstrap.float().tolist())
    expected = verl_F.masked_whiten(raw, mask.double()) * mask
    assert torch.allclose(advantages.double(), expected, atol=1e-5)


def test_sorl_segment_trainer_bootstraps_unfinished_rows(monkeypatch):
    from sorl_verl.agent.segments import STATE_KEY

    rewards, values, mask, lengths, goes_on = segment_batch(seed=7)
    rows = len(lengths)
    fields = {
        "uid": torch.arange(rows),
        "response_mask": nested([mask[i, : lengths[i]] for i in range(rows)]),
        "rm_scores": nested([rewards[i, : lengths[i]].float() for i in range(rows)]),
        "values": nested([values[i, : lengths[i]].float() for i in range(rows)]),
        "extra_fields": [{STATE_KEY: {"done": not bool(goes_on[i])}} for i in range(rows)],
    }
    # the last row is verl's padding (it copies a real row's fields): never bootstrapped
    tags = [{} for _ in range(rows - 1)] + [{"is_padding": True}]
    put = advantage_step(monkeypatch, "sorl_segment", fields, tags)
    expected_goes_on = goes_on.clone()
    expected_goes_on[rows - 1] = False
    after = slow_bootstrap(values.float().double(), lengths, expected_goes_on)
    raw, _ = reference_turn_gae(rewards, values.float().double(), mask, 0.9, 0.95, after)
    expected = verl_F.masked_whiten(raw, mask.double()) * mask
    for i in range(rows):
        assert torch.allclose(put["advantages"][i].double(), expected[i, : lengths[i]], atol=1e-5)
