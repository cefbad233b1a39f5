"""The sweep's grid: task x off-policy pressure x method x seed, and what each run is launched with.

A run is one call of the quick start's launcher, ``TASK=... examples/quickstart/run_demo.sh ALGO --out
RUN_DIR [hydra overrides]``, with environment variables for its task and scale (:meth:`RunSpec.env`) and
Hydra overrides for its pressure and method (:meth:`RunSpec.overrides`). Every run of a sweep has the
same budget: the same steps, trajectories per step, validation set and warm start (per task and seed).

Tasks are the quick start's search-loop tasks (:mod:`sorl_verl.quickstart.tasks`: ``search``,
``multihop``, ``medical``); the task is part of a run's name and of the table.

Off-policy pressure (our design; the paper varies the same knobs at a larger scale):

- *update reuse* ``E x M``: ``ppo_epochs = E`` passes over the step's rollouts, each split into
  ``M`` mini-batches, so the step makes ``E * M`` optimizer updates and all but the first run on
  data from an older policy. The demo's own setting is ``1x2``.
- *learning rate*: a larger actor learning rate moves the policy further per update.
- *stale rollouts* ``stale_kK``: rollouts from a policy about K steps old, through verl's async
  trainer ``sorl_colocate_async`` (:func:`stale_pressure`).

The segment study adds an *arm* axis (:class:`Arm`, docs/stability.md#the-segment-study): whole
episodes, or segment mode (docs/segments.md) with ``T`` turns per segment and sync or staggered
resets. A segment arm trains at most ``T`` model turns of a trajectory per step where a whole
episode trains about ``L`` (the task's :attr:`~sorl_verl.quickstart.tasks.QuickstartTask.episode_turns`),
so it gets ``L / T`` times the steps (:meth:`Arm.budget`): every arm trains about the same number
of turns and validates at about the same trained-turn points.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace

from sorl_verl.recipes import ALGOS, SORL_CONFIG_OVERRIDE


@dataclass(frozen=True)
class Method:
    """A method of the grid: an ``ALGO`` of the recipes (:data:`sorl_verl.recipes.ALGOS`), with extra
    launcher variables and Hydra overrides for a variant of it (e.g. another reading of the
    clipping-bias correction)."""

    name: str
    algo: str
    env: tuple[tuple[str, str], ...] = ()
    overrides: tuple[str, ...] = ()

    def __post_init__(self):
        if self.algo not in ALGOS:
            raise ValueError(f"method {self.name}: unknown ALGO {self.algo!r} ({' '.join(ALGOS)})")


# In the order tables and figures show them. The ``s_ppo+...`` variants are the other readings of
# the clipping-bias correction (sorl_verl.algos.correction; s_ppo itself is the default, relative
# with one scale per mini-batch): ``absolute`` thresholds the norm of what clipping removed in
# advantage units, ``sequence`` takes one scale per trajectory inside the loss.
METHOD_SPECS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("grpo", "grpo"),
        Method("so_grpo", "so_grpo"),
        Method("gspo", "gspo"),
        Method("cispo", "cispo"),
        Method("ppo", "ppo"),
        Method("turn_ppo", "turn_ppo"),
        Method("s_ppo", "s_ppo"),
        Method("s_ppo+absolute", "s_ppo", env=(("SORL_NORMALIZATION", "absolute"),)),
        Method(
            "s_ppo+sequence",
            "s_ppo",
            overrides=(SORL_CONFIG_OVERRIDE, "+actor_rollout_ref.actor.policy_loss.norm_scope=sequence"),
        ),
        Method("st_ppo", "st_ppo"),
        # The segment study's methods (Arm): segment mode needs the turn-level critic (turn_gae), so
        # the whole-episode arm runs it too and the segmenting is the only difference between arms.
        # PPO is verl's token-level loss on the same estimator, trainer and critic as ST-PPO's.
        Method("ppo_turn_gae", "st_ppo_turn_gae", overrides=("actor_rollout_ref.actor.policy_loss.loss_mode=vanilla",)),
        Method("st_ppo_turn_gae", "st_ppo_turn_gae"),
    )
}
METHODS: tuple[str, ...] = tuple(METHOD_SPECS)
# the sweep's default methods: the paper's and the baselines (the correction's variants are asked for by name)
DEFAULT_METHODS: tuple[str, ...] = ("grpo", "so_grpo", "gspo", "cispo", "ppo", "turn_ppo", "s_ppo", "st_ppo")
# Critic-free methods: GROUP_SIZE samples per prompt (the recipes set rollout.n for them).
GROUP_ALGOS = frozenset(a.name for a in ALGOS.values() if a.group)
GROUP_METHODS = frozenset(m.name for m in METHOD_SPECS.values() if m.algo in GROUP_ALGOS)
# Methods segment mode can run: a critic and the turn_gae estimator (docs/segments.md).
SEGMENT_METHODS: tuple[str, ...] = tuple(
    m.name for m in METHOD_SPECS.values() if ALGOS[m.algo].critic and ALGOS[m.algo].adv_estimator == "turn_gae"
)
# the segment study's default methods and pressure (no off-policy pressure: the arm is the variable)
SEGMENT_DEFAULT_METHODS: tuple[str, ...] = ("ppo_turn_gae", "st_ppo_turn_gae")
SEGMENT_DEFAULT_PRESSURES: tuple[str, ...] = ("reuse_1x2",)
DEFAULT_SEEDS: tuple[int, ...] = (1, 2, 3)
DEFAULT_TASK = "search"

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
    # the PPO ratio's old policy (run_demo.sh's OLD_LOG_PROBS): "recompute" (an actor pass after the
    # rollout, verl's default and standard PPO) or "rollout" (the log-probs the rollout sampled with)
    old_log_probs: str = "recompute"

    def __post_init__(self):
        if not _NAME.match(self.name):
            raise ValueError(f"pressure name {self.name!r}: use letters, digits and _.+- only (it names run folders)")
        if self.ppo_epochs < 1 or self.mini_batches < 1:
            raise ValueError(f"pressure {self.name}: ppo_epochs and mini_batches must be >= 1")
        if self.old_log_probs not in ("recompute", "rollout"):
            raise ValueError(f"pressure {self.name}: old_log_probs must be 'recompute' or 'rollout'")


# Stale rollouts: verl's asynchronous trainer (``sorl_colocate_async``) asks for k batches of
# prompts ahead of training (``colocate_async.num_warmup_batches = k``), so the batch trained at
# step t was generated by the policy of about step t - k. The staleness bound
# (``sampler.max_off_policy_threshold``: the most weight versions one trajectory may span) is
# k + 1 so that nothing is dropped for being k versions old, and the old policy of the loss is
# the one that generated the tokens (``old_log_probs="rollout"``: verl's
# ``rollout_correction.bypass_mode``), so the PPO/SORL ratio sees the staleness itself (recomputed,
# the ratio would start at 1). k = 0 is the synchronous ``reuse_1x2``. Our design (k = 0, 2, 8).
# The other pressures recompute the old policy, as standard PPO does (the demo's
# own default, the rollout's log-probs, is the same numbers there: the sampling policy is the
# current one; the sweep keeps the recomputation so its synchronous runs are plain PPO).
STALENESS: tuple[int, ...] = (2, 8)


def stale_pressure(k: int) -> Pressure:
    """Rollouts about ``k`` policy versions old, through verl's asynchronous trainer (see STALENESS)."""
    return Pressure(
        f"stale_k{k}",
        f"rollouts ~{k} policy versions old (async trainer, {k} batches ahead), 1 epoch x 2 mini-batches",
        1,
        2,
        overrides=(
            "trainer.v1.trainer_mode=sorl_colocate_async",
            f"trainer.v1.colocate_async.num_warmup_batches={k}",
            f"trainer.v1.sampler.max_off_policy_threshold={k + 1}",
        ),
        old_log_probs="rollout",
    )


