"""The table tool on synthetic run folders: numbers, best vs last, missing datasets, errors, the CLI, the plot."""

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sorl_verl.tables import RunError, build_table, load_run, method_name, to_csv, to_latex, to_markdown
from sorl_verl.tables.cli import main
from sorl_verl.tables.table import column_for, select_step

REPO = Path(__file__).resolve().parents[2]


def write_run(
    root: Path,
    name: str,
    *,
    loss_mode="vanilla",
    adv="gae",
    model="/models/Qwen2.5-3B",
    records=(),
    config_at="config.yaml",
):
    """A run folder as the recipes write it: a resolved config and a FileLogger metrics JSONL.

    ``records`` are (step, {metric: value}) pairs, one JSON line each, in order.
    """
    run = root / name
    cfg = run / config_at
    cfg.parent.mkdir(parents=True, exist_ok=True)
    cfg.write_text(
        "actor_rollout_ref:\n  actor:\n    policy_loss:\n"
        f"      loss_mode: {loss_mode}\n"
        f"  model:\n    path: {model}\n"
        f"algorithm:\n  adv_estimator: {adv}\n"
        f"trainer:\n  experiment_name: {name}\n"
    )
    with open(run / "metrics-20250101-000000.jsonl", "w") as f:
        for step, data in records:
            f.write(json.dumps({"step": step, "data": data}) + "\n")
    return run


def val(scores: dict, var="reward", n=1):
    """val-core metrics named exactly as verl names them, plus aux metrics that must be ignored."""
    out = {}
    for source, value in scores.items():
        out[f"val-core/{source}/{var}/mean@{n}"] = value
        out[f"val-aux/{source}/{var}/std@{n}"] = 0.5
        out[f"val-aux/{source}/{var}/mean@{n}_extra"] = 0.9
    out["val-aux/num_turns/mean"] = 3.0
    return out


def train(step, clipfrac=0.1, grad=1.0):
    return {"actor/pg_clipfrac": clipfrac, "actor/grad_norm": grad, "actor/sorl/c_norm": 0.01 * step}


def test_method_names():
    assert method_name("vanilla", "gae") == "PPO"
    assert method_name("vanilla", "grpo") == "GRPO"
    assert method_name("turn_ppo", "gae") == "Turn-PPO"
    assert method_name("s_ppo", "gae") == "S-PPO"
    assert method_name("st_ppo", "gae") == "ST-PPO"
    assert method_name("gspo", "grpo") == "GSPO"
    assert method_name("so_ppo", "grpo") == "SO-GRPO"
    assert method_name("st_ppo", "turn_gae") == "ST-PPO (turn-GAE)"
    assert method_name("gspo", "rloo") == "gspo (rloo)"


def test_dataset_aliases_and_groups():
    assert column_for("2WikiMultihopQA").title == "2Wiki"
    assert column_for("medqa_us").group == "Medical"
    assert column_for("mmlu-med").title == "MMLU-Med"
    assert column_for("aime_2024").title == "AIME24"
    assert column_for("my_new_set").group == "Other" and column_for("my_new_set").title == "my_new_set"


