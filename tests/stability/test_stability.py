"""The stability benchmark's grid, skip/resume logic, table and figures, on synthetic run folders (fast).

The launcher is replaced by a fake that writes what run_demo.sh writes (Hydra config, FileLogger
metrics, verl's checkpoint tracker) for a chosen validation curve; the real trainer runs in
tests/e2e/test_stability_cli_cpu.py.
"""

import csv
import io
import json
import os
from pathlib import Path

import pytest

from sorl_verl.stability.analysis import (
    ArchiveError,
    RunResult,
    archived_results,
    area_under_curve,
    is_collapsed,
    load_results,
    mixed_warm_starts,
)
from sorl_verl.stability.cli import main
from sorl_verl.stability.grid import PRESSURES, QUICK, Budget, Pressure, RunSpec, build_grid, prepare_args
from sorl_verl.stability.report import plot_task_validation, task_panels, write_report
from sorl_verl.stability.sweep import (
    DONE_MARKER,
    RUN_RECORD,
    SweepError,
    archived_names,
    launch_env,
    launcher_knobs,
    run_status,
    run_sweep,
    warm_dir,
)

LOSS = {
    "grpo": ("vanilla", "grpo"),
    "so_grpo": ("so_ppo", "grpo"),
    "ppo": ("vanilla", "gae"),
    "st_ppo": ("st_ppo", "gae"),
    "ppo_turn_gae": ("vanilla", "turn_gae"),
    "st_ppo_turn_gae": ("st_ppo", "turn_gae"),
}


# ---------------------------------------------------------------- the grid


def test_default_grid_is_every_pressure_method_seed_in_seed_major_order():
    runs = build_grid()
    assert len(runs) == len(PRESSURES) * 8 * 3 == 144  # 6 pressures x 8 methods x 3 seeds
    assert len({r.name for r in runs}) == 144
    assert {r.task for r in runs} == {"search"}
    assert [r.seed for r in runs] == sorted(r.seed for r in runs)  # seed 1's cells first
    assert runs[0].name == "reuse_1x2__grpo__s1"


@pytest.mark.parametrize(
    "pressure,method,expected",
    [
        ("reuse_1x2", "grpo", (8, 4, 32)),  # the demo's: 8 prompts x 8 samples, 2 mini-batches
        ("reuse_4x4", "so_grpo", (8, 2, 16)),
        ("reuse_8x8", "gspo", (8, 1, 8)),
        ("reuse_1x2", "ppo", (64, 32, 32)),  # critic family: 64 prompts x 1 sample
        ("reuse_8x8", "st_ppo", (64, 8, 8)),
    ],
)
def test_batch_sizes_keep_64_trajectories_and_split_into_mini_batches(pressure, method, expected):
    spec = RunSpec(PRESSURES[pressure], method, 1)
    train, mini, micro = spec.batch()
    assert (train, mini, micro) == expected
    per_prompt = 8 if method in ("grpo", "so_grpo", "gspo") else 1
    assert train * per_prompt == 64
    assert mini * per_prompt == micro  # one micro-batch per mini-batch, as the demo
    env = spec.env()
    assert env["TRAIN_BATCH_SIZE"] == str(train) and env["PPO_MINI_BATCH_SIZE"] == str(mini)
    assert env["LOG_PROB_MICRO_BATCH_PER_GPU"] == "64"  # one log-prob pass per step
    assert (
        RunSpec(PRESSURES["reuse_1x2"], method, 1, Budget(trajectories=8, group_size=2)).env()[
            "LOG_PROB_MICRO_BATCH_PER_GPU"
        ]
        == "8"
    )
    assert f"actor_rollout_ref.actor.ppo_epochs={PRESSURES[pressure].ppo_epochs}" in spec.overrides()


def test_pressure_learning_rate_and_budget_extras_reach_the_launcher():
    budget = Budget(
        steps=7, env=(("MAX_TURNS", "3"),), overrides=("trainer.test_freq=1",), prepare_args=("--n-val", "32")
    )
    spec = RunSpec(PRESSURES["lr_5e-4"], "so_grpo", 2, budget)
    env = spec.env()
    assert env["ACTOR_LR"] == "0.0005" and env["STEPS"] == "7" and env["SEED"] == "2" and env["MAX_TURNS"] == "3"
    assert env["PREPARE_ARGS"] == "--n-val 32"
    assert spec.overrides()[-1] == "trainer.test_freq=1"  # the user's overrides come last and win
    assert "ACTOR_LR" not in RunSpec(PRESSURES["reuse_4x4"], "grpo", 1).env()  # the launcher's default


def test_prepare_args_follow_what_run_demo_passes():
    assert prepare_args(3, Budget()) == ["--task", "search", "--seed", "3"]
    budget = Budget(env=(("TOPK", "2"),), prepare_args=("--sft-steps", "50"))
    assert prepare_args(1, budget, "multihop") == [
        "--task",
        "multihop",
        "--seed",
        "1",
        "--topk",
        "2",
        "--sft-steps",
        "50",
    ]
    shared = Budget(env=(("PREPARE_SEED", "7"), ("DEMO_MIX", "0.25")))  # one warm start for every RL seed
    assert prepare_args(3, shared) == ["--task", "search", "--seed", "7", "--demo-mix", "0.25"]


def test_task_is_part_of_a_runs_identity_and_environment():
    search = RunSpec(PRESSURES["reuse_8x8"], "ppo", 1)
    multihop = RunSpec(PRESSURES["reuse_8x8"], "ppo", 1, task="multihop")
    assert search.name == "reuse_8x8__ppo__s1"  # the default task's names predate the task axis
    assert multihop.name == "multihop__reuse_8x8__ppo__s1"
    assert multihop.env()["TASK"] == "multihop" and search.env()["TASK"] == "search"
    assert multihop.record()["task"] == "multihop" and "task" not in search.record()
    runs = build_grid(pressures=["reuse_8x8"], methods=["ppo", "grpo"], seeds=[1, 2], tasks=["multihop", "medical"])
    assert [(r.seed, r.task, r.method) for r in runs] == [
        (s, t, m) for s in (1, 2) for t in ("multihop", "medical") for m in ("ppo", "grpo")
    ]
    with pytest.raises(ValueError, match="unknown task 'math'.*medical, multihop, multihop_long, search"):
        build_grid(tasks=["math"])  # the math task has its own launcher


def test_method_variants_run_their_algo_with_the_variant_settings():
    absolute = RunSpec(PRESSURES["reuse_8x8"], "s_ppo+absolute", 1)
    sequence = RunSpec(PRESSURES["reuse_8x8"], "s_ppo+sequence", 1)
    assert absolute.algo == sequence.algo == "s_ppo"
    assert absolute.env()["SORL_NORMALIZATION"] == "absolute"
    assert "+actor_rollout_ref.actor.policy_loss.norm_scope=sequence" in sequence.overrides()
    assert "SORL_NORMALIZATION" not in sequence.env()
    assert RunSpec(PRESSURES["reuse_8x8"], "cispo", 1).batch() == (8, 1, 8)  # critic-free: groups of 8


def test_grid_errors_name_the_problem():
    with pytest.raises(ValueError, match="unknown pressure.*stale_k9"):
        build_grid(pressures=["stale_k9"])
    with pytest.raises(ValueError, match="unknown method.*dapo"):
        build_grid(methods=["dapo"])
    with pytest.raises(ValueError, match="3 prompts per step do not split into 2 mini-batches"):
        build_grid(pressures=["reuse_1x2"], methods=["grpo"], seeds=[1], budget=Budget(trajectories=24))
    with pytest.raises(ValueError, match="multiple of group_size"):
        Budget(trajectories=20, group_size=8)
    with pytest.raises(ValueError, match="spaces"):
        Budget(prepare_args=("--n-val 3",))
    with pytest.raises(ValueError, match="seeds repeated"):
        build_grid(seeds=[1, 1])


