"""Segment mode's settings, placement and bootstrap: bad input refused by name, seeded staggered
starts, and turn_gae with the bootstrap value against a slow per-row reference, directly and
through the ``sorl_segment`` trainer's advantage step (in-memory stand-in for TransferQueue)."""

import numpy as np
import pytest
import torch
import verl.utils.torch_functional as verl_F
from omegaconf import OmegaConf

from sorl_verl.agent.segments import (
    STATE_KEY,
    SegmentConfig,
    batch_from_rows,
    rows_from_batch,
    segment_overrides,
    start_fractions,
    warmup_turns,
)
from sorl_verl.algos.advantages import compute_turn_gae_advantage_return, provide_critic_values, turn_gae_core
from sorl_verl.algos.segment_trainer import bootstrap_values


def trainer_config(**changes):
    config = OmegaConf.create(
        {
            "data": {"train_batch_size": 4, "seed": 11},
            "algorithm": {"adv_estimator": "turn_gae", "filter_groups": {"enable": False}},
            "actor_rollout_ref": {"rollout": {"n": 1}},
            "trainer": {"v1": {"segment": {"turns": 2, "resets": "staggered"}, "sampler": {}}},
        }
    )
    for key, value in changes.items():
        OmegaConf.update(config, key, value, force_add=True)
    return config


def test_settings_and_defaults():
    config = SegmentConfig.from_trainer_config(trainer_config())
    assert config == SegmentConfig(turns=2, resets="staggered", pool_size=4, seed=11)
    assert SegmentConfig.from_trainer_config(trainer_config(**{"trainer.v1.segment.pool_size": 8})).pool_size == 8
    # the overrides a sweep passes select the same settings
    overrides = segment_overrides(3, "sync", pool_size=8)
    assert overrides == [
        "trainer.v1.trainer_mode=sorl_segment",
        "+trainer.v1.segment.turns=3",
        "+trainer.v1.segment.resets=sync",
        "+trainer.v1.segment.pool_size=8",
    ]


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"trainer.v1.segment.turns": 0}, r"trainer\.v1\.segment\.turns"),
        ({"trainer.v1.segment.turns": 1.5}, r"trainer\.v1\.segment\.turns"),
        ({"trainer.v1.segment.resets": "random"}, r"trainer\.v1\.segment\.resets"),
        ({"trainer.v1.segment.pool_size": 3}, r"pool_size=3 is smaller than data\.train_batch_size=4"),
        ({"algorithm.adv_estimator": "grpo"}, r"adv_estimator=grpo: it is critic-free and needs whole episodes"),
        ({"algorithm.adv_estimator": "gae"}, r"adv_estimator=gae: verl's token-level gae"),
        ({"actor_rollout_ref.rollout.n": 2}, r"rollout\.n=1"),
        ({"algorithm.filter_groups.enable": True}, r"filter_groups\.enable"),
    ],
)
def test_bad_settings_are_refused_by_name(changes, named):
    with pytest.raises(ValueError, match=named):
        SegmentConfig.from_trainer_config(trainer_config(**changes))


def test_staggered_starts_are_seeded_and_cover_the_horizon():
    first = start_fractions(12, "staggered", np.random.default_rng(5))
    again = start_fractions(12, "staggered", np.random.default_rng(5))
    other = start_fractions(12, "staggered", np.random.default_rng(6))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    # stratified: exactly one start per twelfth of the horizon
    assert sorted(np.floor(first * 12).astype(int).tolist()) == list(range(12))
    warmups = [warmup_turns(f, 4) for f in first]
    assert sorted(set(warmups)) == [0, 1, 2, 3] and all(warmups.count(k) == 3 for k in range(4))
    assert start_fractions(5, "sync", np.random.default_rng(5)).tolist() == [0.0] * 5
    assert warmup_turns(0.999, 3) == 2 and warmup_turns(0.0, 3) == 0


def test_rows_round_trip_through_a_batch():
    rows = [
        {"raw_prompt": [{"role": "user", "content": "q0"}], "index": 0, "dummy_tensor": torch.tensor([0])},
        {"raw_prompt": [{"role": "user", "content": "q1"}], "index": 1, "dummy_tensor": torch.tensor([0])},
    ]
    back = rows_from_batch(batch_from_rows(rows))
    assert [r["raw_prompt"] for r in back] == [r["raw_prompt"] for r in rows]
    assert [r["index"] for r in back] == [0, 1]
    assert all(torch.equal(r["dummy_tensor"], torch.tensor([0])) for r in back)


def reference_segment_gae(rewards, values, mask, lengths, goes_on, gamma, lam):
    """Row by row in Python: turns of the row, V after the last turn = value at the row's last
    token when its episode goes on, else 0."""
    advantages = torch.zeros(mask.shape, dtype=torch.float64)
    returns = torch.zeros(mask.shape, dtype=torch.float64)
    for row in range(mask.shape[0]):
        on = [bool(m) for m in mask[row, : lengths[row]]]
        starts = [t for t, m in enumerate(on) if m and (t == 0 or not on[t - 1])]
        ends = [next((u for u in range(s, len(on)) if not on[u]), len(on)) for s in starts]
        bounds = [0] + starts[1:] + [mask.shape[1]]
        turn_rewards = [float(rewards[row, bounds[k] : bounds[k + 1]].sum()) for k in range(len(starts))]
        turn_values = [float(values[row, s]) for s in starts]
        after = float(values[row, lengths[row] - 1]) if goes_on[row] else 0.0
        gae = 0.0
        for k in reversed(range(len(starts))):
            next_value = turn_values[k + 1] if k + 1 < len(starts) else after
            gae = turn_rewards[k] + gamma * next_value - turn_values[k] + gamma * lam * gae
            advantages[row, starts[k] : ends[k]] = gae
            returns[row, starts[k] : ends[k]] = gae + turn_values[k]
    return advantages, returns


