"""Step time of the quick start's batch: verl's synchronous trainer vs ``sorl_colocate_async``, on CPU.

    python benchmarks/bench_async_step.py OUT_DIR [--prepared RUN_DIR] [--steps 6] [--algo so_grpo]

One warm start (made by the first run, the demo's defaults; or taken from an existing demo run
folder given with ``--prepared``) shared by ``OUT_DIR/sync`` and ``OUT_DIR/async``:
``examples/quickstart/run_demo.sh`` for ``--steps`` steps in each, back to back, with no
validation and no checkpoints: ``trainer.v1.trainer_mode=sync`` and ``sorl_colocate_async``
(one batch generated ahead; the next batch's unfinished requests are aborted when sampling ends
and continued after the update). Reported per mode, means over steps 2..N (step 1 includes the
warm-up batch): verl's ``timing_s/step``, ``timing_s/gen`` (waiting for the batch),
``timing_s/update_actor``, ``timing_s/update_weights``, and the staleness of the trained data.

The two runs share the machine with whatever else runs on it: read the figures side by side,
not against other runs; the 1-minute load before and after each run is printed, and
``--order async,sync`` swaps the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from sorl_verl.tables.runs import find_metrics_files, read_metrics

REPO = Path(__file__).resolve().parents[1]
MODES = {"sync": "sync", "async": "sorl_colocate_async"}
PREPARED = ("task", "model", "prepare.json")
COLUMNS = [
    ("step s", "timing_s/step"),
    ("gen s", "timing_s/gen"),
    ("update_actor s", "timing_s/update_actor"),
    ("update_weights s", "timing_s/update_weights"),
    ("staleness max", "actor/sorl/turn_staleness_max"),
    ("mixed-version share", "actor/sorl/mixed_version_share"),
]


def run_mode(source: Path | None, run_dir: Path, mode: str, steps: int, algo: str) -> dict[int, dict[str, float]]:
    """One demo run in ``run_dir``, from the warm start in ``source`` (None: the demo prepares its own)."""
    if run_dir.exists():
        raise SystemExit(f"error: {run_dir} exists; give a new OUT_DIR")
    run_dir.mkdir(parents=True)
    if source is not None:
        missing = [name for name in PREPARED if not (source / name).exists()]
        if missing:
            raise SystemExit(f"error: {source} is not a prepared demo folder (missing {', '.join(missing)})")
        for name in PREPARED:
            copy = shutil.copytree if (source / name).is_dir() else shutil.copy2
            copy(source / name, run_dir / name)
    env = {**os.environ, **demo_settings(source), "STEPS": str(steps), "SAVE_FREQ": "-1", "TEST_FREQ": "-1"}
    command = [
        "bash", str(REPO / "examples" / "quickstart" / "run_demo.sh"), algo, "--out", str(run_dir),
        f"trainer.v1.trainer_mode={mode}", "trainer.val_before_train=False",
    ]  # fmt: skip
    print(f"== {mode}: {' '.join(command[2:])}", file=sys.stderr)
    # the demo's report step may complain that there is no validation score: only the
    # trainer's metrics matter here, so the run is judged by the steps it logged
    done = subprocess.run(command, env=env, check=False)
    if not list(run_dir.glob("metrics*.jsonl")):
        raise SystemExit(f"error: the {mode} run logged no metrics (exit {done.returncode}); see its output above")
    metrics = read_metrics(find_metrics_files(run_dir))
    if sorted(s for s in metrics if s >= 1)[-1:] != [steps]:
        raise SystemExit(f"error: {mode} run stopped early (exit {done.returncode}); see {run_dir / 'train.log'}")
    return metrics


# run_demo.sh's variables for the prepare settings recorded in prepare.json (its prepare step
# refuses a folder prepared with other settings)
_DEMO_ENV = {"guess_fraction": "DEMO_MIX", "topk": "TOPK", "max_obs_length": "MAX_OBS_LENGTH", "seed": "PREPARE_SEED"}


def demo_settings(source: Path | None) -> dict[str, str]:
    if source is None:
        return {}
    recorded = json.loads((source / "prepare.json").read_text(encoding="utf-8")).get("config", {})
    return {env: str(recorded[key]) for key, env in _DEMO_ENV.items() if key in recorded}


def summarize(steps: dict[int, dict[str, float]]) -> dict[str, float | None]:
    later = [steps[s] for s in sorted(steps) if s >= 2]
    row = {}
    for _, key in COLUMNS:
        values = [data[key] for data in later if key in data]
        row[key] = statistics.fmean(values) if values else None
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="a new folder for the warm start copies and both runs")
    parser.add_argument("--prepared", type=Path, help="an existing demo run folder (task/, model/, prepare.json)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--algo", default="so_grpo")
    parser.add_argument("--order", default="sync,async", help="the order of the two runs (load drifts on a shared machine)")
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be at least 2 (step 1 is excluded from the means)")
    order = args.order.split(",")
    if sorted(order) != sorted(MODES):
        parser.error(f"--order must name {', '.join(MODES)} once each")
    rows, loads = {}, {}
    source = args.prepared
    for name in order:
        before = os.getloadavg()[0]
        rows[name] = summarize(run_mode(source, args.out / name, MODES[name], args.steps, args.algo))
        loads[name] = (before, os.getloadavg()[0])
        source = source or args.out / name  # the first run's warm start is reused by the second
    print(f"\n{args.algo}, {args.steps} steps, means over steps 2..{args.steps}")
    print("| mode | " + " | ".join(label for label, _ in COLUMNS) + " | load avg before -> after |")
    print("|---|" + "---|" * (len(COLUMNS) + 1))
    for name, row in rows.items():
        cells = ["-" if row[key] is None else f"{row[key]:.2f}" for _, key in COLUMNS]
        load = "{:.1f} -> {:.1f}".format(*loads[name])
        print(f"| {name} ({MODES[name]}) | " + " | ".join(cells) + f" | {load} |")


if __name__ == "__main__":
    main()
