"""verl's own replay buffer with a shorter poll interval (the quick start's step took 4 s waiting).

verl 0.9.1's trainer (``trainer/ppo/v1``) does not wait for a rollout batch: its
``ReplayBuffer.sample`` checks TransferQueue, and while too few trajectories are done it
``time.sleep(poll_interval)`` with ``poll_interval=2.0`` fixed by its constructor default. On a GPU
a rollout takes tens of seconds and 2 s is noise; the quick start's rollout takes about a second,
so every training step and every validation waited for two polls: ``timing_s/gen`` was 4.0-4.1 s
on every step (measured, load 5-50), whatever the rollout itself cost.

verl's public hook for this is ``trainer.v1.sampler.custom_sampler.{path,name}``: the quick start
names :class:`QuickPollSampler`, which builds exactly the class verl would have built
(``ReplayBuffer`` in ``sync`` mode, ``ReplayBufferAsync`` otherwise) with
``poll_interval = trainer.v1.sampler.sampler_kwargs.poll_interval`` (default 0.1 s: each poll
is a TransferQueue metadata call, cheap but not free on 2 cores). Nothing else changes. One
difference from verl's built-in path: verl passes a custom sampler neither the DAPO
group-filtering settings nor the batch sizes those need, so ``algorithm.filter_groups`` would be
ignored with it; ``run_demo.sh`` therefore uses it only when ``POLL_INTERVAL`` is set (its
default), and ``POLL_INTERVAL=`` gives verl's built-in sampler back (for DAPO).
"""

from __future__ import annotations

DEFAULT_POLL_INTERVAL_S = 0.1


class QuickPollSampler:
    """A factory with a class's face: ``QuickPollSampler(**kwargs)`` returns verl's replay buffer."""

    def __new__(cls, *args, **kwargs):
        from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync

        if args:
            raise TypeError("QuickPollSampler takes keyword arguments only (as verl's trainer passes them)")
        sampler_kwargs = kwargs.get("sampler_kwargs") or {}
        poll = float(sampler_kwargs.get("poll_interval", DEFAULT_POLL_INTERVAL_S))
        if not poll > 0:
            raise ValueError(f"trainer.v1.sampler.sampler_kwargs.poll_interval must be > 0, got {poll}")
        base = ReplayBuffer if kwargs.get("trainer_mode") == "sync" else ReplayBufferAsync
        return base(**kwargs, poll_interval=poll)
