"""The math quick start's task: generated arithmetic in DAPO-Math's format, single turn, trained
asynchronously (:mod:`sorl_verl.quickstart.math_task`); RL teaches *finish the computation*."""

from __future__ import annotations

from sorl_verl.quickstart.math_task import MathPrepareConfig, prepare_math
from sorl_verl.quickstart.tasks import Option, QuickstartTask


def report(info: dict) -> str:
    return (
        f"task: {info['problems']} problems; model: {info['n_params']:,} parameters; "
        f"SFT on {info['sft_examples']} demonstrations ({info['sft_early_examples']} answer early), "
        f"loss {info['sft_loss_first']:.2f} -> {info['sft_loss_last10']:.2f} "
        f"({info['task_seconds'] + info['model_seconds']:.0f} s)"
    )


TASK = QuickstartTask(
    name="math",
    summary="arithmetic in DAPO-Math's format, single turn, asynchronous trainer",
    config=MathPrepareConfig,
    prepare=prepare_math,
    report=report,
    demo_mix="early_answer_fraction",
    options=(
        Option(
            "early_answer_fraction",
            "--early-answer-fraction",
            float,
            "share of the multi-step demonstrations' choices that answer after the first step (= --demo-mix)",
        ),
        Option("max_ops", "--max-ops", int, "operations per problem, 1 to this"),
    ),
    # run_math_demo.sh sets its own variables (its recipe is examples/math/train.sh)
    launcher="run_math_demo.sh",
    episode_turns=1.0,  # single turn
)