def test_table_numbers_best_last_and_missing(tmp_path):
    ppo = write_run(
        tmp_path,
        "ppo",
        records=[
            (0, val({"nq": 0.10, "hotpotqa": 0.05, "triviaqa": 0.20})),
            (1, train(1)),
            (2, {**train(2), **val({"nq": 0.40, "hotpotqa": 0.30, "triviaqa": 0.50})}),  # best mean 0.4
            (3, {**train(3), **val({"nq": 0.35, "hotpotqa": 0.20, "triviaqa": 0.45})}),  # last
        ],
    )
    # so_ppo+grpo never validated triviaqa: its column must show '-' and its average too.
    sogrpo = write_run(
        tmp_path,
        "sogrpo",
        loss_mode="so_ppo",
        adv="grpo",
        records=[
            (0, val({"nq": 0.12, "hotpotqa": 0.08, "popqa": 0.1})),
            (2, val({"nq": 0.45, "hotpotqa": 0.25, "popqa": 0.3})),
        ],
    )
    runs = [load_run(ppo), load_run(sogrpo)]

    best = build_table(runs, "best")
    assert [c.title for c in best.columns] == ["NQ", "TriviaQA", "PopQA", "HotpotQA"]  # paper order, not log/alphabetic
    by_method = {r.method: r for r in best.rows}
    p = by_method["PPO"]
    assert p.step == 2
    assert {c.title: v for c, v in p.scores.items()} == {"NQ": 0.40, "TriviaQA": 0.50, "HotpotQA": 0.30}
    assert p.average is None  # PopQA never validated by this run
    assert by_method["SO-GRPO"].average is None

    last = build_table(runs, "last")
    p_last = next(r for r in last.rows if r.method == "PPO")
    assert p_last.step == 3 and {c.title: v for c, v in p_last.scores.items()} == {
        "NQ": 0.35,
        "TriviaQA": 0.45,
        "HotpotQA": 0.20,
    }

    md = to_markdown(best)
    lines = md.splitlines()
    header = next(line for line in lines if line.startswith("| Model"))
    assert header == "| Model | Method | Step | NQ | TriviaQA | PopQA | HotpotQA | Avg. |"
    sogrpo_line = next(line for line in lines if "SO-GRPO" in line)
    assert sogrpo_line == "| Qwen2.5-3B | SO-GRPO | 2 | **0.450** | - | **0.300** | 0.250 | - |"
    ppo_line = next(line for line in lines if "| PPO |" in line)
    assert ppo_line == "| Qwen2.5-3B | PPO | 2 | 0.400 | **0.500** | - | **0.300** | - |"
    assert "General QA: NQ, TriviaQA, PopQA; Multi-hop QA: HotpotQA" in md

    rows = list(csv.DictReader(io.StringIO(to_csv(best))))
    assert rows[0]["method"] == "PPO" and float(rows[0]["NQ"]) == 0.40 and rows[0]["step"] == "2"
    assert rows[1]["TriviaQA"] == "" and rows[1]["avg"] == "" and float(rows[1]["PopQA"]) == 0.3

    tex = to_latex(best)
    assert "\\multicolumn{3}{c}{General QA}" in tex and "\\multicolumn{1}{c}{Multi-hop QA}" in tex
    assert "\\cmidrule(lr){3-5} \\cmidrule(lr){6-6}" in tex
    assert "Qwen2.5-3B & SO-GRPO & \\textbf{0.450} & - & \\textbf{0.300} & 0.250 & - \\\\" in tex


def test_best_tie_takes_earliest_and_coverage_rule(tmp_path):
    run = load_run(
        write_run(
            tmp_path,
            "r",
            records=[
                (0, val({"nq": 0.2, "popqa": 0.2})),
                (5, val({"nq": 0.9})),  # partial validation: never a candidate, even though higher
                (10, val({"nq": 0.4, "popqa": 0.4})),
                (20, val({"nq": 0.3, "popqa": 0.5})),
                (30, val({"nq": 0.1, "popqa": 0.1})),
            ],
        )
    )
    assert select_step(run, "best") == 10
    assert select_step(run, "last") == 30
    assert build_table([run], "best").rows[0].average == pytest.approx(0.4)
    assert build_table([run], "last").rows[0].average == pytest.approx(0.1)


def test_acc_preferred_and_largest_n(tmp_path):
    run = load_run(
        write_run(
            tmp_path,
            "r",
            records=[
                (
                    0,
                    {
                        **val({"medqa": 0.9}, var="reward", n=4),
                        **val({"medqa": 0.6}, var="acc", n=4),
                        **val({"medqa": 0.1}, var="acc", n=2),
                    },
                ),
            ],
        )
    )
    assert run.validation == {"medqa": {0: 0.6}}


def test_duplicate_methods_keep_apart_and_models_group(tmp_path):
    a = write_run(tmp_path, "ppo-seed1", records=[(0, val({"nq": 0.1}))])
    b = write_run(tmp_path, "grpo-7b", adv="grpo", model="/m/Qwen2.5-7B-Instruct/", records=[(0, val({"nq": 0.3}))])
    c = write_run(tmp_path, "ppo-seed2", records=[(0, val({"nq": 0.2}))])
    table = build_table([load_run(x) for x in (a, b, c)])
    assert [(r.model, r.method) for r in table.rows] == [
        ("Qwen2.5-3B", "PPO [ppo-seed1]"),
        ("Qwen2.5-3B", "PPO [ppo-seed2]"),
        ("Qwen2.5-7B-Instruct", "GRPO"),
    ]


def test_resumed_run_merges_files_later_wins(tmp_path):
    run_dir = write_run(tmp_path, "r", records=[(0, val({"nq": 0.1})), (2, val({"nq": 0.2}))])
    # A relaunch writes its own file; it re-validates step 2 and continues.
    with open(run_dir / "metrics-20250102-000000.jsonl", "w") as f:
        f.write(json.dumps({"step": 2, "data": val({"nq": 0.25})}) + "\n")
        f.write(json.dumps({"step": 4, "data": val({"nq": 0.3})}) + "\n")
    run = load_run(run_dir)
    assert run.validation["nq"] == {0: 0.1, 2: 0.25, 4: 0.3}


