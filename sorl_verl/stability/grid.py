"""The sweep's grid: off-policy pressure x method x seed, and what each run is launched with.

A run is one call of the quick start's launcher, ``examples/quickstart/run_demo.sh METHOD --out
RUN_DIR [hydra overrides]``, with environment variables for its scale (:meth:`RunSpec.env`) and
Hydra overrides for its pressure (:meth:`RunSpec.overrides`). Every run of a sweep has the same
budget: the same steps, trajectories per step, validation set and warm start (per seed).

Off-policy pressure (our design; the paper varies the same knobs at a larger scale):

- *update reuse* ``E x M``: ``ppo_epochs = E`` passes over the step's rollouts, each split into
  ``M`` mini-batches, so the step makes ``E * M`` optimizer updates and all but the first run on
  data from an older policy. The demo's own setting is ``1x2``.
- *learning rate*: a larger actor learning rate moves the policy further per update.
- *stale rollouts* (not in the grid yet): rollouts from a policy k steps old, through the async
  trainer ``sorl_colocate_async`` (``trainer.v1.sampler.max_off_policy_threshold`` = k); each k is
  one more :class:`Pressure` whose ``overrides`` carry those keys (see the comment in PRESSURES).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

# ALGO names of examples/common.sh, in the order tables and figures show them.
METHODS: tuple[str, ...] = ("grpo", "so_grpo", "gspo", "ppo", "turn_ppo", "s_ppo", "st_ppo")
# Critic-free methods: GROUP_SIZE samples per prompt (common.sh sets rollout.n for them).
GROUP_METHODS = frozenset({"grpo", "so_grpo", "gspo"})
DEFAULT_SEEDS: tuple[int, ...] = (1, 2, 3)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


@dataclass(frozen=True)
class Pressure:
    """One level of off-policy pressure: update reuse, an actor learning rate, extra overrides."""

    name: str
    description: str
    ppo_epochs: int = 1
    mini_batches: int = 2
    actor_lr: float | None = None  # None: the launcher's default
    overrides: tuple[str, ...] = ()  # further Hydra overrides (e.g. the async trainer's staleness bound)

    def __post_init__(self):
        if not _NAME.match(self.name):
            raise ValueError(f"pressure name {self.name!r}: use letters, digits and _.+- only (it names run folders)")
        if self.ppo_epochs < 1 or self.mini_batches < 1:
            raise ValueError(f"pressure {self.name}: ppo_epochs and mini_batches must be >= 1")


PRESSURES: dict[str, Pressure] = {
    p.name: p
    for p in (
        Pressure("reuse_1x2", "the demo's setting: 1 epoch x 2 mini-batches (2 updates per step)", 1, 2),
        Pressure("reuse_4x4", "update reuse: 4 epochs x 4 mini-batches (16 updates per step)", 4, 4),
        Pressure("reuse_8x8", "update reuse: 8 epochs x 8 mini-batches (64 updates per step)", 8, 8),
        Pressure("lr_5e-4", "learning rate 5x the demo's (5e-4), 1 epoch x 2 mini-batches", 1, 2, actor_lr=5e-4),
        # Stale rollouts (verl's async trainers), once they run the quick start's agent loop on CPU in
        # a measured run: one entry per k, with the overrides of examples/math/train.sh (k=0 is the
        # synchronous reuse_1x2), e.g.
        # Pressure("stale_k2", "rollouts up to 2 policy versions old", 1, 2, overrides=(
        #     "trainer.v1.trainer_mode=sorl_colocate_async",
        #     "trainer.v1.sampler.max_off_policy_threshold=2",
        #     "algorithm.rollout_correction.bypass_mode=True")),
    )
}
DEFAULT_PRESSURES: tuple[str, ...] = tuple(PRESSURES)

# --quick: the subset that fits ~30 minutes on 2 idle cores (docs/stability.md has the measurement):
# token-level vs SORL in both families, at no pressure and at the strongest reuse.
QUICK = {"pressures": ("reuse_1x2", "reuse_8x8"), "methods": ("grpo", "so_grpo"), "seeds": (1,)}


@dataclass(frozen=True)
class Budget:
    """What every run of a sweep shares: steps, validation cadence, batch, warm-start settings."""

    steps: int = 20
    test_freq: int = 5
    trajectories: int = 64  # per training step, every method (the demo's 64)
    group_size: int = 8  # samples per prompt for the critic-free methods
    prepare_args: tuple[str, ...] = ()  # extra `python -m sorl_verl.quickstart prepare` options
    env: tuple[tuple[str, str], ...] = ()  # extra launcher environment variables (NAME, value)
    overrides: tuple[str, ...] = ()  # extra Hydra overrides for every run (last, they win)

    def __post_init__(self):
        # run_demo.sh splits $PREPARE_ARGS on spaces: an option value cannot hold one
        spaced = [a for a in self.prepare_args if not a or any(c.isspace() for c in a)]
        if spaced:
            raise ValueError(f"prepare options cannot be empty or contain spaces: {spaced}")
        if self.steps < 1 or self.test_freq < 1:
            raise ValueError("steps and test_freq must be >= 1")
        if self.trajectories < 1 or self.group_size < 1:
            raise ValueError("trajectories and group_size must be >= 1")
        if self.trajectories % self.group_size:
            raise ValueError(f"trajectories ({self.trajectories}) must be a multiple of group_size ({self.group_size})")


@dataclass(frozen=True)
class RunSpec:
    pressure: Pressure
    method: str
    seed: int
    budget: Budget = field(default_factory=Budget)

    @property
    def name(self) -> str:
        """The run folder's name (also verl's experiment name)."""
        return f"{self.pressure.name}__{self.method}__s{self.seed}"

    def batch(self) -> tuple[int, int, int]:
        """``(TRAIN_BATCH_SIZE, PPO_MINI_BATCH_SIZE, MICRO_BATCH_PER_GPU)`` for this run.

        verl counts the first two in prompts (it multiplies by ``rollout.n``), the micro-batch in
        trajectories. The critic-free methods take ``trajectories / group_size`` prompts with
        ``group_size`` samples each; the critic methods ``trajectories`` prompts with one each.
        One micro-batch per mini-batch, as the demo does (on CPU each extra micro-batch is mostly
        fixed overhead; the update is the same for any split).
        """
        b, p = self.budget, self.pressure
        per_prompt = b.group_size if self.method in GROUP_METHODS else 1
        prompts = b.trajectories // per_prompt
        if prompts % p.mini_batches:
            raise ValueError(
                f"run {self.name}: {prompts} prompts per step do not split into {p.mini_batches} mini-batches "
                f"(trajectories={b.trajectories}, group_size={per_prompt})"
            )
        mini = prompts // p.mini_batches
        return prompts, mini, mini * per_prompt

    def env(self) -> dict[str, str]:
        """Environment variables of ``run_demo.sh`` for this run (the budget's extras last)."""
        train, mini, micro = self.batch()
        b = self.budget
        env = {
            "STEPS": str(b.steps),
            "TEST_FREQ": str(b.test_freq),
            # resume loses at most one validation interval; completed runs keep one checkpoint
            "SAVE_FREQ": str(b.test_freq),
            "SEED": str(self.seed),
            "GROUP_SIZE": str(b.group_size),
            "TRAIN_BATCH_SIZE": str(train),
            "PPO_MINI_BATCH_SIZE": str(mini),
            "MICRO_BATCH_PER_GPU": str(micro),
            # one log-prob pass over the whole step's batch (verl needs it to divide the batch)
            "LOG_PROB_MICRO_BATCH_PER_GPU": str(b.trajectories),
            "PREPARE_ARGS": " ".join(b.prepare_args),
        }
        if self.pressure.actor_lr is not None:
            env["ACTOR_LR"] = repr(self.pressure.actor_lr)
        env.update(dict(b.env))
        return env

    def overrides(self) -> list[str]:
        return [
            f"actor_rollout_ref.actor.ppo_epochs={self.pressure.ppo_epochs}",
            # one checkpoint per run is enough to resume (84 runs x all checkpoints would not be)
            "trainer.max_actor_ckpt_to_keep=1",
            "trainer.max_critic_ckpt_to_keep=1",
            *self.pressure.overrides,
            *self.budget.overrides,
        ]

    def record(self) -> dict:
        """What identifies the run's settings (written to its folder; a rerun must match it)."""
        return {
            "name": self.name,
            "pressure": asdict(self.pressure),
            "method": self.method,
            "seed": self.seed,
            "env": self.env(),
            "overrides": self.overrides(),
        }


def warm_seed(seed: int, budget: Budget) -> int:
    """The warm start's seed: the run's, unless ``--env PREPARE_SEED=N`` shares one warm start across seeds."""
    value = dict(budget.env).get("PREPARE_SEED")
    if value is None:
        return seed
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"PREPARE_SEED must be an integer, got {value!r}") from None


