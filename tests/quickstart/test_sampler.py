"""The quick start's sampler is verl's own replay buffer, only with the poll interval from the config."""

import pytest
from omegaconf import OmegaConf

from sorl_verl.quickstart.sampler import DEFAULT_POLL_INTERVAL_S, QuickPollSampler


def _kwargs(mode: str, **sampler_kwargs) -> dict:
    # what verl 0.9.1's trainer_base._build_replay_buffer passes a custom sampler
    return dict(
        trainer_mode=mode,
        trainer_config=OmegaConf.create({}),
        max_off_policy_threshold=8,
        max_off_policy_strategy="drop",
        sampler_kwargs=OmegaConf.create(sampler_kwargs),
        refill_fn=lambda n: None,
    )


@pytest.mark.parametrize(
    "mode, expected", [("sync", "ReplayBuffer"), ("async", "ReplayBufferAsync"), ("sorl_sync", "ReplayBufferAsync")]
)
def test_builds_the_class_verl_would_build(mode, expected):
    from verl.trainer.ppo.v1 import replay_buffer

    buffer = QuickPollSampler(**_kwargs(mode, poll_interval=0.25))
    assert type(buffer) is getattr(replay_buffer, expected)
    assert buffer.poll_interval == 0.25
    # verl's own default, which the quick start replaces
    assert replay_buffer.ReplayBuffer(**_kwargs(mode)).poll_interval == 2.0


def test_default_and_bad_interval():
    assert QuickPollSampler(**_kwargs("sync")).poll_interval == DEFAULT_POLL_INTERVAL_S
    with pytest.raises(ValueError, match="poll_interval must be > 0"):
        QuickPollSampler(**_kwargs("sync", poll_interval=0))


def test_verl_loads_it_by_its_config_names():
    from verl.utils.import_utils import load_extern_type

    assert load_extern_type("pkg://sorl_verl.quickstart.sampler", "QuickPollSampler") is QuickPollSampler
