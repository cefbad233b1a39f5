"""Step 4 of the quick start: turn a finished (or resumed) run folder into its report.

Reads ``metrics-*.jsonl`` (one per launch, in name order = launch order), ``prepare.json``
and Hydra's ``.hydra/config.yaml``; writes ``config_resolved.yaml``, ``plots/*.png`` and
``summary.json``/``summary.txt``; returns the printed table.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path

from sorl_verl.fileio import write_text_atomic
from sorl_verl.quickstart.report import format_table, load_metrics, summarize, write_plots


def metrics_files(run_dir: Path) -> list[Path]:
    return sorted(run_dir.glob("metrics*.jsonl"))


def checkpoints(run_dir: Path) -> list[Path]:
    ckpt_root = run_dir / "checkpoints"
    found = [p for p in ckpt_root.glob("global_step_*") if p.is_dir()] if ckpt_root.is_dir() else []
    return sorted(found, key=lambda p: int(p.name.rsplit("_", 1)[-1]))


def write_resolved_config(run_dir: Path) -> str:
    """``config_resolved.yaml`` from Hydra's composed config, interpolations resolved."""
    from omegaconf import OmegaConf

    source = run_dir / ".hydra" / "config.yaml"
    if not source.is_file():
        return f"not written: {source} is missing"
    cfg = OmegaConf.load(source)
    try:
        text = OmegaConf.to_yaml(cfg, resolve=True)
        note = "written"
    except Exception as e:  # an interpolation only verl's process can resolve: keep the composed one
        text = OmegaConf.to_yaml(cfg)
        note = f"written unresolved ({type(e).__name__}: {e})"
    write_text_atomic(run_dir / "config_resolved.yaml", text)
    return note


def report_run(run_dir: str | os.PathLike, algo: str | None = None, started_at: float | None = None) -> str:
    run_dir = Path(run_dir)
    files = metrics_files(run_dir)
    if not files:
        raise FileNotFoundError(f"{run_dir}: no metrics*.jsonl (did the trainer run with trainer.logger=[console,file]?)")
    history = load_metrics(files)
    algo = algo or run_dir.name.split("-")[0]
    plots = write_plots(history, run_dir / "plots", title_prefix=f"{algo}: ")
    config_note = write_resolved_config(run_dir)
    summary = summarize(history)
    prepare_info = {}
    if (run_dir / "prepare.json").is_file():
        prepare_info = json.loads((run_dir / "prepare.json").read_text(encoding="utf-8"))
    ckpts = checkpoints(run_dir)
    train_steps = [s for s, m in history.items() if "critic/score/mean" in m]

    rows = [("algorithm", algo), ("run folder", str(run_dir))]
    if prepare_info:
        rows.append(("model", f"{prepare_info['n_params']:,} parameters, SFT on {prepare_info['sft_examples']} demos"))
    rows.append(("training steps logged", str(len(train_steps))))
    rows += summary.rows()
    rows.append(("checkpoint", str(ckpts[-1].relative_to(run_dir)) if ckpts else "none saved"))
    if started_at is not None:
        rows.append(("wall time", f"{(time.time() - started_at) / 60:.1f} min"))
    table = format_table(rows)

    record = {
        "algo": algo,
        "summary": asdict(summary),
        "train_steps": len(train_steps),
        "metrics_files": [p.name for p in files],
        "plots": plots,
        "config_resolved": config_note,
        "checkpoints": [str(p.relative_to(run_dir)) for p in ckpts],
        "prepare": prepare_info,
        "wall_seconds": None if started_at is None else round(time.time() - started_at, 1),
    }
    for name, text in (("summary.json", json.dumps(record, indent=2) + "\n"), ("summary.txt", table + "\n")):
        write_text_atomic(run_dir / name, text)
    skipped = [f"  {name}: {why}" for name, why in plots.items() if why != "written"]
    if skipped:
        table += "\nplots not drawn:\n" + "\n".join(skipped)
    return table