def test_hydra_config_location_and_ignored_values(tmp_path):
    run_dir = write_run(
        tmp_path,
        "r",
        loss_mode="turn_ppo",
        config_at=".hydra/config.yaml",
        records=[
            (1, {"actor/pg_clipfrac": None, "note": "text", "flag": True, "actor/grad_norm": 2.0}),
        ],
    )
    run = load_run(run_dir)
    assert run.method == "Turn-PPO"
    assert run.steps == {1: {"actor/grad_norm": 2.0}}


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"step": 1, "data": {"a": 1}', "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"data": {"a": 1}}', "field 'step' must be an integer"),
        ('{"step": "3", "data": {}}', "field 'step' must be an integer"),
        ('{"step": 3, "data": 5}', "field 'data' must be an object"),
    ],
)
def test_malformed_jsonl_names_file_and_line(tmp_path, line, message):
    run_dir = write_run(tmp_path, "r", records=[(0, val({"nq": 0.1})), (1, train(1))])
    path = run_dir / "metrics-20250101-000000.jsonl"
    with open(path, "a") as f:
        f.write("\n" + line + "\n")  # a blank line (skipped) then the bad record on line 4
    with pytest.raises(RunError) as err:
        load_run(run_dir)
    assert f"{path}:4:" in str(err.value) and message in str(err.value)


def test_missing_pieces_are_clear_errors(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunError, match="no resolved config"):
        load_run(tmp_path / "empty")
    run_dir = write_run(tmp_path, "r", records=[])
    (run_dir / "metrics-20250101-000000.jsonl").unlink()
    with pytest.raises(RunError, match="no metrics JSONL"):
        load_run(run_dir)
    with pytest.raises(RunError, match="not a folder"):
        load_run(tmp_path / "nope")


def test_cli_writes_file_and_exit_code_on_error(tmp_path, capsys):
    run_dir = write_run(tmp_path, "r", records=[(0, val({"nq": 0.1})), (2, val({"nq": 0.3}))])
    out = tmp_path / "t" / "table.csv"
    assert main([str(run_dir), "--format", "csv", "--select", "last", "--out", str(out)]) == 0
    assert out.read_text().splitlines()[1].startswith("Qwen2.5-3B,PPO,r,2,0.3,0.3")
    (run_dir / "metrics-20250101-000000.jsonl").write_text("oops\n")
    assert main([str(run_dir)]) == 2
    assert "metrics-20250101-000000.jsonl:1: not valid JSON" in capsys.readouterr().err


def test_module_entry_point_runs(tmp_path):
    run_dir = write_run(tmp_path, "r", records=[(0, val({"bamboogle": 0.125}))])
    done = subprocess.run(
        [sys.executable, "-m", "sorl_verl.tables", str(run_dir), "--format", "markdown", "--digits", "2"],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    )
    assert "| Qwen2.5-3B | PPO | 0 | 0.12 | 0.12 |" in done.stdout


def test_plot_writes_png_with_stability_panels(tmp_path):
    records = [(0, val({"nq": 0.1, "hotpotqa": 0.05}))]
    records += [
        (
            s,
            {
                **train(s, clipfrac=0.1 + 0.01 * s),
                **(val({"nq": 0.1 + 0.02 * s, "hotpotqa": 0.05 + 0.02 * s}) if s % 5 == 0 else {}),
            },
        )
        for s in range(1, 41)
    ]
    a = write_run(tmp_path, "st", loss_mode="st_ppo", records=records)
    b = write_run(tmp_path, "ppo", records=[(s, {k: v * 0.8 for k, v in d.items()}) for s, d in records])
    png = tmp_path / "curves.png"
    assert main([str(a), str(b), "--plot", str(png), "--out", str(tmp_path / "t.md")]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from sorl_verl.tables.plot import plot_runs

    panels = plot_runs([load_run(a), load_run(b)], png)
    assert panels[0].startswith("Validation score")
    assert any("actor/sorl/c_norm" in p for p in panels)
    assert any("actor/pg_clipfrac" in p for p in panels) and any("actor/grad_norm" in p for p in panels)
    assert not any("Turn clip fraction" in p for p in panels)  # not logged: no empty panel
