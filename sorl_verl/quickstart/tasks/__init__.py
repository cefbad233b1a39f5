"""The quick start's tasks, one module each behind one small interface.

A task is a module of this package that defines ``TASK``, a :class:`QuickstartTask`: how to
prepare a run folder (generate the facts, render the rows, write the demonstrations, train and
check the warm start), the options of its ``prepare`` command line, and the launcher with the
defaults of the launcher's variables. ``python -m sorl_verl.quickstart prepare --task NAME``,
``make demo TASK=NAME`` and ``python -m sorl_verl.stability run --task NAME`` find tasks here by
module name, so a new task is one new file in this folder.

=============  =============================================================  ====================
task           what the agent must learn                                      launcher
=============  =============================================================  ====================
search         when to search: one lookup of a made-up fact                   ``run_demo.sh``
multihop       to go on searching: two or three chained lookups               ``run_demo.sh``
multihop_long  the same over four or five chained lookups                     ``run_demo.sh``
medical        to search before choosing an option (multiple choice, letter)  ``run_demo.sh``
math           to finish the computation (single turn, asynchronous trainer)  ``run_math_demo.sh``
=============  =============================================================  ====================

Every task is ours (not the paper's): a miniature of one of the paper's task families that a
~1M-parameter model learns on two CPU cores in minutes.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_TASK = "search"
# The variables examples/quickstart/run_demo.sh reads with a default (``${NAME:-...}``) besides the
# recipes' (sorl_verl.recipes.RECIPE_VARIABLES, of the common.sh it sources); run_demo.sh documents
# each, and a test checks this list against the script.
LAUNCHER_VARIABLES: frozenset[str] = frozenset(
    {
        "TASK",
        "STEPS",
        "SEED",
        "PREPARE_SEED",
        "PREPARE_THREADS",
        "PREPARE_ARGS",
        "OLD_LOG_PROBS",
        # the demo's scale, defaults of its own for variables of common.sh
        "TOTAL_EPOCHS",
        "SAVE_FREQ",
        "TEST_FREQ",
        "TRAIN_BATCH_SIZE",
        "PPO_MINI_BATCH_SIZE",
        "MICRO_BATCH_PER_GPU",
        "LOG_PROB_MICRO_BATCH_PER_GPU",
        "GROUP_SIZE",
        "ACTOR_LR",
        "CRITIC_LR",
        "ACTOR_WARMUP_RATIO",
        "CRITIC_WARMUP_RATIO",
        "PROJECT",
    }
)


@dataclass(frozen=True)
class Option:
    """A task-specific option of ``python -m sorl_verl.quickstart prepare``: ``--flag`` sets config ``field``."""

    field: str
    flag: str
    type: type
    help: str


@dataclass(frozen=True)
class QuickstartTask:
    """One quick-start task.

    Attributes:
        name: the module's name (``TASK=name``).
        summary: one line, shown in ``--help`` and errors.
        config: the task's prepare settings, a :class:`~sorl_verl.quickstart.prepare.WarmStartConfig`
            dataclass (recorded in ``prepare.json``; a rerun must match).
        prepare: ``prepare(run_dir, cfg, show_progress) -> info``: steps 1-2 into ``run_dir`` unless
            ``prepare.json`` says they are done (:func:`sorl_verl.quickstart.prepare.prepare_run`).
        report: ``report(info) -> str``: one line on what ``prepare`` made.
        demo_mix: the config field the launcher's ``DEMO_MIX`` sets (``--demo-mix``): the share of the
            demonstrated choices that stop early, which is what RL has to unlearn.
        options: the task's own command-line options.
        launcher: the script under ``examples/quickstart/`` that runs the demo.
        defaults: the launcher's variables for this task (``NAME -> value``), used when not set.
        episode_turns: model turns of a good trajectory, averaged over the task's kinds of question
            (from how the task builds its questions, not measured). The stability benchmark's segment
            study (:mod:`sorl_verl.stability`) plans its budget of trained turns with it; ``None``:
            not given (the study then needs ``--episode-turns``).
    """

    name: str
    summary: str
    config: type
    prepare: Callable[..., dict]
    report: Callable[[dict], str]
    demo_mix: str
    options: tuple[Option, ...] = ()
    launcher: str = "run_demo.sh"
    defaults: dict[str, str] = field(default_factory=dict)
    episode_turns: float | None = None

    @property
    def launcher_path(self) -> Path:
        return Path(__file__).resolve().parents[3] / "examples" / "quickstart" / self.launcher


# the options of every task played through the search loop (its retrieval shapes the demonstrations)
SEARCH_LOOP_OPTIONS = (
    Option("topk", "--topk", int, "passages per search (must match the agent loop's)"),
    Option("max_obs_length", "--max-obs-length", int, "observation tokens kept (must match the agent loop's)"),
    Option("include_wiki", "--no-wiki", bool, "knowledge-base documents only"),
)


class UnknownTask(ValueError):
    """A task name that is not a module of this package."""


def task_names() -> tuple[str, ...]:
    """The tasks of this package, sorted (every module not starting with ``_``)."""
    return tuple(sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_")))


def get_task(name: str) -> QuickstartTask:
    """The task called ``name``; :class:`UnknownTask` naming the choices for any other name."""
    names = task_names()
    if name not in names:
        raise UnknownTask(f"unknown task {name!r}; choose one of: {', '.join(names)}")
    task = importlib.import_module(f"{__name__}.{name}").TASK
    if task.name != name:
        raise RuntimeError(f"{__name__}.{name} defines the task {task.name!r}; a task's name is its module's")
    return task