PRESSURES: dict[str, Pressure] = {
    p.name: p
    for p in (
        Pressure("reuse_1x2", "the demo's setting: 1 epoch x 2 mini-batches (2 updates per step)", 1, 2),
        Pressure("reuse_4x4", "update reuse: 4 epochs x 4 mini-batches (16 updates per step)", 4, 4),
        Pressure("reuse_8x8", "update reuse: 8 epochs x 8 mini-batches (64 updates per step)", 8, 8),
        Pressure("lr_5e-4", "learning rate 5x the demo's (5e-4), 1 epoch x 2 mini-batches", 1, 2, actor_lr=5e-4),
        *(stale_pressure(k) for k in STALENESS),
    )
}
DEFAULT_PRESSURES: tuple[str, ...] = tuple(PRESSURES)

# --quick: a subset of about 30 minutes on 2 cores: token-level vs SORL in both families, at no
# pressure and at the strongest reuse.
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


# segment mode's reset schedules (sorl_verl.agent.segments.RESETS; a test checks they agree: that
# module imports torch, which the command line does not need)
RESETS: tuple[str, ...] = ("sync", "staggered")
WHOLE = "whole"  # the arm of whole episodes (every run outside the segment study)

# A run folder's files of the sweep (sorl_verl.stability.sweep): its settings and launches, and its
# completion marker. Here so that the report reads them without importing the sweep, which imports it.
RUN_RECORD = "stability_run.json"
DONE_MARKER = "stability_done.json"