@pytest.mark.parametrize("k", [2, 8])
def test_stale_pressure_runs_the_async_trainer_k_batches_ahead_without_dropping(k):
    spec = RunSpec(PRESSURES[f"stale_k{k}"], "so_grpo", 1)
    overrides = spec.overrides()
    assert "trainer.v1.trainer_mode=sorl_colocate_async" in overrides
    assert f"trainer.v1.colocate_async.num_warmup_batches={k}" in overrides
    # a trajectory k versions old spans k + 1 versions: a bound of k would drop exactly the data wanted
    assert f"trainer.v1.sampler.max_off_policy_threshold={k + 1}" in overrides
    # the ratio's old policy is the one that sampled (run_demo.sh turns this into verl's bypass_mode)
    assert spec.env()["OLD_LOG_PROBS"] == "rollout"
    assert spec.batch() == (8, 4, 32)  # the demo's batch: staleness is the only change


@pytest.mark.parametrize("pressure", ["reuse_1x2", "reuse_8x8", "lr_5e-4"])
def test_synchronous_pressures_recompute_the_old_policy(pressure):
    """The demo's default takes the rollout's log-probs; the sweep's synchronous runs are plain PPO."""
    assert RunSpec(PRESSURES[pressure], "ppo", 1).env()["OLD_LOG_PROBS"] == "recompute"
    with pytest.raises(ValueError, match="old_log_probs"):
        Pressure("p", "bad", old_log_probs="stale")


def test_a_new_pressure_is_one_entry():
    """The stale-rollout axis (the async trainers) plugs in as a Pressure with its own overrides."""
    stale = Pressure(
        "stale_k2", "rollouts 2 versions old", overrides=("trainer.v1.sampler.max_off_policy_threshold=2",)
    )
    (spec,) = build_grid(pressures=["stale_k2"], methods=["grpo"], seeds=[1], registry={"stale_k2": stale})
    assert spec.name == "stale_k2__grpo__s1"
    assert "trainer.v1.sampler.max_off_policy_threshold=2" in spec.overrides()
    with pytest.raises(ValueError, match="pressure name"):
        Pressure("bad name", "x")


# ---------------------------------------------------------------- synthetic runs


def warm_start(sweep: Path, seed: int, task: str = "search") -> None:
    """A prepared warm start, so the sweep skips `prepare` (the real one takes minutes)."""
    warm = warm_dir(sweep, seed, task)
    for name in ("task", "model"):
        (warm / name).mkdir(parents=True, exist_ok=True)
    (warm / "prepare.json").write_text(json.dumps({"config": {"seed": seed}}))


def write_fake_run(
    folder: Path, spec: RunSpec, curve: dict[int, float], clip: float = 0.1, sorl: bool = False, upto=None
) -> None:
    """What run_demo.sh leaves in a run folder, for a validation curve ``{step: score}``."""
    loss, adv = LOSS[spec.method]
    hydra = folder / ".hydra"
    hydra.mkdir(parents=True, exist_ok=True)
    (hydra / "config.yaml").write_text(
        f"actor_rollout_ref:\n  actor:\n    policy_loss:\n      loss_mode: {loss}\n  model:\n    path: {folder}/model\n"
        f"algorithm:\n  adv_estimator: {adv}\ntrainer:\n  experiment_name: {spec.name}\n"
    )
    last = spec.budget.steps if upto is None else upto
    with open(folder / f"metrics-{len(list(folder.glob('metrics-*.jsonl'))):04d}.jsonl", "w") as f:
        for step in range(last + 1):
            data = {}
            if step in curve:
                data["val-core/quickstart/acc/mean@1"] = curve[step]
            if step:
                data["actor/pg_clipfrac"] = clip
                if sorl:
                    data |= {
                        "actor/sorl/clipfrac_turn": clip / 2,
                        "actor/sorl/c_norm": 0.01 * step,
                        "actor/sorl/norm_scale": 0.9,
                    }
            f.write(json.dumps({"step": step, "data": data}) + "\n")
    ckpt = folder / "checkpoints"
    ckpt.mkdir(exist_ok=True)
    (ckpt / "latest_checkpointed_iteration.txt").write_text(str(last))


class FakeLauncher:
    """Records its calls; writes a run for each, or fails the ones named in ``fail``."""

    def __init__(self, curves=None, fail=(), sorl=()):
        self.calls: list[str] = []
        self.curves = curves or {}
        self.fail = set(fail)
        self.sorl = set(sorl)

    def __call__(self, spec: RunSpec, folder: Path) -> int:
        self.calls.append(spec.name)
        # run_demo.sh's prepare step finds the copied prepare.json; the links point at the warm start
        assert (folder / "prepare.json").is_file() and (folder / "task").is_symlink()
        if spec.name in self.fail:
            write_fake_run(folder, spec, {0: 0.5}, upto=1)  # died after step 1
            return 1
        curve = self.curves.get(spec.name, {0: 0.2, 2: 0.3, 4: 0.4})
        write_fake_run(folder, spec, curve, sorl=spec.method in self.sorl)
        return 0


def small_grid(methods=("grpo", "so_grpo"), seeds=(1,), steps=4, tasks=("search",)):
    return build_grid(
        pressures=["reuse_1x2"],
        methods=list(methods),
        seeds=list(seeds),
        budget=Budget(steps=steps, test_freq=2),
        tasks=list(tasks),
    )


def quiet(_line):
    pass


def test_sweep_runs_each_folder_once_and_a_second_call_runs_nothing(tmp_path):
    specs = small_grid()
    warm_start(tmp_path, 1)
    launcher = FakeLauncher()
    outcomes = run_sweep(tmp_path, specs, launch=launcher, log=quiet)
    assert [o.status for o in outcomes] == ["finished", "finished"]
    assert launcher.calls == ["reuse_1x2__grpo__s1", "reuse_1x2__so_grpo__s1"]
    for spec in specs:
        folder = tmp_path / "runs" / spec.name
        assert os.readlink(folder / "model") == os.path.join("..", "..", "warm_start", "seed-1", "model")
        done = json.loads((folder / DONE_MARKER).read_text())
        assert done["steps"] == 4 and done["launches"] == 1
        record = json.loads((folder / RUN_RECORD).read_text())
        assert record["env"]["SEED"] == "1" and record["launches"][0]["status"] == 0
    manifest = json.loads((tmp_path / "sweep.json").read_text())
    assert [r["status"] for r in manifest["runs"]] == ["finished", "finished"]
    assert manifest["grid"]["methods"] == ["grpo", "so_grpo"] and manifest["grid"]["budget"]["steps"] == 4

    again = FakeLauncher()
    outcomes = run_sweep(tmp_path, specs, launch=again, log=quiet)
    assert again.calls == [] and [o.status for o in outcomes] == ["skipped", "skipped"]


def test_a_failed_run_stops_the_sweep_and_the_next_call_resumes_it(tmp_path):
    specs = small_grid(methods=("grpo", "so_grpo", "ppo"))
    warm_start(tmp_path, 1)
    failing = FakeLauncher(fail={"reuse_1x2__so_grpo__s1"})
    outcomes = run_sweep(tmp_path, specs, launch=failing, log=quiet)
    assert [o.status for o in outcomes] == ["finished", "failed"]  # stopped before ppo
    assert run_status(tmp_path, specs[1]) == "partial" and run_status(tmp_path, specs[2]) == "new"

    lines = []
    resumed = FakeLauncher()
    run_sweep(tmp_path, specs, launch=resumed, log=lines.append)
    assert resumed.calls == ["reuse_1x2__so_grpo__s1", "reuse_1x2__ppo__s1"]
    assert any("resume from step 1" in line for line in lines)
    assert any("ETA" in line for line in lines)  # after one finished run, the next start has an ETA
    record = json.loads((tmp_path / "runs" / specs[1].name / RUN_RECORD).read_text())
    assert [launch["status"] for launch in record["launches"]] == [1, 0]
    assert json.loads((tmp_path / "runs" / specs[1].name / DONE_MARKER).read_text())["launches"] == 2


