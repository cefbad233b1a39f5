"""Segment mode's settings and placement: bad input refused by name, seeded staggered starts, rows
to a batch and back. (``turn_gae`` with the bootstrap value: ``test_turn_gae.py``; the pool and
the agent loop: ``tests/agent/test_search_r1_segments.py``.)"""

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from sorl_verl.agent.segments import (
    SegmentConfig,
    batch_from_rows,
    rows_from_batch,
    segment_overrides,
    start_fractions,
    warmup_turns,
)


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


def test_checkpoint_holds_the_pool(monkeypatch, tmp_path):
    """The trainer's save/load around verl's: the pool file lands in the step folder and comes back."""
    from verl.trainer.ppo.v1.trainer_base import PPOTrainer

    from sorl_verl.agent.segments import EpisodePool
    from sorl_verl.algos.segment_trainer import POOL_FILE, SorlSegmentTrainer

    saved_steps = []
    monkeypatch.setattr(PPOTrainer, "_save_checkpoint", lambda self: saved_steps.append(self.global_steps))
    monkeypatch.setattr(PPOTrainer, "_load_checkpoint", lambda self: setattr(self, "global_steps", 4))

    def trainer(**changes):
        config = trainer_config(**changes)
        OmegaConf.update(config, "trainer.default_local_dir", str(tmp_path), force_add=True)
        OmegaConf.update(config, "trainer.resume_mode", "auto", force_add=True)
        instance = SorlSegmentTrainer.__new__(SorlSegmentTrainer)  # verl's workers are not needed here
        instance.config = config
        instance.pool = EpisodePool(SegmentConfig.from_trainer_config(config), batch_size=4)
        return instance

    rows = iter(range(100))
    saver = trainer()
    saver.pool.next_rows(lambda: [{"raw_prompt": [], "index": next(rows)} for _ in range(4)])
    saver.pool.update(
        {e.episode_id: {"done": False, "state": {"context_ids": [e.episode_id]}} for e in saver.pool.slots}
    )
    saver.global_steps = 4
    saver._save_checkpoint()
    assert saved_steps == [4] and (tmp_path / "global_step_4" / POOL_FILE).exists()

    loader = trainer()
    loader._load_checkpoint()
    assert [e.state for e in loader.pool.slots] == [{"context_ids": [i]} for i in range(4)]
    assert torch.load(tmp_path / "global_step_4" / POOL_FILE, weights_only=False)["next_id"] == 4
    # other segment settings than the checkpoint's: refused, naming the section
    with pytest.raises(ValueError, match=r"trainer\.v1\.segment"):
        trainer(**{"trainer.v1.segment.turns": 3})._load_checkpoint()
    # a checkpoint without a pool (another mode's): a fresh pool
    (tmp_path / "global_step_4" / POOL_FILE).unlink()
    fresh = trainer()
    fresh._load_checkpoint()
    assert fresh.pool.slots == []


def test_a_pool_larger_than_the_batch_is_advanced_in_round_robin():
    from sorl_verl.agent.segments import SEGMENT_KEY, EpisodePool

    pool = EpisodePool(SegmentConfig(turns=1, resets="sync", pool_size=6, seed=0), batch_size=4)
    fetched = iter(range(100))

    def fetch_rows():
        return [{"raw_prompt": [], "index": next(fetched)} for _ in range(4)]

    advanced = []
    for step in range(3):
        rows = pool.next_rows(fetch_rows)
        ids = [row[SEGMENT_KEY]["episode_id"] for row in rows]
        advanced.append(ids)
        # episode 1 ends at step 0; the others go on with a state naming their step
        pool.update({i: {"done": i == 1, "state": {"step": step}} for i in ids})
    assert advanced[0] == [0, 1, 2, 3]
    assert advanced[1] == [4, 5, 0, 6]  # slot 1's episode ended: a new one (6) takes its place
    assert advanced[2] == [2, 3, 4, 5]
    assert [row["index"] for row in pool.waiting] == [7]  # fetched in chunks; the rest waits (and is saved)
    assert [e.state for e in pool.slots] == [
        {"step": 1},
        {"step": 1},
        {"step": 2},
        {"step": 2},
        {"step": 2},
        {"step": 2},
    ]
