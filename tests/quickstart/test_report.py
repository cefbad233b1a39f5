"""Plots, summary numbers and the run report, from sample verl file-logger output."""

import json

import pytest

from sorl_verl.quickstart.report import (
    load_metrics,
    parse_console_line,
    progress_line,
    summarize,
    val_reward,
    write_plots,
)
from sorl_verl.quickstart.summary import report_run

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
        "timing_s/step": 3.0,
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
    return tmp_path


def test_load_merges_files_in_order(run_dir):
    history = load_metrics(sorted(run_dir.glob("metrics*.jsonl")))
    assert sorted(history) == [0, 1, 2, 3]
    assert history[2][VAL] == 0.3 and history[2]["actor/pg_clipfrac"] == pytest.approx(0.2)
    assert val_reward(history[0]) == 0.25 and val_reward(history[1]) is None


def test_bad_line_is_named(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "data": {}}\n{"step": 1}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2"):
        load_metrics([path])


def test_summary_numbers(run_dir):
    summary = summarize(load_metrics(sorted(run_dir.glob("metrics*.jsonl"))))
    assert (summary.val_reward_before, summary.val_reward_after) == (0.25, 0.5)
    assert (summary.first_step, summary.last_step) == (0, 3)
    assert (summary.turns_before, summary.turns_after) == (2.0, 2.1)
    assert summary.token_clip_frac == pytest.approx((0.1 + 0.2 + 0.3) / 3)
    assert summary.turn_clip_frac == pytest.approx((0.2 + 0.4 + 0.4) / 3)


def test_val_reward_averages_sources_and_ignores_aux():
    metrics = {
        "val-core/nq/acc/mean@1": 0.2,
        "val-core/hotpotqa/acc/mean@1": 0.4,
        "val-aux/nq/f1/mean@1": 0.9,
        "val-core/nq/acc/best@4/mean": 1.0,
    }
    assert val_reward(metrics) == pytest.approx(0.3)


def test_plots_written_and_missing_metrics_reported(run_dir, tmp_path):
    history = load_metrics(sorted(run_dir.glob("metrics*.jsonl")))
    status = write_plots(history, tmp_path / "plots")
    for name in ("val_reward.png", "clip_fraction.png", "clip_bias_norm.png", "norm_scale.png", "train_reward.png"):
        assert status[name] == "written"
        assert (tmp_path / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a vanilla-PPO history: no SORL metrics, so those plots are skipped and say why
    vanilla = {s: {k: v for k, v in m.items() if not k.startswith("actor/sorl/")} for s, m in history.items()}
    status = write_plots(vanilla, tmp_path / "plots_ppo")
    assert status["clip_fraction.png"] == "written"
    assert status["norm_scale.png"].startswith("not logged")
    assert not (tmp_path / "plots_ppo" / "norm_scale.png").exists()


def test_report_run_writes_summary_and_resolved_config(run_dir):
    (run_dir / ".hydra").mkdir()
    (run_dir / ".hydra" / "config.yaml").write_text("trainer:\n  total_training_steps: 3\n  copy: ${trainer.total_training_steps}\n")
    (run_dir / "checkpoints" / "global_step_2").mkdir(parents=True)
    (run_dir / "checkpoints" / "global_step_10").mkdir(parents=True)
    table = report_run(run_dir, algo="so_grpo", started_at=None)
    assert "0.250 -> 0.500" in table
    assert "checkpoints/global_step_10" in table
    record = json.loads((run_dir / "summary.json").read_text())
    assert record["summary"]["val_reward_after"] == 0.5 and record["train_steps"] == 3
    assert "copy: 3" in (run_dir / "config_resolved.yaml").read_text()
    assert (run_dir / "plots" / "val_reward.png").is_file()


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
