"""Step 4 of the quick start: turn a finished (or resumed) run folder into its report.

Reads the run with :func:`sorl_verl.tables.load_run` (``metrics-*.jsonl``, one per launch,
merged in launch order, and Hydra's ``.hydra/config.yaml``), plus ``prepare.json`` and
``launches.jsonl``; writes ``config_resolved.yaml``, ``plots/curves.png`` and
``summary.json``/``summary.txt``; returns the printed table.

Wall time: ``run_demo.sh`` appends one ``{"started_at", "ended_at"}`` line per finished
launch to ``launches.jsonl`` (its exit trap; ``python -m sorl_verl.quickstart cleanup``
adds the line of a launch that was killed with SIGKILL). The summary's wall time is the
sum over those launches plus the current one (``--started-at`` to now).
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict
from pathlib import Path

from sorl_verl.fileio import write_text_atomic
from sorl_verl.quickstart.report import (
    STALENESS_MEAN,
    TRAIN_REWARD,
    TRAIN_TURNS,
    format_table,
    model_turns,
    summarize,
)
from sorl_verl.tables.plot import Derived

LAUNCHES = "launches.jsonl"
# drawn after the validation and stability panels of sorl_verl.tables.plot
EXTRA_PANELS = [
    ("Training reward (rollouts)", [TRAIN_REWARD]),
    # the summary's model turns (verl's num_turns also counts the user turn and the observations)
    ("Model turns per trajectory (rollouts)", [re.escape(TRAIN_TURNS)], Derived("{metric} / 2", model_turns)),
    # asynchronous trainers only (a panel nobody logged is left out)
    ("Turn staleness, mean (trained batch)", [STALENESS_MEAN]),
]


def checkpoints(run_dir: Path) -> list[Path]:
    ckpt_root = run_dir / "checkpoints"
    found = [p for p in ckpt_root.glob("global_step_*") if p.is_dir()] if ckpt_root.is_dir() else []
    return sorted(found, key=lambda p: int(p.name.rsplit("_", 1)[-1]))


def read_launches(run_dir: Path) -> list[dict]:
    """The finished launches recorded in ``launches.jsonl`` (a malformed line raises naming it)."""
    path = run_dir / LAUNCHES
    if not path.is_file():
        return []
    launches = []
    for line_number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            start, end = float(record["started_at"]), float(record["ended_at"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{path}:{line_number}: not a launch record ({e})") from None
        launches.append({**record, "started_at": start, "ended_at": end})
    return launches


def record_launch(run_dir: Path, started_at: float, ended_at: float, **extra) -> None:
    """Append one launch to ``launches.jsonl`` (rewritten atomically)."""
    path = Path(run_dir) / LAUNCHES
    old = path.read_text(encoding="utf-8") if path.is_file() else ""
    if old and not old.endswith("\n"):
        old += "\n"
    line = json.dumps({"started_at": round(started_at, 1), "ended_at": round(ended_at, 1), **extra})
    write_text_atomic(path, old + line + "\n")


def wall_seconds(run_dir: Path, started_at: float | None, now: float | None = None) -> float | None:
    """Seconds over every recorded launch, plus the current one when ``started_at`` is given."""
    launches = read_launches(run_dir)
    if started_at is None and not launches:
        return None
    total = sum(max(0.0, r["ended_at"] - r["started_at"]) for r in launches)
    if started_at is not None:
        total += max(0.0, (time.time() if now is None else now) - started_at)
    return total


def write_resolved_config(run_dir: Path, config_file: Path) -> str:
    """``config_resolved.yaml`` from Hydra's composed config, interpolations resolved."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(config_file)
    try:
        text = OmegaConf.to_yaml(cfg, resolve=True)
        note = "written"
    except Exception as e:  # an interpolation only verl's process can resolve: keep the composed one
        text = OmegaConf.to_yaml(cfg)
        note = f"written unresolved ({type(e).__name__}: {e})"
    write_text_atomic(run_dir / "config_resolved.yaml", text)
    return note


def report_run(run_dir: str | os.PathLike, algo: str | None = None, started_at: float | None = None) -> str:
    from sorl_verl.tables import load_run
    from sorl_verl.tables.plot import plot_runs

    run_dir = Path(run_dir)
    if not any(run_dir.glob("metrics*.jsonl")):
        raise FileNotFoundError(
            f"{run_dir}: no metrics*.jsonl (did the trainer run with trainer.logger=[console,file]?)"
        )
    run = load_run(run_dir)
    algo = algo or run_dir.name.split("-")[0]
    panels = plot_runs([run], run_dir / "plots" / "curves.png", extra_panels=EXTRA_PANELS)
    config_note = write_resolved_config(run_dir, run.config_file)
    summary = summarize(run)
    prepare_info = {}
    if (run_dir / "prepare.json").is_file():
        prepare_info = json.loads((run_dir / "prepare.json").read_text(encoding="utf-8"))
    ckpts = checkpoints(run_dir)
    train_steps = [s for s, m in run.steps.items() if TRAIN_REWARD in m]
    wall = wall_seconds(run_dir, started_at)
    launches = len(read_launches(run_dir)) + (started_at is not None)

    rows = [("algorithm", f"{algo} ({run.method})"), ("run folder", str(run_dir))]
    if prepare_info:
        guesses, early = prepare_info.get("sft_guess_examples"), prepare_info.get("sft_early_examples")
        mix = f", {guesses} of them guessing" if guesses is not None else ""
        mix += f", {early} of them answering early" if early is not None else ""
        rows.append(
            ("model", f"{prepare_info['n_params']:,} parameters, SFT on {prepare_info['sft_examples']} demos{mix}")
        )
    rows.append(("training steps logged", str(len(train_steps))))
    rows += summary.rows()
    rows.append(("checkpoint", str(ckpts[-1].relative_to(run_dir)) if ckpts else "none saved"))
    if wall is not None:
        rows.append(("wall time", f"{wall / 60:.1f} min over {launches} launch{'es' if launches != 1 else ''}"))
    rows.append(("plots", f"{(run_dir / 'plots' / 'curves.png')} ({len(panels)} panels)"))
    table = format_table(rows)

    record = {
        "algo": algo,
        "method": run.method,
        "summary": asdict(summary),
        "train_steps": len(train_steps),
        "metrics_files": [p.name for p in run.metrics_files],
        "plots": {"curves.png": panels},
        "config_resolved": config_note,
        "checkpoints": [str(p.relative_to(run_dir)) for p in ckpts],
        "prepare": prepare_info,
        "launches": launches,
        "wall_seconds": None if wall is None else round(wall, 1),
    }
    for name, text in (("summary.json", json.dumps(record, indent=2) + "\n"), ("summary.txt", table + "\n")):
        write_text_atomic(run_dir / name, text)
    return table