def prepare_args(seed: int, budget: Budget) -> list[str]:
    """The warm start's ``prepare`` options for ``seed``: ``--seed`` first, then the budget's.

    ``run_demo.sh`` prepares with ``--seed $PREPARE_SEED --topk $TOPK --max-obs-length $MAX_OBS_LENGTH
    --guess-fraction $DEMO_MIX $PREPARE_ARGS`` (``PREPARE_SEED`` defaults to ``SEED``); the cache is
    prepared with the same options (the variables when the budget sets them, else both sides use
    the same defaults), so the copy in each run folder is what run_demo.sh would have made, and
    its ``prepare`` step skips it.
    """
    env = dict(budget.env)
    args = ["--seed", str(warm_seed(seed, budget))]
    # run_demo.sh always passes these (its agent loop must match the demonstrations)
    for var, option in (("TOPK", "--topk"), ("MAX_OBS_LENGTH", "--max-obs-length"), ("DEMO_MIX", "--guess-fraction")):
        if var in env:
            args += [option, env[var]]
    return args + list(budget.prepare_args)


def build_grid(
    pressures: list[str] | tuple[str, ...] = DEFAULT_PRESSURES,
    methods: list[str] | tuple[str, ...] = METHODS,
    seeds: list[int] | tuple[int, ...] = DEFAULT_SEEDS,
    budget: Budget | None = None,
    registry: dict[str, Pressure] | None = None,
) -> list[RunSpec]:
    """Runs in sweep order: seed, then pressure, then method (a partial sweep covers every cell once)."""
    registry = PRESSURES if registry is None else registry
    budget = budget or Budget()
    unknown = [p for p in pressures if p not in registry]
    if unknown:
        raise ValueError(f"unknown pressure(s) {', '.join(unknown)}; known: {', '.join(registry)}")
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ValueError(f"unknown method(s) {', '.join(bad)}; known: {', '.join(METHODS)}")
    for name, values in (("pressures", pressures), ("methods", methods), ("seeds", seeds)):
        if not values:
            raise ValueError(f"no {name} selected")
        if len(set(values)) != len(values):
            raise ValueError(f"{name} repeated: {list(values)}")
    runs = [RunSpec(registry[p], m, s, budget) for s in seeds for p in pressures for m in methods]
    for run in runs:
        run.batch()  # raises for a batch that does not split
    return runs
