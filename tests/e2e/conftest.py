"""Fixtures for the end-to-end runs of verl's real ``main_ppo`` on CPU (marked ``e2e``).

Each run is a subprocess (``python -m verl.trainer.main_ppo``) with the shared CPU overrides
(:func:`sorl_verl.platform.cpu_overrides.cpu_overrides`), the tiny model, a four-question
parquet, the ``search_r1`` loop (wrapped by ``mask_probe``) with the in-process retriever,
and verl's file logger. Its own Ray cluster lives under a private temp dir.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

QA = [
    ("What is the capital of France?", ["Paris"]),
    ("Who wrote Hamlet?", ["William Shakespeare", "Shakespeare"]),
    ("What is the largest planet in the Solar System?", ["Jupiter"]),
    ("What is the chemical symbol of gold?", ["Au"]),
]
SEARCH_TAGS = (
    "<search>",
    "</search>",
    "<answer>",
    "</answer>",
    "<information>",
    "</information>",
    "<think>",
    "</think>",
)
PROMPT = (
    "Answer the given question. You can search with <search> query </search> and you will get "
    "results between <information> and </information>. Give the final answer as <answer> x </answer>. "
    "Question: {question}"
)
AGENT_CONFIG = """\
- name: search_r1_probe
  _target_: mask_probe.MaskProbeAgentLoop
  retriever: embedded
  topk: 2
  max_turns: 2
  max_obs_length: 48
  max_tokens_per_turn: 24
"""


@dataclass
class RunResult:
    returncode: int
    wall_s: float
    metrics: list[dict]  # verl file logger lines: {"step": int, "data": {...}}
    probes: list[dict]  # mask_probe records
    log: str
    out_dir: Path

    def step_metrics(self) -> dict[int, dict]:
        return {line["step"]: line["data"] for line in self.metrics}


@pytest.fixture(scope="session")
def e2e_assets(tmp_path_factory):
    import pandas as pd

    from sorl_verl.models import build_tiny_model

    root = tmp_path_factory.mktemp("e2e_assets")
    rows = [
        {
            "data_source": "nq",
            "prompt": [{"role": "user", "content": PROMPT.format(question=q)}],
            "ability": "fact-reasoning",
            "reward_model": {"style": "rule", "ground_truth": {"target": answers}},
            "extra_info": {"index": i, "split": "train", "question": q},
            "agent_name": "search_r1_probe",
        }
        for i, (q, answers) in enumerate(QA)
    ]
    pd.DataFrame(rows).to_parquet(root / "train.parquet")
    pd.DataFrame(rows[:2]).to_parquet(root / "val.parquet")
    model = build_tiny_model(
        root / "model",
        texts=[PROMPT.format(question=q) for q, _ in QA],
        extra_tokens=("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", *SEARCH_TAGS),
        seed=0,
    )
    (root / "agent.yaml").write_text(AGENT_CONFIG, encoding="utf-8")
    return root, model


def run_main_ppo(assets, out_dir: Path, overrides: list[str], timeout_s: int = 600) -> RunResult:
    """Run verl's trainer for 2 GRPO-sized steps on CPU; never raises on a failed run."""
    from sorl_verl.platform.cpu_overrides import cpu_overrides

    root, model = assets
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics_path, probe_path = out_dir / "metrics.jsonl", out_dir / "probe.jsonl"
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)  # never join someone else's cluster
    env.update(
        RAY_AUTH_MODE="disabled",
        # a private, short Ray temp dir (AF_UNIX socket paths are limited to 107 bytes)
        RAY_TMPDIR=tempfile.mkdtemp(prefix="sorl_ray_", dir="/tmp"),
        VERL_FILE_LOGGER_PATH=str(metrics_path),
        SORL_E2E_PROBE_PATH=str(probe_path),
        PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), env.get("PYTHONPATH")])),
        HYDRA_FULL_ERROR="1",
        TOKENIZERS_PARALLELISM="false",
    )
    command = [
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        *cpu_overrides(num_workers=1),
        f"data.train_files={root / 'train.parquet'}",
        f"data.val_files={root / 'val.parquet'}",
        "data.train_batch_size=2",
        "data.max_prompt_length=160",
        "data.max_response_length=160",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.rollout.n=2",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={root / 'agent.yaml'}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "critic.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "critic.optim.lr=1e-3",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "algorithm.use_kl_in_reward=False",
        f"reward.custom_reward_function.path={HERE / 'e2e_reward.py'}",
        "reward.custom_reward_function.name=compute_score",
        "trainer.logger=[console,file]",
        "trainer.total_training_steps=2",
        "trainer.total_epochs=1",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=2",
        "actor_rollout_ref.actor.checkpoint.save_contents=[model,hf_model]",
        f"trainer.default_local_dir={out_dir / 'ckpt'}",
        "trainer.project_name=sorl_e2e",
        f"trainer.experiment_name={out_dir.name}",
        *overrides,
    ]
    start = time.monotonic()
    try:
        proc = subprocess.run(
            command,
            cwd=out_dir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout_s,
        )
        returncode, log = proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as expired:
        returncode, log = (
            -1,
            (expired.stdout or b"").decode(errors="replace")
            if isinstance(expired.stdout, bytes)
            else (expired.stdout or ""),
        )
    wall_s = time.monotonic() - start
    shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)
    (out_dir / "log.txt").write_text(log, encoding="utf-8")

    def read_jsonl(path: Path) -> list[dict]:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []

    print(f"[e2e] {out_dir.name}: rc={returncode} wall={wall_s:.1f}s")
    return RunResult(returncode, wall_s, read_jsonl(metrics_path), read_jsonl(probe_path), log, out_dir)


@pytest.fixture(scope="session")
def main_ppo():
    """:func:`run_main_ppo` (fixtures, because tests/ is not an importable package)."""
    return run_main_ppo