@dataclass(frozen=True)
class Arm:
    """A segment arm of the segment study: segment mode with ``turns`` model turns per segment and
    ``resets`` (``sync`` or ``staggered``); whole episodes are no arm (``RunSpec.arm`` None).

    ``episode_turns`` (``L``): the model turns a whole episode trains per trajectory, the plan of
    the budget rule (:meth:`budget`)."""

    turns: int
    resets: str
    episode_turns: float

    def __post_init__(self):
        if isinstance(self.turns, bool) or not isinstance(self.turns, int) or self.turns < 1:
            raise ValueError(f"--segment-turns: T must be an integer >= 1, got {self.turns!r}")
        if self.resets not in RESETS:
            raise ValueError(f"--resets: unknown reset schedule {self.resets!r}; choose {' or '.join(RESETS)}")
        if not self.episode_turns > 0:
            raise ValueError(f"--episode-turns: L must be > 0, got {self.episode_turns!r}")

    @property
    def name(self) -> str:
        """``T<turns>-<resets>``: part of the run's name."""
        return f"T{self.turns}-{self.resets}"

    @property
    def factor(self) -> float:
        """Steps of this arm per whole-episode step: ``L / T``, at least 1 (a segment never trains
        more turns than its episode has)."""
        return max(1.0, self.episode_turns / self.turns)

    def budget(self, whole: Budget) -> Budget:
        """The whole-episode budget rescaled to the same trained turns: ``steps`` and ``test_freq``
        times :attr:`factor` (rounded, at least 1), so every arm trains about ``steps x L`` turns per
        trajectory slot and validates about as often, at about the same trained-turn points."""
        return replace(
            whole,
            steps=max(1, round(whole.steps * self.factor)),
            test_freq=max(1, round(whole.test_freq * self.factor)),
        )

    def overrides(self, pool_size: int, seed: int) -> list[str]:
        """segment mode's trainer overrides (sorl_verl.agent.segments.segment_overrides): a pool of
        one step's trajectories, staggered placement seeded by the run's seed."""
        from sorl_verl.agent.segments import segment_overrides

        return segment_overrides(self.turns, self.resets, pool_size=pool_size, seed=seed)

    def record(self) -> dict:
        return {"name": self.name, **asdict(self)}


def segment_arms(
    turns: list[int] | tuple[int, ...], resets: list[str] | tuple[str, ...], episode_turns: float
) -> list[Arm]:
    """Every (T, reset) pair, T ascending then ``resets`` in the order given."""
    for name, values in (("--segment-turns", turns), ("--resets", resets)):
        if not values:
            raise ValueError(f"{name}: nothing selected")
        if len(set(values)) != len(values):
            raise ValueError(f"{name} repeated: {list(values)}")
    return [Arm(t, r, episode_turns) for t in sorted(turns) for r in resets]


def task_episode_turns(task: str) -> float | None:
    """The task's model turns of a good trajectory (QuickstartTask.episode_turns), None when not given."""
    from sorl_verl.quickstart.tasks import get_task

    return get_task(task).episode_turns