def test_keep_going_tries_every_run(tmp_path):
    specs = small_grid(methods=("grpo", "so_grpo", "ppo"))
    warm_start(tmp_path, 1)
    launcher = FakeLauncher(fail={"reuse_1x2__grpo__s1", "reuse_1x2__so_grpo__s1"})
    outcomes = run_sweep(tmp_path, specs, launch=launcher, log=quiet, keep_going=True)
    assert [o.status for o in outcomes] == ["failed", "failed", "finished"]


def test_a_run_whose_trainer_finished_is_not_trained_again(tmp_path):
    """Killed after the last checkpoint but before the marker: only the report is redone."""
    (spec,) = small_grid(methods=("grpo",))
    warm_start(tmp_path, 1)
    folder = tmp_path / "runs" / spec.name
    folder.mkdir(parents=True)
    (folder / RUN_RECORD).write_text(json.dumps({**spec.record(), "launches": []}))
    write_fake_run(folder, spec, {0: 0.2, 4: 0.3})
    launcher = FakeLauncher()
    (outcome,) = run_sweep(tmp_path, [spec], launch=launcher, log=quiet)
    assert launcher.calls == [] and outcome.status == "finished"
    assert (folder / DONE_MARKER).is_file()


def test_a_run_started_with_other_settings_is_refused(tmp_path):
    warm_start(tmp_path, 1)
    run_sweep(
        tmp_path, small_grid(methods=("grpo",), steps=4), launch=FakeLauncher(fail={"reuse_1x2__grpo__s1"}), log=quiet
    )
    launcher = FakeLauncher()
    with pytest.raises(SweepError, match=r"reuse_1x2__grpo__s1: this run was started with other settings \(env: "):
        run_sweep(tmp_path, small_grid(methods=("grpo",), steps=6), launch=launcher, log=quiet)
    assert launcher.calls == []  # refused before anything ran


# ---------------------------------------------------------------- table and figures


def test_figures_of_merit():
    assert area_under_curve([0, 2, 4], [0.2, 0.4, 0.4]) == pytest.approx((2 * 0.3 + 2 * 0.4) / 4)  # trapezoids / span
    assert area_under_curve([5], [0.3]) == 0.3
    assert is_collapsed(warm=0.4, peak=0.4, final=0.25)  # exactly 0.15 below the warm start
    assert not is_collapsed(warm=0.4, peak=0.4, final=0.26)
    assert is_collapsed(warm=0.1, peak=0.6, final=0.29)  # below half the peak
    assert not is_collapsed(warm=0.1, peak=0.6, final=0.3)


def test_report_table_and_figures(tmp_path):
    specs = small_grid(methods=("grpo", "st_ppo"), seeds=(1, 2))
    for seed in (1, 2):
        warm_start(tmp_path, seed)
    curves = {
        "reuse_1x2__grpo__s1": {0: 0.4, 2: 0.5, 4: 0.1},  # collapsed
        "reuse_1x2__grpo__s2": {0: 0.4, 2: 0.5, 4: 0.4},
        "reuse_1x2__st_ppo__s1": {0: 0.4, 2: 0.6, 4: 0.6},
        "reuse_1x2__st_ppo__s2": {0: 0.4, 2: 0.6, 4: 0.8},
    }
    run_sweep(tmp_path, specs, launch=FakeLauncher(curves=curves, sorl={"st_ppo"}), log=quiet)
    # an unfinished run in the folder is left out, with a note
    extra = build_grid(pressures=["reuse_4x4"], methods=["grpo"], seeds=[1], budget=specs[0].budget)
    run_sweep(tmp_path, extra, launch=FakeLauncher(fail={extra[0].name}), log=quiet)

    results, notes = load_results(tmp_path)
    assert [r.name for r in results] == [
        "reuse_1x2__grpo__s1",
        "reuse_1x2__grpo__s2",
        "reuse_1x2__st_ppo__s1",
        "reuse_1x2__st_ppo__s2",
    ]
    assert notes == ["reuse_4x4__grpo__s1: not finished, left out"]
    first = results[0]
    assert (first.warm, first.peak, first.final, first.collapsed) == (0.4, 0.5, 0.1, True)
    assert first.label == "GRPO" and first.clip["Token clip"] == pytest.approx(0.1) and first.clip["Turn clip"] is None

    info = write_report(tmp_path)
    assert info["runs"] == 4 and info["cells"] == 2
    table = (tmp_path / "stability.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| search | reuse")]
    assert rows[0].split(" | ")[2:4] == ["GRPO", "2"]
    assert "| 0.250 ± 0.212 |" in rows[0] and "| 1/2 |" in rows[0]  # final: mean and std of 0.1, 0.4
    assert rows[1].split(" | ")[2] == "ST-PPO" and "| 0/2 |" in rows[1] and "0.050" in rows[1]  # turn clip logged
    assert rows[0].endswith("| - |")  # GRPO logs no turn clip fraction
    cells = list(csv.DictReader(io.StringIO((tmp_path / "stability.csv").read_text())))
    assert cells[1]["algo"] == "st_ppo" and float(cells[1]["final_mean"]) == pytest.approx(0.7)
    assert cells[0]["collapsed"] == "1" and cells[0]["turn_clip_mean"] == ""
    per_run = list(csv.DictReader(io.StringIO((tmp_path / "stability_runs.csv").read_text())))
    assert per_run[0]["curve"] == "0:0.4000 2:0.5000 4:0.1000"
    for name in ("validation.png", "diagnostics.png"):
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert info["diagnostics"] == [
        "actor/sorl/c_norm",
        "actor/sorl/norm_scale",
        "actor/pg_clipfrac",
        "actor/sorl/clipfrac_turn",
    ]


