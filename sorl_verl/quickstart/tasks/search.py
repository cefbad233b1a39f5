"""The search quick start's task: one lookup of a made-up fact (:mod:`sorl_verl.quickstart.task`,
prepared by :mod:`sorl_verl.quickstart.prepare`); RL teaches *when to search*."""

from __future__ import annotations

from sorl_verl.quickstart.prepare import PrepareConfig, prepare
from sorl_verl.quickstart.tasks import SEARCH_LOOP_OPTIONS, Option, QuickstartTask


def report(info: dict) -> str:
    return (
        f"task: {info['facts']} facts; model: {info['n_params']:,} parameters; "
        f"SFT on {info['sft_examples']} demonstrations, loss {info['sft_loss_first']:.2f} -> {info['sft_loss_last10']:.2f} "
        f"({info['task_seconds'] + info['model_seconds']:.0f} s)"
    )


TASK = QuickstartTask(
    name="search",
    summary="single-hop QA: one lookup of a made-up fact (2 model turns)",
    config=PrepareConfig,
    prepare=prepare,
    report=report,
    demo_mix="guess_fraction",
    options=(
        Option(
            "guess_fraction",
            "--guess-fraction",
            float,
            "demonstration mix: share of SFT demonstrations that answer at once with a wrong guess (= --demo-mix)",
        ),
        *SEARCH_LOOP_OPTIONS,
    ),
    # run_demo.sh's comments say why each value
    defaults={
        "MAX_TURNS": "2",
        "TOPK": "1",
        "MAX_OBS_LENGTH": "64",
        "MAX_TOKENS_PER_TURN": "32",
        "MAX_PROMPT_LENGTH": "96",
        "MAX_RESPONSE_LENGTH": "160",
        "DEMO_MIX": "0.7",
    },
    episode_turns=2.0,  # one search, then the answer
)