@dataclass(frozen=True)
class RunSpec:
    pressure: Pressure
    method: str
    seed: int
    budget: Budget = field(default_factory=Budget)
    task: str = DEFAULT_TASK
    arm: Arm | None = None  # None: whole episodes; a segment arm's ``budget`` is already rescaled (Arm.budget)

    @property
    def name(self) -> str:
        """The run folder's name (also verl's experiment name); the default task's runs keep the name
        they had before tasks were an axis, and whole-episode runs the name they had before arms were
        one, so their folders and archived rows stay valid. A segment arm goes before the seed."""
        base = f"{self.pressure.name}__{self.method}"
        if self.arm is not None:
            base += f"__{self.arm.name}"
        base += f"__s{self.seed}"
        return base if self.task == DEFAULT_TASK else f"{self.task}__{base}"

    @property
    def arm_name(self) -> str:
        return WHOLE if self.arm is None else self.arm.name

    @property
    def algo(self) -> str:
        """The ``ALGO`` of examples/common.sh that the launcher runs."""
        return METHOD_SPECS[self.method].algo

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
            "OLD_LOG_PROBS": self.pressure.old_log_probs,
            "TASK": self.task,
        }
        if self.pressure.actor_lr is not None:
            env["ACTOR_LR"] = repr(self.pressure.actor_lr)
        env.update(dict(METHOD_SPECS[self.method].env))
        env.update(dict(b.env))
        return env

    def overrides(self) -> list[str]:
        return [
            f"actor_rollout_ref.actor.ppo_epochs={self.pressure.ppo_epochs}",
            # one checkpoint per run is enough to resume (84 runs x all checkpoints would not be)
            "trainer.max_actor_ckpt_to_keep=1",
            "trainer.max_critic_ckpt_to_keep=1",
            *self.pressure.overrides,
            *METHOD_SPECS[self.method].overrides,
            # after the method's: segment mode replaces the sorl_sync trainer of the turn_gae ALGO
            *(self.arm.overrides(pool_size=self.budget.trajectories, seed=self.seed) if self.arm else ()),
            *self.budget.overrides,
        ]

    def record(self) -> dict:
        """What identifies the run's settings (written to its folder; a rerun must match it)."""
        record = {
            "name": self.name,
            "pressure": asdict(self.pressure),
            "method": self.method,
            "seed": self.seed,
            "env": self.env(),
            "overrides": self.overrides(),
        }
        if self.task != DEFAULT_TASK:  # the default task's records keep their earlier keys
            record["task"] = self.task
        if self.arm is not None:  # so do whole-episode runs'
            record["arm"] = self.arm.record()
        return record


def warm_seed(seed: int, budget: Budget) -> int:
    """The warm start's seed: the run's, unless ``--env PREPARE_SEED=N`` shares one warm start across seeds."""
    value = dict(budget.env).get("PREPARE_SEED")
    if value is None:
        return seed
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"PREPARE_SEED must be an integer, got {value!r}") from None


def prepare_args(seed: int, budget: Budget, task: str = DEFAULT_TASK) -> list[str]:
    """The warm start's ``prepare`` options for ``task`` and ``seed``: ``--task``, ``--seed``, then the budget's.

    ``run_demo.sh`` prepares with ``--task $TASK --seed $PREPARE_SEED --topk $TOPK --max-obs-length
    $MAX_OBS_LENGTH --demo-mix $DEMO_MIX $PREPARE_ARGS`` (``PREPARE_SEED`` defaults to ``SEED``); the
    cache is prepared with the same options (the variables when the budget sets them, else both sides
    use the task's defaults), so the copy in each run folder is what run_demo.sh would have made, and
    its ``prepare`` step skips it.
    """
    env = dict(budget.env)
    args = ["--task", task, "--seed", str(warm_seed(seed, budget))]
    # run_demo.sh always passes these (its agent loop must match the demonstrations)
    for var, option in (("TOPK", "--topk"), ("MAX_OBS_LENGTH", "--max-obs-length"), ("DEMO_MIX", "--demo-mix")):
        if var in env:
            args += [option, env[var]]
    return args + list(budget.prepare_args)


def check_task(task: str) -> str:
    """``task`` if the quick start has it and plays it through the search loop; ValueError naming the choices."""
    from sorl_verl.quickstart.tasks import get_task, task_names

    choices = search_loop_tasks()
    if task not in task_names() or get_task(task).launcher != "run_demo.sh":
        raise ValueError(f"unknown task {task!r} for the stability benchmark; choose one of: {', '.join(choices)}")
    return task