def test_cli_dry_run_and_report_errors(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(["run", "--out", str(out), "--quick", "--dry-run"]) == 0
    text = capsys.readouterr().out
    n = len(QUICK["pressures"]) * len(QUICK["methods"]) * len(QUICK["seeds"])
    first = f"{QUICK['pressures'][0]}__{QUICK['methods'][0]}__s{QUICK['seeds'][0]}"
    assert f"[1/{n}] {first}: new" in text and f"[{n}/{n}]" in text and f"[{n + 1}/" not in text
    assert "warm starts to prepare: search seed 1" in text and "run_demo.sh grpo --out" in text
    assert not out.exists()  # a dry run writes nothing
    assert main(["report", "--out", str(out)]) == 2
    assert main(["run", "--out", str(out), "--methods", "grpo", "--trajectories", "24", "--dry-run"]) == 2


def test_launcher_knobs_from_the_shell_never_change_a_run():
    spec = RunSpec(PRESSURES["reuse_1x2"], "grpo", 1)
    env, dropped = launch_env(spec, {"ACTOR_LR": "1", "STEPS": "99", "DEMO_MIX": "0.9", "HOME": "/h", "PYTHON": "/py"})
    assert dropped == ["ACTOR_LR", "DEMO_MIX", "STEPS"]
    assert "ACTOR_LR" not in env and "DEMO_MIX" not in env and env["STEPS"] == "20"
    assert env["HOME"] == "/h" and env["PYTHON"] == "/py" and env["RAY_AUTH_MODE"] == "disabled"
    assert {"TRAIN_BATCH_SIZE", "SEED", "MAX_TURNS"} <= launcher_knobs()  # read from run_demo.sh / common.sh


def test_an_interrupted_launch_is_recorded_and_resumed(tmp_path):
    (spec,) = small_grid(methods=("grpo",))
    warm_start(tmp_path, 1)

    def interrupted(spec, folder):
        write_fake_run(folder, spec, {0: 0.5}, upto=1)
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(tmp_path, [spec], launch=interrupted, log=quiet)
    record = json.loads((tmp_path / "runs" / spec.name / RUN_RECORD).read_text())
    assert [launch["status"] for launch in record["launches"]] == ["interrupted"]
    assert run_status(tmp_path, spec) == "partial"
    launcher = FakeLauncher()
    run_sweep(tmp_path, [spec], launch=launcher, log=quiet)
    assert launcher.calls == [spec.name] and run_status(tmp_path, spec) == "finished"


@pytest.mark.parametrize(("env", "threads"), [((), "1"), ((("PREPARE_THREADS", "2"),), "2")])
def test_the_warm_start_is_prepared_on_run_demos_torch_threads(tmp_path, monkeypatch, env, threads):
    # run_demo.sh prepares with OMP_NUM_THREADS=$PREPARE_THREADS (default 1); the sweep's cached warm
    # start must be made the same way, or it is not the quick start's model bit for bit
    import sorl_verl.stability.sweep as sweep

    seen = {}

    def fake_run(cmd, env=None, **kwargs):
        seen["env"] = env
        warm = Path(cmd[cmd.index("prepare") + 1])
        warm.mkdir(parents=True)
        (warm / "prepare.json").write_text("{}")
        return type("Done", (), {"returncode": 0})()

    monkeypatch.setattr(sweep.subprocess, "run", fake_run)
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    sweep.prepare_warm_start(tmp_path, 1, Budget(env=env), quiet)
    assert seen["env"]["OMP_NUM_THREADS"] == threads
    assert seen["env"]["PATH"] == os.environ["PATH"]


def test_an_archived_runs_csv_joins_the_table_and_a_run_folder_wins(tmp_path, capsys):
    # sitting 1: two runs, their stability_runs.csv kept (the run folders are not)
    first = tmp_path / "first"
    specs = small_grid(methods=("grpo", "st_ppo"))
    warm_start(first, 1)
    curves = {"reuse_1x2__grpo__s1": {0: 0.4, 2: 0.5, 4: 0.1}, "reuse_1x2__st_ppo__s1": {0: 0.4, 2: 0.6, 4: 0.6}}
    run_sweep(first, specs, launch=FakeLauncher(curves=curves, sorl={"st_ppo"}), log=quiet)
    write_report(first)
    archive = tmp_path / "stability_runs.csv"
    archive.write_text((first / "stability_runs.csv").read_text())

    # sitting 2, a fresh folder: seed 2 of both, and grpo seed 1 again (its folder beats the archive)
    second = tmp_path / "second"
    specs2 = small_grid(methods=("grpo", "st_ppo"), seeds=(1, 2))
    for seed in (1, 2):
        warm_start(second, seed)
    rerun = {"reuse_1x2__grpo__s1": {0: 0.4, 2: 0.5, 4: 0.5}, "reuse_1x2__st_ppo__s2": {0: 0.4, 2: 0.6, 4: 0.8}}
    run_sweep(second, [s for s in specs2 if s.name != "reuse_1x2__st_ppo__s1"], launch=FakeLauncher(curves=rerun),
              log=quiet)  # fmt: skip
    results, _ = load_results(second, [archive])
    by_name = {r.name: r for r in results}
    assert sorted(by_name) == sorted(s.name for s in specs2)
    assert by_name["reuse_1x2__grpo__s1"].final == 0.5 and by_name["reuse_1x2__grpo__s1"].run is not None
    archived = by_name["reuse_1x2__st_ppo__s1"]
    assert archived.run is None and (archived.steps, archived.scores) == ([0, 2, 4], [0.4, 0.6, 0.6])
    assert archived.clip["Turn clip"] == pytest.approx(0.05) and archived.label == "ST-PPO"
    assert archived.pressure_title.startswith("reuse_1x2\n1 epoch x 2 mini-batches")

    assert main(["report", "--out", str(second), "--archive", str(archive)]) == 0
    err = capsys.readouterr().err
    assert "1 archived runs (no per-step metrics) are left out of diagnostics.png" in err
    merged = list(csv.DictReader(io.StringIO((second / "stability_runs.csv").read_text())))
    assert len(merged) == 4  # the merged table is the next sitting's archive
    cells = list(csv.DictReader(io.StringIO((second / "stability.csv").read_text())))
    st_ppo = next(c for c in cells if c["algo"] == "st_ppo")
    assert st_ppo["seeds"] == "1 2" and float(st_ppo["final_mean"]) == pytest.approx(0.7)

    # a broken archive is named with its row and field, and nothing is written
    lines = archive.read_text().splitlines()
    archive.write_text("\n".join([lines[0], lines[1].replace(",0.4,", ",zero,", 1)]) + "\n")
    assert main(["report", "--out", str(second), "--archive", str(archive)]) == 2
    assert f"{archive}, row 2, field 'warm'" in capsys.readouterr().err
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    assert main(["report", "--out", str(second), "--archive", str(tmp_path / "other.csv")]) == 2
    assert "not a stability_runs.csv" in capsys.readouterr().err


def test_a_run_archive_skips_its_runs_and_each_finished_run_joins_it_at_once(tmp_path, capsys):
    """A sweep spanning sittings on fresh checkouts: only the committed archive survives."""
    archive = tmp_path / "kept" / "stability_runs.csv"
    specs = small_grid(methods=("grpo", "so_grpo", "ppo"))
    first = tmp_path / "first"
    warm_start(first, 1)
    seen = []

    def launcher(spec, folder):
        # the archive already holds every run finished before this one
        seen.append(sorted(archived_names(archive)))
        return FakeLauncher(fail={"reuse_1x2__ppo__s1"})(spec, folder)

    outcomes = run_sweep(first, specs, launch=launcher, log=quiet, archive=archive, keep_going=True)
    assert [o.status for o in outcomes] == ["finished", "finished", "failed"]
    assert seen == [[], ["reuse_1x2__grpo__s1"], ["reuse_1x2__grpo__s1", "reuse_1x2__so_grpo__s1"]]
    assert archived_names(archive) == {"reuse_1x2__grpo__s1", "reuse_1x2__so_grpo__s1"}  # the failed run is not in

    # a fresh sweep folder (the next sitting): archived runs are skipped, the rest runs and joins
    second = tmp_path / "second"
    warm_start(second, 1)
    again = FakeLauncher()
    outcomes = run_sweep(second, specs, launch=again, log=quiet, archive=archive)
    assert again.calls == ["reuse_1x2__ppo__s1"]
    assert [o.detail for o in outcomes[:2]] == ["in the archive", "in the archive"]
    assert archived_names(archive) == {s.name for s in specs}
    rows = list(csv.DictReader(io.StringIO(archive.read_text())))
    assert len(rows) == 3 and all(r["curve"] for r in rows)

    assert main(["run", "--out", str(tmp_path / "third"), "--pressures", "reuse_1x2", "--methods", "grpo", "so_grpo",
                 "ppo", "--seeds", "1", "2", "--steps", "4", "--test-freq", "2", "--archive", str(archive),
                 "--dry-run"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert out.count("finished (archive)") == 3 and "3 of 6 runs left" in out
    archive.write_text("run,seed\nx,1\n")
    assert main(["run", "--out", str(tmp_path / "third"), "--archive", str(archive), "--dry-run"]) == 2
    assert "not a stability_runs.csv" in capsys.readouterr().err


def test_report_across_tasks_in_the_papers_layout(tmp_path):
    specs = small_grid(methods=("grpo", "st_ppo"), tasks=("search", "multihop"))
    for task in ("search", "multihop"):
        warm_start(tmp_path, 1, task)
    curves = {
        "reuse_1x2__grpo__s1": {0: 0.4, 2: 0.5, 4: 0.45},
        "reuse_1x2__st_ppo__s1": {0: 0.4, 2: 0.6, 4: 0.6},
        "multihop__reuse_1x2__grpo__s1": {0: 0.1, 2: 0.3, 4: 0.2},
        "multihop__reuse_1x2__st_ppo__s1": {0: 0.1, 2: 0.2, 4: 0.05},  # collapsed: below half its peak
    }
    run_sweep(tmp_path, specs, launch=FakeLauncher(curves=curves, sorl={"st_ppo"}), log=quiet)
    info = write_report(tmp_path)
    assert info["runs"] == 4 and info["cells"] == 4
    assert {"validation_search.png", "validation_multihop.png"} <= set(info["written"])
    paper = (tmp_path / "stability_paper.md").read_text().splitlines()
    header = next(line for line in paper if line.startswith("| Method"))
    assert header.split(" | ")[2:4] == ["search: final", "search: peak"] and "multihop: collapsed" in header
    grpo = next(line for line in paper if line.startswith("| GRPO |")).split(" | ")
    assert grpo[1:4] == ["reuse_1x2", "0.450", "0.500"] and grpo[6:9] == ["0.200", "0.300", "0/1"]
    st = next(line for line in paper if line.startswith("| ST-PPO |")).split(" | ")
    assert st[6:9] == ["0.050", "0.200", "1/1"]
    # the per-run archive keeps the task; an archive without the column reads as the default task
    archive = tmp_path / "stability_runs.csv"
    rows = list(csv.DictReader(io.StringIO(archive.read_text())))
    assert [r["task"] for r in rows] == ["search", "search", "multihop", "multihop"]
    old = tmp_path / "old.csv"
    old.write_text("\n".join(",".join(v for k, v in zip(rows[0], line.split(","), strict=True) if k != "task")
                             for line in archive.read_text().splitlines()) + "\n")  # fmt: skip
    assert {r.task for r in archived_results(old)} == {"search"}
    assert [r.task for r in archived_results(archive)] == ["search", "search", "multihop", "multihop"]


# ---------------------------------------------------------------- the segment study

# The records of every run of the grid as the code made them before the segment study (sha256 of their
# JSON, sorted keys): a run folder's record must match the requested one to be resumed, and an
# archive matches runs by name, so whole-episode runs must keep both exactly.
PRE_STUDY_METHODS = ["grpo", "so_grpo", "gspo", "cispo", "ppo", "turn_ppo", "s_ppo", "s_ppo+absolute",
                     "s_ppo+sequence", "st_ppo"]  # fmt: skip
PRE_STUDY_DIGESTS = {
    "default": ("653f20102f5927651366f9554582ef8cd895b9b9f2be4d49899b6393155cf9c1", 144),
    "every task, pressure, method": ("638da59d106ecaa45045170965514262b1d173c2f93b4feb06edc84374c730c1", 540),
    "a custom budget": ("faa191a79b7374d1b60170ce897747bdafdf930f847c66ef66b3b933055cec69", 4),
}


def _digest(runs):
    import hashlib

    return hashlib.sha256(json.dumps([r.record() for r in runs], sort_keys=True).encode()).hexdigest(), len(runs)


def test_whole_episode_runs_keep_their_names_and_records():
    custom = Budget(steps=7, test_freq=3, trajectories=16, prepare_args=("--n-val", "16"), env=(("DEMO_MIX", "0.5"),),
                    overrides=("trainer.x=1",))  # fmt: skip
    grids = {
        "default": build_grid(),
        "every task, pressure, method": build_grid(
            pressures=list(PRESSURES), methods=PRE_STUDY_METHODS, tasks=["medical", "multihop", "search"]
        ),
        "a custom budget": build_grid(
            pressures=["reuse_1x2"], methods=["ppo", "st_ppo"], seeds=[1, 2], tasks=["multihop"], budget=custom
        ),
    }
    for what, runs in grids.items():
        assert _digest(runs) == PRE_STUDY_DIGESTS[what], what
        assert all(r.arm is None and r.arm_name == "whole" and "arm" not in r.record() for r in runs)
    # the study's whole arm is an ordinary run of its method: same name, record and budget
    study = build_grid(pressures=["reuse_1x2"], methods=["ppo_turn_gae"], seeds=[1], tasks=["multihop"],
                       segment_turns=[1])  # fmt: skip
    plain = build_grid(pressures=["reuse_1x2"], methods=["ppo_turn_gae"], seeds=[1], tasks=["multihop"])
    assert study[0].record() == plain[0].record() and study[0].name == "multihop__reuse_1x2__ppo_turn_gae__s1"


def test_resets_agree_with_segment_mode():
    from sorl_verl.agent.segments import RESETS as SEGMENT_RESETS
    from sorl_verl.stability.grid import RESETS

    assert RESETS == SEGMENT_RESETS


def test_segment_study_arms_names_and_trainer_overrides():
    runs = build_grid(pressures=["reuse_1x2"], methods=["ppo_turn_gae", "st_ppo_turn_gae"], seeds=[1, 2],
                      tasks=["multihop"], segment_turns=[2, 1], resets=["sync", "staggered"])  # fmt: skip
    assert [r.arm_name for r in runs[:5]] == ["whole", "T1-sync", "T1-staggered", "T2-sync", "T2-staggered"]
    assert len(runs) == 2 * 2 * 5 and [r.seed for r in runs] == [1] * 10 + [2] * 10  # seed-major
    t1 = runs[2]
    assert t1.name == "multihop__reuse_1x2__ppo_turn_gae__T1-staggered__s1"
    assert len({r.name for r in runs}) == len(runs)
    overrides = t1.overrides()
    segment = [
        "trainer.v1.trainer_mode=sorl_segment",
        "+trainer.v1.segment.turns=1",
        "+trainer.v1.segment.resets=staggered",
        "+trainer.v1.segment.pool_size=64",  # the step's trajectories: every episode advances every step
        "+trainer.v1.segment.seed=1",
    ]
    assert overrides[-len(segment) :] == segment
    # after the method's own: the loss is PPO's, the trainer segment mode's (the ALGO's sorl_sync is replaced)
    assert overrides.index("actor_rollout_ref.actor.policy_loss.loss_mode=vanilla") < overrides.index(segment[0])
    assert t1.algo == "st_ppo_turn_gae" and runs[0].algo == "st_ppo_turn_gae"  # turn_gae + critic + sorl_sync
    assert not any(o.startswith("trainer.v1.trainer_mode") for o in runs[0].overrides())  # whole: the ALGO's trainer
    assert t1.batch() == (64, 32, 32)  # a critic method: 64 prompts x 1 sample, as segment mode needs
    assert runs[10 + 4].overrides()[-1] == "+trainer.v1.segment.seed=2"
    record = t1.record()
    assert record["arm"] == {"name": "T1-staggered", "turns": 1, "resets": "staggered", "episode_turns": 3.5}
    assert record["task"] == "multihop" and record["name"] == t1.name
    # the user's overrides still come last
    (spec,) = build_grid(pressures=["reuse_1x2"], methods=["st_ppo_turn_gae"], seeds=[1], tasks=["multihop"],
                         segment_turns=[1], resets=["sync"], whole=False, budget=Budget(overrides=("a.b=1",)))  # fmt: skip
    assert spec.overrides()[-1] == "a.b=1" and spec.arm_name == "T1-sync"


def test_budget_rule_same_trained_turns_for_every_arm():
    budget = Budget(steps=20, test_freq=5)
    runs = build_grid(pressures=["reuse_1x2"], methods=["st_ppo_turn_gae"], seeds=[1], tasks=["multihop"],
                      segment_turns=[1, 2, 4], resets=["sync"], budget=budget)  # fmt: skip
    steps = {r.arm_name: (r.budget.steps, r.budget.test_freq) for r in runs}
    # multihop: L = 3.5 model turns (2 or 3 hops, then the answer); a T arm runs L/T times the steps
    assert steps == {"whole": (20, 5), "T1-sync": (70, 18), "T2-sync": (35, 9), "T4-sync": (20, 5)}  # T > L: x1
    for run in runs:
        env = run.env()
        assert env["STEPS"] == str(run.budget.steps) and env["TEST_FREQ"] == env["SAVE_FREQ"] == str(
            run.budget.test_freq
        )
        validations = run.budget.steps // run.budget.test_freq + (run.budget.steps % run.budget.test_freq > 0)
        assert validations == 4  # the same number of validations (verl validates at the last step too)
    # planned trained turns per trajectory slot: within a step of each other
    planned = {r.arm_name: r.budget.steps * min(r.arm.turns, 3.5) if r.arm else 20 * 3.5 for r in runs}
    assert max(planned.values()) - min(planned.values()) <= 3.5
    # --episode-turns wins over the task's figure; search's own is 2
    (t1,) = build_grid(pressures=["reuse_1x2"], methods=["ppo_turn_gae"], seeds=[1], segment_turns=[1],
                       resets=["sync"], whole=False, budget=budget, episode_turns=3)  # fmt: skip
    assert (t1.budget.steps, t1.budget.test_freq) == (60, 15)
    (t1,) = build_grid(pressures=["reuse_1x2"], methods=["ppo_turn_gae"], seeds=[1], segment_turns=[1],
                       resets=["sync"], whole=False, budget=budget)  # fmt: skip
    assert t1.budget.steps == 40 and t1.name == "reuse_1x2__ppo_turn_gae__T1-sync__s1"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--segment-turns", "0"], "--segment-turns: T must be an integer >= 1, got 0"),
        (["--segment-turns", "1", "--methods", "grpo"], "method grpo cannot run segment arms.*critic-free"),
        (["--segment-turns", "1", "--methods", "so_grpo"], "method so_grpo cannot run segment arms"),
        (["--segment-turns", "1", "--methods", "ppo"], "method ppo cannot run segment arms.*estimator gae"),
        (["--segment-turns", "1", "--methods", "st_ppo"], "method st_ppo cannot run segment arms"),
        (["--segment-turns", "1", "--pressures", "stale_k2"], "pressure stale_k2 runs its own trainer"),
        (["--segment-turns", "1", "--override", "trainer.v1.trainer_mode=sync"], "--override trainer.v1.trainer_mode"),
        (["--segment-turns", "1", "1"], "--segment-turns repeated"),
        (["--segment-turns", "1", "--episode-turns", "0"], "--episode-turns: L must be > 0"),
        (["--resets", "sync"], "--resets need --segment-turns"),
        (["--no-whole"], "--no-whole need --segment-turns"),
        (
            ["--segment-turns", "1", "--resets", "sync", "--trajectories", "3", "--group-size", "1"],
            "do not split into 2 mini-batches",
        ),
    ],
)
def test_segment_study_refusals_exit_2_naming_the_setting(tmp_path, capsys, argv, message):
    import re

    out = tmp_path / "sweep"
    assert main(["run", "--out", str(out), "--task", "multihop", *argv, "--dry-run"]) == 2
    assert re.search(message, capsys.readouterr().err)
    assert not out.exists()


def test_an_unknown_reset_exits_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", "--out", str(tmp_path), "--segment-turns", "1", "--resets", "random", "--dry-run"])
    assert e.value.code == 2 and "--resets: invalid choice: 'random'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--resets: unknown reset schedule 'random'"):
        build_grid(pressures=["reuse_1x2"], methods=["ppo_turn_gae"], segment_turns=[1], resets=["random"])


