"""`python -m sorl_verl.stability run` through verl's real trainer on a 1-run, 2-step grid.

One warm start (tiny model, 3 SFT steps), SO-GRPO at the demo's pressure, 8 trajectories per step:
the folder layout, the resume (a second call launches nothing), the table and figures from the
run's real metrics. Tables of several runs and methods (mean, spread, a method without turn
clipping) are checked on recorded runs in tests/stability/test_stability.py; that a token-level
loss logs no SORL metrics, in tests/algos/test_integration.py.
"""

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = [
    "--pressures", "reuse_1x2",
    "--methods", "so_grpo",
    "--seeds", "1",
    "--steps", "2",
    "--test-freq", "1",
    "--trajectories", "8",
    "--group-size", "2",
    "--env", "MAX_PROMPT_LENGTH=256",
    "--prepare-args", "--n-sft 40 --n-train 16 --n-val 8 --no-wiki --hidden-size 32 --num-layers 1 --sft-steps 3 --sft-batch-size 4",
]  # fmt: skip


def stability(out: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHON": sys.executable}
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-m", "sorl_verl.stability", "run", "--out", str(out), *TINY, *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=env, timeout=1500)


@pytest.mark.e2e
def test_stability_cli_run_resume_table_figure(tmp_path):
    out = tmp_path / "sweep"
    first = stability(out)
    assert first.returncode == 0, first.stderr[-3000:]
    names = ["reuse_1x2__so_grpo__s1"]
    assert sorted(p.name for p in (out / "runs").iterdir()) == names
    for name in names:
        run = out / "runs" / name
        assert (run / "model").is_symlink() and (run / "task").is_symlink()
        assert (run / "model").resolve() == (out / "warm_start" / "seed-1" / "model").resolve()
        assert (run / ".hydra" / "config.yaml").is_file() and (run / "summary.json").is_file()
        assert json.loads((run / "stability_done.json").read_text())["steps"] == 2
        assert len(list(run.glob("metrics-*.jsonl"))) == 1
    manifest = json.loads((out / "sweep.json").read_text())
    assert [r["status"] for r in manifest["runs"]] == ["finished"]

    metrics_before = sorted(str(p) for p in out.glob("runs/*/metrics-*.jsonl"))
    second = stability(out)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "1 finished, 0 to run" in second.stderr
    assert sorted(str(p) for p in out.glob("runs/*/metrics-*.jsonl")) == metrics_before  # nothing launched
    for name in names:
        assert len(json.loads((out / "runs" / name / "stability_run.json").read_text())["launches"]) == 1

    rows = list(csv.DictReader(io.StringIO((out / "stability.csv").read_text())))
    assert [(r["algo"], r["method"], r["seeds"]) for r in rows] == [("so_grpo", "SO-GRPO", "1")]
    for row in rows:
        assert 0.0 <= float(row["final_mean"]) <= 1.0 and 0.0 <= float(row["token_clip_mean"]) <= 1.0
    assert 0.0 <= float(rows[0]["turn_clip_mean"]) <= 1.0  # SO-GRPO logs its turn clipping
    per_run = list(csv.DictReader(io.StringIO((out / "stability_runs.csv").read_text())))
    assert [r["curve"].count(":") for r in per_run] == [3]  # validation at steps 0, 1, 2
    assert "| reuse_1x2 | SO-GRPO | 1 |" in (out / "stability.md").read_text()
    for figure in ("validation.png", "diagnostics.png"):
        assert (out / figure).read_bytes()[:4] == b"\x89PNG"
