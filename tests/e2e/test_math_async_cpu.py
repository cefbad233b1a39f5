"""The math quick start's trainer path on CPU: ``sorl_colocate_async`` with verl's ``single_turn_agent``.

One run of 3 steps (2 prompts x 2 samples per step) on the math quick start's generated
arithmetic rows (DAPO-Math's prompt, ``Answer: N``), from a small SFT warm start made by the
quick start's own ``prepare_math`` (a smaller task), with the math recipe's asynchronous settings
(``examples/math/train.sh``: bypass mode, staleness bound 8) and SO-GRPO. It checks that the
asynchronous trainer trained every step on the math rows (verl's dump of the trained
trajectories: DAPO prompts, 4 per step, none twice), that every trained score is what
``reward_fns.math`` gives the decoded response against the row's gold (so the router sent the
rows to the math reward; validation answers too) with at least one correct answer among them,
that the step metrics (loss, reward, staleness) are finite, that the validation accuracy is
logged under the math data source, and that stale data was trained on (the warm-up batch).
"""

from __future__ import annotations

import json
import math

import pytest

from data_prep.templates import DAPO_MATH_HEADER
from reward_fns import math as math_reward
from sorl_verl.quickstart.math_task import DATA_SOURCE, MathPrepareConfig, prepare_math

pytestmark = pytest.mark.e2e

STEPS, TRAIN_BATCH, N = 3, 2, 2
# a smaller task than the demo's (values 0-12, operands 1-3, two steps at most: about 70 arithmetic
# facts), every demonstration complete, and a smaller warm start: a short SFT gets some answers
# right, so the rewards are not all 0 (measured: 1 of 4 at step 1, 1 of 8 in validation, 300 steps).
# VAL_ROWS greedy validation answers make "some answer is right" all but certain: with 8 rows the
# 20 scored answers were all wrong in 1 of 3 CI runs.
VAL_ROWS = 48
WARM_START = {
    "sizes": {"sft": 300, "train": 16, "val": VAL_ROWS},
    "max_ops": 2,
    "start_range": [0, 12],
    "operand_range": [1, 3],
    "value_range": [0, 12],
    "early_answer_fraction": 0.0,
    "hidden_size": 64,
    "sft_steps": 400,
    "sft_batch_size": 16,
}


@pytest.fixture(scope="module")
def math_assets(tmp_path_factory):
    """(folder with train/val parquet, warm-started model): ``run_main_ppo``'s assets."""
    run_dir = tmp_path_factory.mktemp("math_e2e")
    info = prepare_math(run_dir, MathPrepareConfig(**WARM_START), show_progress=False)
    assert info["sft_loss_last10"] < info["sft_loss_first"]
    return run_dir / "task", run_dir / "model"


def test_colocate_async_math_single_turn(math_assets, main_ppo, tmp_path):
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    out = tmp_path / "math_colocate"
    result = main_ppo(
        math_assets,
        out,
        [
            f"trainer.total_training_steps={STEPS}",
            "trainer.total_epochs=3",
            "trainer.save_freq=-1",
            "trainer.test_freq=3",
            f"trainer.rollout_data_dir={out / 'rollouts'}",
            f"trainer.validation_data_dir={out / 'validation'}",
            "data.max_prompt_length=128",
            "data.max_response_length=32",
            # the rows name verl's single_turn_agent; no agent-loop config file
            "actor_rollout_ref.rollout.agent.agent_loop_config_path=null",
            f"reward.custom_reward_function.path={repo / 'reward_fns' / '__init__.py'}",
            # examples/math/train.sh's asynchronous settings, SO-GRPO
            "trainer.v1.trainer_mode=sorl_colocate_async",
            "trainer.v1.sampler.max_off_policy_threshold=8",
            "algorithm.rollout_correction.bypass_mode=True",
            "actor_rollout_ref.actor.policy_loss.loss_mode=so_ppo",
            "algorithm.adv_estimator=grpo",
        ],
    )
    assert result.returncode == 0, result.log[-6000:]
    steps = result.step_metrics()
    assert [s for s in sorted(steps) if s >= 1][-STEPS:] == list(range(1, STEPS + 1)), sorted(steps)

    # trained on the math rows, every step, each trajectory once
    dumps = {
        int(p.stem): [json.loads(x) for x in p.read_text().splitlines() if x.strip()]
        for p in (out / "rollouts").glob("*.jsonl")
    }
    assert sorted(dumps) == list(range(1, STEPS + 1)), sorted(dumps)
    rows = [row for step_rows in dumps.values() for row in step_rows]
    assert all(len(step_rows) == TRAIN_BATCH * N for step_rows in dumps.values())
    assert len({row["uid"] for row in rows}) == len(rows)
    assert all(DAPO_MATH_HEADER in row["input"] for row in rows)
    # the score of each trained trajectory and of each validation answer (greedy, after step 3) is
    # the math reward's; some answers are right
    validation = [json.loads(x) for x in (out / "validation" / "3.jsonl").read_text().splitlines() if x.strip()]
    assert len(validation) == VAL_ROWS and all(DAPO_MATH_HEADER in row["input"] for row in validation)
    scored = rows + validation
    expected = [math_reward.compute_score(DATA_SOURCE, row["output"], row["gts"])["score"] for row in scored]
    assert [row["score"] for row in scored] == expected
    print(
        f"right answers: {sum(expected):g} of {len(expected)} (validation {sum(expected[len(rows) :]):g} of {VAL_ROWS})"
    )
    assert max(expected) == 1.0, [row["output"] for row in scored]

    for step in range(1, STEPS + 1):
        data = steps[step]
        for key in (
            "actor/pg_loss",
            "actor/sorl/turn_staleness_mean",
            "actor/sorl/turn_staleness_max",
            "critic/score/mean",
        ):
            assert key in data and math.isfinite(data[key]), (step, key, data.get(key))
        # one turn per trajectory: the single-turn loop's staleness is the trajectory's
        assert data["actor/sorl/turn_staleness_max"] >= 0
    accuracy = steps[STEPS][f"val-core/{DATA_SOURCE}/acc/mean@1"]
    assert accuracy == sum(row["score"] for row in validation) / len(validation)
    # colocate_async trains the warm-up batch generated before the first update: stale data
    assert max(steps[s]["training/off_policy/trajectory_staleness_worst/max"] for s in range(1, STEPS + 1)) >= 1