def test_segment_study_dry_run_defaults_to_its_methods_and_pressure(tmp_path, capsys):
    assert main(["run", "--out", str(tmp_path / "s"), "--task", "multihop", "--segment-turns", "1", "2",
                 "--seeds", "1", "--dry-run"]) == 0  # fmt: skip
    text = capsys.readouterr().out
    assert "[1/10] multihop__reuse_1x2__ppo_turn_gae__s1: new\n" in text
    assert "[2/10] multihop__reuse_1x2__ppo_turn_gae__T1-sync__s1: new, 70 steps, validation every 18" in text
    assert "[10/10] multihop__reuse_1x2__st_ppo_turn_gae__T2-staggered__s1: new, 35 steps" in text
    assert "+trainer.v1.segment" not in text  # the first pending run is the whole arm


def _segment_metrics(spec: RunSpec, step: int) -> dict:
    """What the trainer logs at a training step of ``spec``: turn counts, step time, the segment metrics."""
    if spec.arm is None:  # whole episodes of 3 model turns: verl counts 1 + 3 + 2 observations
        data = {"num_turns/mean": 6.0, "training/num_turns/mean": 6.0, "timing_s/step": 9.0}
    else:
        data = {
            "rollout/segment_turns_mean": float(spec.arm.turns),
            "rollout/turn_position_std": 0.5 if spec.arm.resets == "sync" else 1.0,
            # a sync pool's batches swing between phases (0.5, 2.0, 0.5, ...); the staggered pool's do not
            "rollout/turn_position_mean": (0.5 if step % 2 else 2.0) if spec.arm.resets == "sync" else 1.0,
            "num_turns/mean": 7.0,  # the whole trajectory so far: not what the segment trained
            "timing_s/step": 6.0 * spec.arm.turns,
        }
    if spec.method.startswith("st_ppo"):
        data["actor/sorl/norm_scale"] = 0.8
        if spec.arm is None:  # the SORL losses count the trained rows' model-token runs: exact, preferred
            data["actor/sorl/turns_per_seq"] = 2.5
    return data


