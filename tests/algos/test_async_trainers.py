"""SORL's async trainers: registration over verl's classes, verl's mode name, turn staleness metrics."""

from __future__ import annotations

import pytest

from sorl_verl.algos.async_trainers import (
    SorlColocateAsyncTrainer,
    SorlSeparateAsyncTrainer,
    turn_staleness_metrics,
)


def test_registered_over_verls_own_classes():
    from verl.trainer.ppo.v1 import PPOTrainerColocateAsync, PPOTrainerSeparateAsync, get_trainer_cls

    assert get_trainer_cls("sorl_colocate_async") is SorlColocateAsyncTrainer
    assert get_trainer_cls("sorl_separate_async") is SorlSeparateAsyncTrainer
    assert issubclass(SorlColocateAsyncTrainer, PPOTrainerColocateAsync)
    assert issubclass(SorlSeparateAsyncTrainer, PPOTrainerSeparateAsync)
    # verl's hooks (abort/sleep/update/resume around each step) are verl's, not copies
    for name in ("on_sample_end", "on_step_end", "get_llm_client", "_compute_old_log_prob"):
        assert name not in vars(SorlColocateAsyncTrainer) and name not in vars(SorlSeparateAsyncTrainer)


def test_trainer_mode_answers_verls_mode_name():
    """verl picks its replay buffer and the trainer.v1.<mode> section by the mode's name."""
    trainer = object.__new__(SorlSeparateAsyncTrainer)
    trainer.trainer_mode = "sorl_separate_async"  # what verl's __init__ assigns from the config
    assert trainer.trainer_mode == "separate_async"
    with pytest.raises(ValueError, match="sorl_separate_async"):
        trainer.trainer_mode = "sync"


def test_sorl_sync_runs_as_verls_sync_mode():
    """Under its registered name verl would pick its asynchronous replay buffer for sorl_sync."""
    from verl.trainer.ppo.v1.trainer_sync import PPOTrainerSync

    from sorl_verl.algos.trainer import SorlSyncTrainer

    assert issubclass(SorlSyncTrainer, PPOTrainerSync)
    trainer = object.__new__(SorlSyncTrainer)
    trainer.trainer_mode = "sorl_sync"
    assert trainer.trainer_mode == "sync"


def test_turn_staleness_from_recorded_turns():
    # step 5 trains version 4. Trajectory A: turn 1 by version 2, turn 2 started on 3 and was
    # continued on 4 after an abort. B: one turn on version 4. C: padding (no version).
    metrics = turn_staleness_metrics(
        turn_versions=[[[2, 2], [3, 4]], [[4, 4]], None],
        trajectory_min=[2, 4, None],
        trajectory_max=[4, 4, None],
        global_steps=5,
    )
    assert metrics == {
        "actor/sorl/turn_staleness_mean": pytest.approx((2 + 1 + 0) / 3),
        "actor/sorl/turn_staleness_max": 2.0,
        "actor/sorl/mixed_version_share": 0.5,
    }


def test_turn_staleness_falls_back_to_the_trajectory_range():
    # a single-turn loop records nothing per turn: the trajectory is the turn
    metrics = turn_staleness_metrics([None, {}], [1, 3], [3, 3], global_steps=4)
    assert metrics["actor/sorl/turn_staleness_max"] == 2.0  # oldest weights: version 1, trained: 3
    assert metrics["actor/sorl/turn_staleness_mean"] == 1.0
    assert metrics["actor/sorl/mixed_version_share"] == 0.5
    assert turn_staleness_metrics([None], [None], [None], global_steps=3) == {}