def search_loop_tasks() -> tuple[str, ...]:
    """The quick-start tasks the sweep can run (those of ``run_demo.sh``)."""
    from sorl_verl.quickstart.tasks import get_task, task_names

    return tuple(t for t in task_names() if get_task(t).launcher == "run_demo.sh")


_TRAINER_MODE = "trainer.v1.trainer_mode="


def check_segments(methods, pressures: list[Pressure], budget: Budget) -> None:
    """ValueError naming the setting when segment arms cannot run with these methods and pressures."""
    for method in methods:
        if method in SEGMENT_METHODS:
            continue
        algo = ALGOS[METHOD_SPECS[method].algo]
        why = (
            "it is critic-free and needs whole episodes"
            if not algo.critic
            else f"its estimator {algo.adv_estimator} takes no bootstrap value for an unfinished segment"
        )
        raise ValueError(
            f"--segment-turns: method {method} cannot run segment arms (segment mode needs a critic and the "
            f"turn_gae estimator; {why}); methods that can: {' '.join(SEGMENT_METHODS)}"
        )
    for pressure in pressures:
        mode = [o for o in pressure.overrides if o.startswith(_TRAINER_MODE)]
        if mode:
            raise ValueError(
                f"--segment-turns: pressure {pressure.name} runs its own trainer ({mode[0]}), segment arms run "
                "segment mode's: use a pressure that keeps the trainer (e.g. reuse_1x2)"
            )
    mode = [o for o in budget.overrides if o.startswith(_TRAINER_MODE)]
    if mode:
        raise ValueError(f"--override {mode[0]}: segment arms set the trainer mode themselves")


def build_grid(
    pressures: list[str] | tuple[str, ...] = DEFAULT_PRESSURES,
    methods: list[str] | tuple[str, ...] = DEFAULT_METHODS,
    seeds: list[int] | tuple[int, ...] = DEFAULT_SEEDS,
    budget: Budget | None = None,
    registry: dict[str, Pressure] | None = None,
    tasks: list[str] | tuple[str, ...] = (DEFAULT_TASK,),
    segment_turns: list[int] | tuple[int, ...] = (),
    resets: list[str] | tuple[str, ...] = RESETS,
    whole: bool = True,
    episode_turns: float | None = None,
) -> list[RunSpec]:
    """Runs in sweep order: seed, then task, then pressure, then method, then arm (a partial sweep
    covers every cell once).

    ``segment_turns``: the segment study (:class:`Arm`): whole episodes (unless ``whole`` is False)
    and an arm per (T, reset) pair, each with the budget rescaled to the same trained turns;
    ``episode_turns`` is ``L`` (default: each task's ``episode_turns``). Without it, whole episodes only.
    """
    registry = PRESSURES if registry is None else registry
    budget = budget or Budget()
    unknown = [p for p in pressures if p not in registry]
    if unknown:
        raise ValueError(f"unknown pressure(s) {', '.join(unknown)}; known: {', '.join(registry)}")
    bad = [m for m in methods if m not in METHODS]
    if bad:
        raise ValueError(f"unknown method(s) {', '.join(bad)}; known: {', '.join(METHODS)}")
    for task in tasks:
        check_task(task)
    for name, values in (("pressures", pressures), ("methods", methods), ("seeds", seeds), ("tasks", tasks)):
        if not values:
            raise ValueError(f"no {name} selected")
        if len(set(values)) != len(values):
            raise ValueError(f"{name} repeated: {list(values)}")
    arms: dict[str, list[Arm | None]] = {task: [None] for task in tasks}
    if segment_turns:
        check_segments(methods, [registry[p] for p in pressures], budget)
        for task in tasks:
            length = episode_turns if episode_turns is not None else task_episode_turns(task)
            if length is None:
                raise ValueError(f"--episode-turns: task {task} gives no episode_turns; give --episode-turns L")
            arms[task] = ([None] if whole else []) + segment_arms(segment_turns, resets, length)
    elif not whole:
        raise ValueError("--no-whole: without --segment-turns there is no arm left")
    runs = [
        RunSpec(registry[p], m, s, arm.budget(budget) if arm else budget, t, arm)
        for s in seeds
        for t in tasks
        for p in pressures
        for m in methods
        for arm in arms[t]
    ]
    for run in runs:
        run.batch()  # raises for a batch that does not split
    return runs