def segment_batch(seed=0, rows=6, width=16):
    """Segments: ragged rows; an unfinished one ends with an extra mask-0 token and reward 0, a
    finished one has its final reward on its last token."""
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


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.9, 0.95), (0.7, 0.0)])
def test_bootstrap_matches_the_slow_reference(gamma, lam):
    rewards, values, mask, lengths, goes_on = segment_batch(seed=int(gamma * 10 + lam * 100))
    bootstrap = bootstrap_values(values, lengths, goes_on)
    # only unfinished episodes are bootstrapped, from the value at their extra last token
    assert bootstrap[~goes_on].eq(0).all()
    assert torch.equal(bootstrap[goes_on], values[goes_on, lengths[goes_on] - 1])
    advantages, returns = turn_gae_core(rewards, values, mask, gamma, lam, bootstrap)
    expected, expected_returns = reference_segment_gae(rewards, values, mask, lengths, goes_on, gamma, lam)
    assert torch.allclose(advantages.double(), expected, atol=1e-6)
    assert torch.allclose(returns.double(), expected_returns, atol=1e-6)
    # the bootstrap changes unfinished rows only
    plain, _ = turn_gae_core(rewards, values, mask, gamma, lam)
    changed = (advantages - plain).abs().sum(dim=1) > 1e-9
    assert torch.equal(changed, goes_on & (values[torch.arange(len(lengths)), lengths - 1] != 0))
    # whole episodes: no bootstrap is exactly the old estimator
    zero, _ = turn_gae_core(rewards, values, mask, gamma, lam, torch.zeros(len(lengths), dtype=torch.float64))
    assert torch.equal(zero, plain)


def test_registered_estimator_takes_the_bootstrap_from_the_trainer():
    rewards, values, mask, lengths, goes_on = segment_batch(seed=4)
    bootstrap = bootstrap_values(values, lengths, goes_on)
    with provide_critic_values(values.float(), bootstrap.float()):
        advantages, _ = compute_turn_gae_advantage_return(rewards.float(), mask, config={"gamma": 0.9, "lam": 0.95})
    raw, _ = reference_segment_gae(rewards, values.float().double(), mask, lengths, goes_on, 0.9, 0.95)
    expected = verl_F.masked_whiten(raw, mask.double()) * mask
    assert torch.allclose(advantages.double(), expected, atol=1e-5)


class FakeTransferQueue:
    """In-memory stand-in for the TransferQueue reads/writes of the advantage step."""

    def __init__(self, fields):
        self.fields = dict(fields)
        self.put = {}

    def kv_batch_get(self, keys, partition_id, select_fields):
        from verl.utils import tensordict_utils as tu

        return tu.get_tensordict({name: self.fields[name] for name in select_fields if name in self.fields})

    def kv_batch_put(self, keys, partition_id, fields):
        self.put.update(dict(fields.items()))
        return self.batch


class BatchMeta:
    def __init__(self, keys, tags):
        self.keys, self.tags = keys, tags
        self.partition_id = "train"
        self.extra_info = {}

    def __len__(self):
        return len(self.keys)


def test_segment_trainer_bootstraps_unfinished_rows_in_its_advantage_step(monkeypatch):
    import transfer_queue
    from verl.trainer.ppo.v1 import get_trainer_cls

    from sorl_verl.algos.segment_trainer import SorlSegmentTrainer

    trainer_cls = get_trainer_cls("sorl_segment")
    assert trainer_cls is SorlSegmentTrainer
    rewards, values, mask, lengths, goes_on = segment_batch(seed=7)
    rows = len(lengths)

    def nested(tensor, dtype):
        return torch.nested.as_nested_tensor(
            [tensor[i, : lengths[i]].to(dtype) for i in range(rows)], layout=torch.jagged
        )

    extra_fields = [{STATE_KEY: {"done": not bool(goes_on[i])}} for i in range(rows)]
    store = FakeTransferQueue(
        {
            "uid": torch.arange(rows),
            "response_mask": nested(mask, torch.long),
            "rm_scores": nested(rewards, torch.float32),
            "values": nested(values, torch.float32),
            "extra_fields": extra_fields,
        }
    )
    # the last row is verl's padding (a copy of a real row's fields, mask all 0): never bootstrapped
    tags = [{} for _ in range(rows - 1)] + [{"is_padding": True}]
    store.batch = BatchMeta([f"k{i}" for i in range(rows)], tags)
    monkeypatch.setattr(transfer_queue, "kv_batch_get", store.kv_batch_get)
    monkeypatch.setattr(transfer_queue, "kv_batch_put", store.kv_batch_put)

    trainer = trainer_cls.__new__(trainer_cls)  # only the advantage step is exercised
    trainer.config = OmegaConf.create(
        {
            "algorithm": {"adv_estimator": "turn_gae", "gamma": 0.9, "lam": 0.95, "use_kl_in_reward": False},
            "actor_rollout_ref": {"rollout": {"n": 1}},
        }
    )
    trainer._compute_advantage(store.batch, metrics={})
    expected_goes_on = goes_on.clone()
    expected_goes_on[rows - 1] = False
    raw, _ = reference_segment_gae(rewards, values.float().double(), mask, lengths, expected_goes_on, 0.9, 0.95)
    expected = verl_F.masked_whiten(raw, mask.double()) * mask
    for i in range(rows):
        assert torch.allclose(store.put["advantages"][i].double(), expected[i, : lengths[i]], atol=1e-5)
