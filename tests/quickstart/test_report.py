"""Summary numbers, the run report, launches' wall time and the console filter, from sample verl output.

Metrics are read by sorl_verl.tables (its own tests cover the reader's rules); these tests cover
what the quick start adds on top.
"""

import json

import pytest

from sorl_verl.quickstart.report import parse_console_line, progress_line, progress_validation, summarize
from sorl_verl.quickstart.summary import read_launches, record_launch, report_run, wall_seconds
from sorl_verl.tables import load_run

VAL = "val-core/sorl_quickstart/acc/mean@1"


def _lines(rows):
    return "".join(json.dumps({"step": s, "data": d}) + "\n" for s, d in rows)


def _sorl_step(step, clip, turn_clip, reward):
    return {
        "critic/score/mean": reward,
        "actor/pg_clipfrac": clip,
        "actor/sorl/clipfrac_turn": turn_clip,
        "actor/sorl/c_norm": 0.5 * step,
        "actor/sorl/norm_scale": 1.0 - 0.01 * step,
        "timing_s/step": 3.0 + step,
        "timing_s/gen": 1.0,
        "timing_s/update_actor": 0.5 * step,
        "num_turns/mean": 2.0 + step,  # verl's count: user turn + model turns + observations
    }


@pytest.fixture
def run_dir(tmp_path):
    first = [(0, {VAL: 0.25, "val-aux/num_turns/mean": 4.0, "val-aux/sorl_quickstart/f1/mean@1": 0.3})]
    first += [(s, _sorl_step(s, 0.1 * s, 0.2 * s, 0.1 * s)) for s in (1, 2)]
    # second launch (resume from step 2): the logger starts a new file; step 2 repeated, later wins
    second = [(2, {VAL: 0.3, "val-aux/num_turns/mean": 4.5}), (3, {**_sorl_step(3, 0.3, 0.4, 0.5), VAL: 0.5})]
    second[1][1]["val-aux/num_turns/mean"] = 4.2
    (tmp_path / "metrics-20250101-000000.jsonl").write_text(_lines(first))
    (tmp_path / "metrics-20250101-010000.jsonl").write_text(_lines(second))
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "config.yaml").write_text(
        "algorithm:\n  adv_estimator: grpo\nactor_rollout_ref:\n  actor:\n    policy_loss:\n      loss_mode: so_ppo\n"
        "trainer:\n  total_training_steps: 3\n  copy: ${trainer.total_training_steps}\n"
    )
    return tmp_path


def test_summary_numbers(run_dir):
    summary = summarize(load_run(run_dir))
    assert (summary.val_reward_before, summary.val_reward_after) == (0.25, 0.5)
    assert (summary.first_step, summary.last_step) == (0, 3)
    assert (summary.turns_before, summary.turns_after) == (2.0, 2.1)
    assert summary.token_clip_frac == pytest.approx((0.1 + 0.2 + 0.3) / 3)
    assert summary.turn_clip_frac == pytest.approx((0.2 + 0.4 + 0.4) / 3)
    # medians over the training steps 1, 2, 3
    assert summary.step_seconds == 5.0 and summary.timing == {"step": 5.0, "gen": 1.0, "update_actor": 1.0}


def test_turn_panel_draws_model_turns_as_the_summary_counts_them(run_dir):
    from sorl_verl.quickstart.summary import EXTRA_PANELS
    from sorl_verl.tables.plot import panel_curves

    curves = dict(panel_curves([load_run(run_dir)], EXTRA_PANELS))
    title = next(t for t in curves if t.startswith("Model turns per trajectory"))
    assert title.endswith("num_turns/mean / 2")
    [(steps, turns)] = curves[title]
    assert steps == [1, 2, 3] and turns == [1.5, 2.0, 2.5]  # not verl's 3, 4, 5
    summary = summarize(load_run(run_dir))
    assert summary.turns_before == 4.0 / 2  # the same conversion for validation


def test_progress_validation_averages_sources_and_ignores_aux():
    metrics = {
        "val-core/nq/acc/mean@1": 0.2,
        "val-core/hotpotqa/acc/mean@1": 0.4,
        "val-aux/nq/f1/mean@1": 0.9,
        "val-core/nq/acc/best@4/mean": 1.0,
    }
    assert progress_validation(metrics) == pytest.approx(0.3)
    assert progress_validation({"critic/score/mean": 0.5}) is None


def test_report_run_writes_summary_and_resolved_config(run_dir):
    (run_dir / "checkpoints" / "global_step_2").mkdir(parents=True)
    (run_dir / "checkpoints" / "global_step_10").mkdir(parents=True)
    table = report_run(run_dir, algo="so_grpo", started_at=None)
    assert "0.250 -> 0.500" in table
    assert "checkpoints/global_step_10" in table
    record = json.loads((run_dir / "summary.json").read_text())
    assert record["summary"]["val_reward_after"] == 0.5 and record["train_steps"] == 3
    assert record["method"] == "SO-GRPO" and record["summary"]["timing"]["gen"] == 1.0
    assert "copy: 3" in (run_dir / "config_resolved.yaml").read_text()
    assert (run_dir / "plots" / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    titles = record["plots"]["curves.png"]
    assert titles[0].startswith("Validation score") and any(t.startswith("Turn clip fraction") for t in titles)
    assert any(t.startswith("Training reward") for t in titles)


def test_wall_time_sums_over_launches(run_dir):
    assert wall_seconds(run_dir, None) is None
    record_launch(run_dir, 1000.0, 1600.0, how="exit")
    record_launch(run_dir, 2000.0, 2100.0, how="cleanup after kill")
    assert [r["how"] for r in read_launches(run_dir)] == ["exit", "cleanup after kill"]
    assert wall_seconds(run_dir, None) == 700.0
    assert wall_seconds(run_dir, started_at=5000.0, now=5060.0) == 760.0
    table = report_run(run_dir, algo="so_grpo", started_at=None)
    assert "11.7 min over 2 launches" in table
    (run_dir / "launches.jsonl").write_text('{"started_at": 1}\n')
    with pytest.raises(ValueError, match=r"launches.jsonl:1"):
        read_launches(run_dir)


def test_report_without_metrics_fails_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="metrics"):
        report_run(tmp_path)


def test_console_line_parsing_and_progress():
    line = (
        "\x1b[36m(TaskRunnerV1 pid=28002)\x1b[0m step:3 - critic/score/mean:0.5 - val-core/x/acc/mean@1:np.float64(0.25)"
        " - actor/pg_clipfrac:1e-3 - weird:[1, 2] - timing_s/step:2.5\n"
    )
    step, values = parse_console_line(line)
    assert step == 3 and values["critic/score/mean"] == 0.5 and values["val-core/x/acc/mean@1"] == 0.25
    assert values["actor/pg_clipfrac"] == 1e-3 and values["timing_s/step"] == 2.5
    assert "weird" not in values  # not a number: skipped, not misparsed
    assert parse_console_line("step:0")[0] == 0
    text = progress_line(step, values, 90.0)
    assert "step   3" in text and "VALIDATION reward 0.250" in text and "1.5 min" in text
    assert parse_console_line("Training Progress: 10%") is None