def write_study_run(folder: Path, spec: RunSpec, curve: dict[int, float]) -> None:
    write_fake_run(folder, spec, curve, sorl=spec.method.startswith("st_ppo"))
    metrics = folder / "metrics-0000.jsonl"
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    for line in lines:
        if line["step"]:
            line["data"].update(_segment_metrics(spec, line["step"]))
    metrics.write_text("".join(json.dumps(line) + "\n" for line in lines))


def study_grid(budget=None, **kw):
    return build_grid(pressures=["reuse_1x2"], methods=["ppo_turn_gae", "st_ppo_turn_gae"], seeds=[1, 2],
                      tasks=["multihop"], segment_turns=[1], resets=["sync", "staggered"],
                      budget=budget or Budget(steps=2, test_freq=1, trajectories=8), **kw)  # fmt: skip


def test_segment_report_measures_trained_turns_and_writes_segments_md_and_png(tmp_path):
    specs = study_grid()
    for seed in (1, 2):
        warm_start(tmp_path, seed, "multihop")

    def launcher(spec, folder):
        steps = {*range(0, spec.budget.steps + 1, spec.budget.test_freq), spec.budget.steps}  # verl: the last too
        write_study_run(folder, spec, {s: 0.1 + 0.01 * s + 0.01 * spec.seed for s in steps})
        return 0

    outcomes = run_sweep(tmp_path, specs, launch=launcher, log=quiet)
    assert [o.status for o in outcomes] == ["finished"] * 12
    assert {s.budget.steps for s in specs} == {2, 7}  # L = 3.5: a T1 arm runs 3.5x the steps
    info = write_report(tmp_path)
    assert {"segments.md", "segments.png"} <= set(info["written"])
    data = (tmp_path / "segments.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000

    results, _ = load_results(tmp_path)
    by_name = {r.name: r for r in results}
    whole = by_name["multihop__reuse_1x2__ppo_turn_gae__s1"]
    # 8 trajectories x 3 model turns (verl's num_turns 6 / 2) per step, cumulated at the validation steps
    assert whole.arm == "whole" and whole.steps == [0, 1, 2] and whole.curve_turns == [0.0, 24.0, 48.0]
    assert whole.curve_wall == [0.0, 9.0, 18.0] and whole.turn_position_std is None
    assert by_name["multihop__reuse_1x2__st_ppo_turn_gae__s1"].curve_turns == [0.0, 20.0, 40.0]  # 8 x 2.5
    seg = by_name["multihop__reuse_1x2__st_ppo_turn_gae__T1-staggered__s2"]
    # the segment's trained turns, not verl's count of the whole trajectory
    assert seg.arm == "T1-staggered" and seg.steps == [0, 4, 7] and seg.curve_turns == [0.0, 32.0, 56.0]
    assert seg.turns_per_row == 1.0 and seg.turn_position_std == 1.0 and seg.correction_scale == pytest.approx(0.8)
    assert seg.curve_wall == [0.0, 24.0, 42.0] and seg.phase_swing == 0.0
    assert by_name["multihop__reuse_1x2__st_ppo_turn_gae__T1-sync__s2"].phase_swing == 1.5
    assert whole.phase_swing is None

    table = (tmp_path / "segments.md").read_text()
    rows = {
        tuple(c.strip() for c in line.split("|")[3:5]): line for line in table.splitlines() if "| multihop |" in line
    }
    assert list(rows) == [
        (m, a) for m in ("PPO (turn-GAE)", "ST-PPO (turn-GAE)") for a in ("whole", "T1-sync", "T1-staggered")
    ]
    cells = rows[("ST-PPO (turn-GAE)", "T1-staggered")].split(" | ")
    assert cells[4:9] == ["2", "7", "0.185 ± 0.007", "0.185 ± 0.007", "56 ± 0"]  # seeds, steps, final, peak, turns
    assert cells[9:] == [
        "1.00 ± 0.00",
        "0.7 ± 0.0",
        "1.000 ± 0.000",
        "0.000 ± 0.000",
        "0.100 ± 0.000",
        "0.800 ± 0.000 |",
    ]
    whole_row = rows[("PPO (turn-GAE)", "whole")].split(" | ")
    assert whole_row[8:12] == ["48 ± 0", "3.00 ± 0.00", "0.3 ± 0.0", "-"] and whole_row[-1] == "- |"
    assert "max(1, L/T)" in table  # the budget rule is stated
    # the benchmark's table keeps the arms apart; its figures draw the whole episodes
    main_table = (tmp_path / "stability.md").read_text()
    assert "| ST-PPO (turn-GAE) [T1-sync] | 2 |" in main_table and "| ST-PPO (turn-GAE) | 2 |" in main_table
    assert {"validation.png", "diagnostics.png"} <= set(info["written"])

    # the archive keeps the study: trailing columns, read back as written
    archive = tmp_path / "stability_runs.csv"
    header = archive.read_text().splitlines()[0].split(",")
    assert header[-10:-4] == [
        "arm",
        "turns_per_row",
        "turn_position_std",
        "correction_scale",
        "curve_turns",
        "curve_wall",
    ]
    assert header[-4:] == ["steps_turn_position_std", "steps_token_clip", "steps_correction_scale", "phase_swing"]
    archived = {r.name: r for r in archived_results(archive)}
    again = archived[seg.name]
    # the per-step panels' series, every training step: kept so that the figure draws them from the archive
    assert seg.step_series == {
        "steps_turn_position_std": ([1, 2, 3, 4, 5, 6, 7], [1.0] * 7),
        "steps_token_clip": ([1, 2, 3, 4, 5, 6, 7], [0.1] * 7),
        "steps_correction_scale": ([1, 2, 3, 4, 5, 6, 7], [0.8] * 7),
    }
    assert {r.name: r.step_series for r in archived.values()} == {r.name: r.step_series for r in results}
    assert set(by_name[whole.name].step_series) == {"steps_token_clip"}  # PPO on whole episodes: clip only
    assert (again.arm, again.curve_turns, again.curve_wall) == ("T1-staggered", [0.0, 32.0, 56.0], [0.0, 24.0, 42.0])
    assert (again.turns_per_row, again.turn_position_std, again.correction_scale) == (1.0, 1.0, pytest.approx(0.8))
    assert {r.name: r.phase_swing for r in archived.values()} == {r.name: r.phase_swing for r in results}
    assert archived[whole.name].arm == "whole" and archived[whole.name].turn_position_std is None

    # a fresh folder with the archive only: the study's table and figure come back from it
    fresh = tmp_path / "fresh"
    (fresh / "runs").mkdir(parents=True)
    info = write_report(fresh, [archive])
    assert "segments.md" in info["written"]
    assert (fresh / "segments.md").read_text().splitlines()[4:] == table.splitlines()[4:]
    # the same figure, its per-step panels included (drawn from the archived series)
    assert (fresh / "segments.png").read_bytes() == (tmp_path / "segments.png").read_bytes()


def test_old_archives_read_as_whole_episode_runs(tmp_path):
    # the committed archive as it was before the task and segment columns (42 search-task runs);
    # the live one in docs/figures/ grows with the sweep and is written in the new layout
    committed = Path(__file__).resolve().parents[1] / "fixtures" / "stability" / "stability_runs_before_tasks.csv"
    results = archived_results(committed)
    assert len(results) == 42
    assert all(r.arm == "whole" and r.curve_turns is None and r.curve_wall is None for r in results)
    assert all(r.turn_position_std is None and r.correction_scale is None for r in results)
    # reported and written back: the same rows, the new columns trailing and empty but for the arm
    (tmp_path / "runs").mkdir()
    info = write_report(tmp_path, [committed])
    assert "segments.md" not in info["written"] and not (tmp_path / "segments.png").exists()
    old = list(csv.DictReader(io.StringIO(committed.read_text())))
    new = list(csv.DictReader(io.StringIO((tmp_path / "stability_runs.csv").read_text())))
    assert [{k: row[k] for k in old[0]} for row in new] == old
    assert {(r["arm"], r["curve_turns"], r["turn_position_std"]) for r in new} == {("whole", "", "")}


def test_a_bad_measured_curve_in_the_archive_is_named(tmp_path):
    specs = study_grid(budget=Budget(steps=1, test_freq=1, trajectories=8), whole=False)[:1]
    warm_start(tmp_path, 1, "multihop")
    run_sweep(tmp_path, specs, launch=lambda s, f: write_study_run(f, s, {0: 0.1, 2: 0.2, 4: 0.3}) or 0, log=quiet)
    write_report(tmp_path)
    archive = tmp_path / "stability_runs.csv"
    text = archive.read_text()
    assert "0:0.0 2:16.0 4:32.0" in text
    archive.write_text(text.replace("0:0.0 2:16.0 4:32.0", "0:0.0 3:16.0 4:32.0"))
    with pytest.raises(ArchiveError, match=r"row 2, field 'curve_turns': its steps \[0, 3, 4\] are not the curve's"):
        archived_results(archive)


def script_calls(name: str, tmp_path, **env: str):
    """Run ``examples/stability/<name>`` (sweep folder ``tmp_path/sweep``) with a stand-in PYTHON that
    records its calls: (the finished process, each call's arguments)."""
    import shlex
    import subprocess

    script = Path(__file__).resolve().parents[2] / "examples" / "stability" / name
    tmp_path.mkdir(parents=True, exist_ok=True)
    calls = tmp_path / "calls"
    fake = tmp_path / "python"
    fake.write_text(f'#!/usr/bin/env bash\necho "$*" >> {shlex.quote(str(calls))}\n')
    fake.chmod(0o755)
    full_env = {k: v for k, v in os.environ.items() if k not in ("SEEDS", "TASKS", "TASK")}
    full_env.update(PYTHON=str(fake), **env)
    done = subprocess.run(["bash", str(script), str(tmp_path / "sweep")], env=full_env, capture_output=True, text=True)
    lines = [shlex.split(line) for line in calls.read_text().splitlines()] if calls.exists() else []
    return done, lines


def test_the_segment_study_script_runs_the_study_and_its_report(tmp_path, capsys):
    """examples/stability/segments.sh, with a stand-in PYTHON that records its calls; each call is then
    checked by the real command line (as a dry run)."""
    done, lines = script_calls("segments.sh", tmp_path, SEEDS="1 2")
    assert done.returncode == 0, done.stderr
    assert [line[:3] for line in lines] == [["-m", "sorl_verl.stability", "run"]] * 2 + [
        ["-m", "sorl_verl.stability", "report"]
    ]
    archive = "docs/figures/segments/stability_runs.csv"
    assert lines[2][3:] == ["--out", str(tmp_path / "sweep"), "--archive", archive]
    for seed, line in zip((1, 2), lines[:2], strict=True):
        argv = line[2:]
        assert argv[argv.index("--seeds") + 1] == str(seed) and argv[argv.index("--archive") + 1] == archive
        argv[argv.index("--archive") : argv.index("--archive") + 2] = []
        assert main([*argv, "--dry-run"]) == 0
        out = capsys.readouterr().out
        assert "10 of 10 runs left" in out and f"multihop__reuse_1x2__st_ppo_turn_gae__T2-staggered__s{seed}" in out
    # the long variant: its own runs, a T = 1 arm trains L = 5.5 times the steps of whole episodes
    done, lines = script_calls("segments.sh", tmp_path / "long", SEEDS="3", TASK="multihop_long")
    assert done.returncode == 0, done.stderr
    argv = lines[0][2:]
    argv[argv.index("--archive") : argv.index("--archive") + 2] = []
    assert main([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "multihop_long__reuse_1x2__ppo_turn_gae__T1-sync__s3: new, 110 steps" in out


def selected(calls) -> list[tuple[str, ...]]:
    """(tasks, pressure) of each ``run`` call."""
    out = []
    for args in calls:
        if args[2] == "run":
            tasks = args[args.index("--task") + 1 : args.index("--pressures")]
            out.append((*tasks, args[args.index("--pressures") + 1]))
    return out


def test_task_families_script_runs_the_parts_named_in_tasks(tmp_path):
    done, calls = script_calls("task_families.sh", tmp_path / "all", SEEDS="2")
    assert done.returncode == 0
    assert selected(calls) == [
        ("multihop", "medical", "reuse_8x8"),
        ("multihop", "medical", "reuse_1x2"),
        ("search", "reuse_8x8"),
    ]
    assert calls[-1][2] == "report"
    _, calls = script_calls("task_families.sh", tmp_path / "multihop", SEEDS="2", TASKS="multihop")
    assert selected(calls) == [("multihop", "reuse_8x8"), ("multihop", "reuse_1x2")]
    _, calls = script_calls("task_families.sh", tmp_path / "rest", SEEDS="2", TASKS="medical search")
    assert selected(calls) == [("medical", "reuse_8x8"), ("medical", "reuse_1x2"), ("search", "reuse_8x8")]
    done, calls = script_calls("task_families.sh", tmp_path / "bad", SEEDS="2", TASKS="multihop bogus")
    assert done.returncode == 2 and calls == []
    assert "unknown task 'bogus'" in done.stderr and "multihop medical search" in done.stderr


def _result(task, method, label, seed, scores, pressure="reuse_8x8", collapsed=False):
    """A finished run's figures of merit over validation steps 0, 10, 20, ... (``scores``)."""
    return RunResult(
        name=f"{task}__{pressure}__{method}__s{seed}", pressure=pressure, method=method, label=label, seed=seed,
        steps=[10 * i for i in range(len(scores))], scores=list(scores), warm=scores[0], peak=max(scores),
        final=scores[-1], auc=0.5, collapsed=collapsed, task=task,
    )  # fmt: skip


def test_runs_of_one_seed_from_different_warm_starts_are_named():
    def result(method, label, seed, warm, pressure="reuse_8x8"):
        return _result("multihop", method, label, seed, [warm, 0.5], pressure=pressure)

    same = [result("ppo", "PPO", 1, 0.26), result("st_ppo", "ST-PPO", 1, 0.26), result("ppo", "PPO", 2, 0.13)]
    assert mixed_warm_starts(same) == ""
    mixed = [*same, result("ppo", "PPO", 3, 0.0794), result("st_ppo", "ST-PPO", 3, 0.0865),
             result("ppo", "PPO", 3, 0.0865, pressure="reuse_1x2")]  # fmt: skip
    text = mixed_warm_starts(mixed)
    assert "multihop seed 3: 0.079 (1 run: PPO); 0.086 (2 runs: PPO at reuse_1x2, ST-PPO)" in text
    assert "seed 1" not in text and "seed 2" not in text
    # two long groups: the smaller one is named run by run, only the larger one is "the others"
    methods = [("ppo", "PPO"), ("st_ppo", "ST-PPO"), ("grpo", "GRPO"), ("so_grpo", "SO-GRPO"), ("gspo", "GSPO")]
    long = [result(m, label, 4, 0.0) for m, label in methods] + [result(m, label, 4, 0.059, pressure=p)
            for m, label in methods for p in ("reuse_1x2", "lr_5e-4")]  # fmt: skip
    text = mixed_warm_starts(long)
    assert "multihop seed 4: 0.000 (5 runs: GRPO, GSPO, PPO, SO-GRPO, ST-PPO); 0.059 (10 runs: the others)" in text


def test_a_task_familys_figure_has_a_panel_per_method_in_the_papers_row_order(tmp_path):
    def result(method, label, seed, final, pressure="reuse_8x8", collapsed=False):
        return _result("medical", method, label, seed, [0.25, 0.4, final], pressure=pressure, collapsed=collapsed)

    runs = [result("ppo", "PPO", 2, 0.0, collapsed=True), result("grpo", "GRPO", 1, 0.6),
            result("ppo", "PPO", 1, 0.5, pressure="reuse_1x2"), result("ppo", "PPO", 1, 0.6),
            result("grpo", "GRPO", 2, 0.3)]  # fmt: skip
    panels = task_panels(runs)
    assert [title for title, _ in panels] == [
        "GRPO, reuse_8x8: collapsed 0/2",
        "PPO, reuse_1x2: collapsed 0/1",
        "PPO, reuse_8x8: collapsed 1/2",
    ]
    assert [[r.seed for r in rs] for _, rs in panels] == [[1, 2], [1], [1, 2]]  # every seed its own curve
    out = tmp_path / "validation_medical.png"
    assert plot_task_validation(runs, out) == 3 and out.read_bytes()[:4] == b"\x89PNG"
