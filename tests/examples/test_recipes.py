"""The paper recipes (examples/*/*.sh): shell syntax, and every Hydra override against verl's config.

Each recipe runs in dry-run mode (SORL_DRY_RUN=1 prints the commands instead of running them),
for every algorithm; its trainer overrides are then composed onto verl's own default config
(``verl/trainer/config/ppo_trainer.yaml`` and its includes) with Hydra's compose API, which
rejects a key that does not exist unless it is ``+``-prefixed. So a typo in a config key fails
here, not an hour into a cluster job. The commands the recipes run besides the trainer
(data preparation, index build, retriever) are checked against their own ``--help``.
"""

import ast
import importlib.util
import os
import re
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from omegaconf import OmegaConf, open_dict

from sorl_verl.quickstart.tasks import LAUNCHER_VARIABLES
from sorl_verl.recipes import ALGOS, RECIPE_VARIABLES, algo_overrides
from sorl_verl.recipes import main as recipes_main

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
RECIPE_DIRS = ["search_r1", "medical", "math"]
SCRIPTS = [EXAMPLES / "common.sh"] + sorted(p for d in RECIPE_DIRS for p in (EXAMPLES / d).glob("*.sh"))
TRAIN_RECIPES = [EXAMPLES / d / "train.sh" for d in RECIPE_DIRS]
VERL_CONFIG_DIR = Path(importlib.util.find_spec("verl").submodule_search_locations[0]) / "trainer" / "config"


def dry_run(script: Path, tmp_path: Path, *args: str, **env: str) -> tuple[dict[str, str], list[list[str]]]:
    """(exported variables, commands) a recipe would run."""
    full_env = {**os.environ, "SORL_DRY_RUN": "1", "RUN_ROOT": str(tmp_path / "runs"), "PYTHON": sys.executable, **env}
    done = subprocess.run(["bash", str(script), *args], capture_output=True, text=True, env=full_env, cwd=tmp_path)
    assert done.returncode == 0, f"{script} failed:\n{done.stderr}"
    exported, commands = {}, []
    for line in done.stdout.splitlines():
        if line.startswith("ENV "):
            key, _, value = line[4:].partition("=")
            exported[key] = value
        elif line == "--- cmd":
            commands.append([])
        else:
            assert commands, f"{script}: output outside a command: {line!r}"
            commands[-1].append(line)
    return exported, commands


def trainer_overrides(commands: list[list[str]]) -> list[str]:
    trainers = [c for c in commands if c[1:3] == ["-m", "verl.trainer.main_ppo"]]
    assert len(trainers) == 1, commands
    return trainers[0][3:]


def compose(overrides: list[str]):
    """verl's default trainer config with ``overrides`` applied; raises on an unknown key or bad syntax."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(VERL_CONFIG_DIR), version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=overrides, return_hydra_config=True)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_shell_syntax_and_strict_mode(script):
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    assert "set -euo pipefail" in text


def test_compose_rejects_a_typo():
    """The check below would catch a misspelled key (guards against a vacuous test)."""
    compose(["algorithm.adv_estimator=grpo"])
    with pytest.raises(Exception, match="adv_estimatr"):
        compose(["algorithm.adv_estimatr=grpo"])


@pytest.mark.parametrize("recipe", TRAIN_RECIPES, ids=lambda p: p.parent.name)
def test_every_override_exists_in_verl_config(recipe, tmp_path):
    for algo, spec in ALGOS.items():
        loss_mode, adv, critic = spec.loss_mode, spec.adv_estimator, spec.critic
        exported, commands = dry_run(
            recipe, tmp_path, "trainer.total_training_steps=7", ALGO=algo, RUN_NAME=f"r-{algo}"
        )
        overrides = trainer_overrides(commands)
        cfg = compose(overrides)  # raises on any unknown key
        assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == loss_mode, algo
        assert cfg.algorithm.adv_estimator == adv, algo
        assert cfg.trainer.total_training_steps == 7, "user overrides must come last and win"
        assert cfg.reward.custom_reward_function.name == "compute_score"
        if critic:
            assert cfg.critic.model.path == cfg.actor_rollout_ref.model.path
        if adv == "turn_gae":  # the math recipe is asynchronous by default (ASYNC=0: sorl_sync)
            expected_mode = "sorl_colocate_async" if recipe.parent.name == "math" else "sorl_sync"
            assert cfg.critic.enable is True and cfg.trainer.v1.trainer_mode == expected_mode
        if adv == "grpo":
            assert cfg.actor_rollout_ref.rollout.n > 1 and cfg.actor_rollout_ref.actor.use_kl_loss
        if loss_mode == "gspo":  # the GSPO paper's clip range and sequence-mean loss win over the shared ones
            actor = cfg.actor_rollout_ref.actor
            assert (actor.clip_ratio_low, actor.clip_ratio_high) == (3e-4, 4e-4), algo
            assert actor.loss_agg_mode == "seq-mean-token-mean", algo
        assert cfg.actor_rollout_ref.rollout.name == "vllm" and cfg.actor_rollout_ref.rollout.mode == "async"
        # The run folder holds what the table tool reads: Hydra's config and the FileLogger JSONL.
        run_dir = Path(cfg.hydra.run.dir)
        assert run_dir.parent.parent == tmp_path / "runs" and run_dir.name == f"r-{algo}"
        assert "file" in cfg.trainer.logger
        log_path = Path(exported["VERL_FILE_LOGGER_PATH"])
        assert log_path.parent == run_dir and log_path.name.startswith("metrics")
        assert cfg.ray_kwargs.ray_init.runtime_env.env_vars.VERL_FILE_LOGGER_PATH == str(log_path)


@pytest.mark.parametrize("recipe", TRAIN_RECIPES, ids=lambda p: p.parent.name)
def test_paper_hyperparameters(recipe, tmp_path):
    _, commands = dry_run(recipe, tmp_path, ALGO="st_ppo")
    cfg = compose(trainer_overrides(commands))
    actor = cfg.actor_rollout_ref.actor
    assert actor.optim.lr == 1e-6 and cfg.critic.optim.lr == 1e-5
    assert actor.clip_ratio_low == actor.clip_ratio_high == 0.2
    assert cfg.data.train_batch_size >= actor.ppo_mini_batch_size
    assert cfg.data.train_batch_size % actor.ppo_mini_batch_size == 0


def test_math_recipe_is_asynchronous_unless_async_0(tmp_path):
    _, commands = dry_run(EXAMPLES / "math" / "train.sh", tmp_path, ALGO="st_ppo_turn_gae", MAX_OFF_POLICY="2")
    cfg = compose(trainer_overrides(commands))
    assert cfg.trainer.v1.trainer_mode == "sorl_colocate_async"
    assert cfg.trainer.v1.sampler.max_off_policy_threshold == 2
    assert cfg.trainer.v1.colocate_async.num_warmup_batches == 1
    assert cfg.algorithm.rollout_correction.bypass_mode is True
    _, commands = dry_run(EXAMPLES / "math" / "train.sh", tmp_path, ALGO="so_grpo", ASYNC="0")
    cfg = compose(trainer_overrides(commands))
    assert cfg.trainer.v1.trainer_mode == "sync" and cfg.algorithm.rollout_correction.bypass_mode is False
    done = subprocess.run(
        ["bash", str(EXAMPLES / "math" / "train.sh")],
        env={**os.environ, "SORL_DRY_RUN": "1", "ASYNC": "2"},
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert done.returncode != 0 and "ASYNC=2" in done.stderr


def test_search_r1_defaults_and_agent_config(tmp_path):
    _, commands = dry_run(EXAMPLES / "search_r1" / "train.sh", tmp_path, ALGO="so_grpo", MAX_TURNS="3", TOPK="5")
    cfg = compose(trainer_overrides(commands))
    assert cfg.data.train_batch_size == 512 and cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 256
    assert cfg.actor_rollout_ref.rollout.agent.default_agent_loop == "search_r1"
    agent_file = Path(cfg.actor_rollout_ref.rollout.agent.agent_loop_config_path)
    (entry,) = OmegaConf.load(agent_file)
    assert entry.name == "search_r1" and entry.topk == 5 and entry.max_turns == 3
    assert entry.max_obs_length == 500 and entry.max_tokens_per_turn == 500
    # The response budget holds every turn and observation at their caps.
    assert cfg.data.max_response_length >= (3 + 1) * 500 + 3 * 500
    # Every option the file sets is a parameter of the agent loop's constructor.
    module, _, cls = entry._target_.rpartition(".")
    assert constructor_params(module, cls) >= set(entry) - {"name", "_target_"}


def constructor_params(module: str, cls: str) -> set[str]:
    """Parameter names of ``cls.__init__``, read from the source (importing it would pull in verl's agent loop)."""
    source = Path(importlib.util.find_spec(module).origin).read_text()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            init = next(n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
            return {a.arg for a in init.args.args + init.args.kwonlyargs}
    raise AssertionError(f"{cls} not found in {module}")


def test_reward_function_exists():
    source = (REPO / "reward_fns" / "__init__.py").read_text()
    names = {n.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef)}
    names |= {a.asname or a.name for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert "compute_score" in names


@cache
def help_text(command: tuple[str, ...]) -> str:
    done = subprocess.run([*command, "--help"], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, f"{' '.join(command)} --help failed:\n{done.stderr[-2000:]}"
    return done.stdout


def cli_of(cmd: list[str]) -> tuple[tuple[str, ...], list[str]]:
    """(the command that takes --help, its arguments) for `python -m mod ...` or a console script."""
    if cmd[1:2] == ["-m"]:
        return (sys.executable, "-m", cmd[2]), cmd[3:]
    script = Path(sys.executable).parent / Path(cmd[0]).name
    return (str(script) if script.exists() else cmd[0],), cmd[1:]


@pytest.mark.parametrize(
    "script",
    [p for p in SCRIPTS if p.name != "common.sh" and p.name != "train.sh"],
    ids=lambda p: str(p.relative_to(EXAMPLES)),
)
def test_helper_commands_match_their_help(script, tmp_path):
    """Data preparation, index build, retriever and table commands: modules exist, flags are real."""
    _, commands = dry_run(script, tmp_path, CKPT=str(tmp_path / "global_step_100"))
    assert commands, f"{script} runs nothing"
    for cmd in commands:
        if cmd[1:3] == ["-m", "verl.trainer.main_ppo"]:
            compose(cmd[3:])
            continue
        if cmd[0] in ("bash", "mkdir", "test"):
            continue
        command, args = cli_of(cmd)
        text = help_text(command)
        for arg in args:
            if arg.startswith("--"):
                flag = arg.split("=", 1)[0]
                assert flag in text, f"{script}: {' '.join(command[-1:])} has no {flag}"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """verl's checks load the model's HF config and tokenizer: the project's tiny local Qwen2, no download."""
    from sorl_verl.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("model") / "Qwen2.5-3B", vocab_size=300)


# One algorithm per code path of verl's validation: token critic (gae), no critic (grpo), turn critic.
VALIDATED_ALGOS = ["ppo", "so_grpo", "st_ppo_turn_gae"]


@pytest.mark.slow  # imports verl and builds a tiny model: ~30 s on a loaded 2-core machine
@pytest.mark.parametrize("recipe", TRAIN_RECIPES, ids=lambda p: p.parent.name)
def test_verl_accepts_the_values(recipe, tmp_path, tiny_model):
    """verl's own start-up validation (what main_ppo.main runs first): batch divisibility, the actor's
    and critic's dataclasses (loss names, aggregation mode, micro batches), the critic/reference switches."""
    from verl.trainer.main_ppo import need_critic, need_reference_policy
    from verl.utils.config import validate_config

    for algo in VALIDATED_ALGOS:
        critic = ALGOS[algo].critic
        _, commands = dry_run(recipe, tmp_path, ALGO=algo, MODEL=str(tiny_model), HF_HUB_OFFLINE="1")
        cfg = compose(trainer_overrides(commands))
        with open_dict(cfg):
            del cfg["hydra"]  # what main_ppo.main receives has no hydra node
        assert need_critic(cfg) == critic, algo
        assert need_reference_policy(cfg), algo  # KL to the reference in every recipe (Search-R1)
        validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))


# The overrides examples/common.sh's bash case statement printed for every ALGO with RECORDED_ENV,
# recorded from that function when the table in sorl_verl/recipes.py replaced it: the table must
# reproduce them line for line, in order.
RECORDED_ENV = {
    "MODEL": "m/M",
    "CRITIC_LR": "1e-5",
    "CRITIC_WARMUP_RATIO": "0.015",
    "MICRO_BATCH_PER_GPU": "8",
    "FSDP_OFFLOAD": "False",
    "KL_COEF": "0.001",
    "GROUP_SIZE": "5",
}
_RECORDED_CRITIC = [
    "critic.model.path=m/M",
    "critic.optim.lr=1e-5",
    "critic.optim.lr_warmup_steps_ratio=0.015",
    "critic.ppo_micro_batch_size_per_gpu=8",
    "critic.fsdp.param_offload=False",
    "critic.fsdp.optimizer_offload=False",
    "algorithm.use_kl_in_reward=True",
    "algorithm.kl_ctrl.kl_coef=0.001",
    "actor_rollout_ref.rollout.n=1",
]
_RECORDED_GROUP = [
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef=0.001",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.rollout.n=5",
]
_RECORDED_ABSOLUTE = [  # with SORL_NORMALIZATION=absolute, right after the loss
    "actor_rollout_ref.actor.policy_loss._target_=sorl_verl.algos.config.SorlPolicyLossConfig",
    "+actor_rollout_ref.actor.policy_loss.normalization=absolute",
]
RECORDED = {  # ALGO -> estimator, loss, the ALGO's own overrides, its family's
    "ppo": ["algorithm.adv_estimator=gae", "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla", *_RECORDED_CRITIC],
    "grpo": ["algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla", *_RECORDED_GROUP],
    "turn_ppo": [
        "algorithm.adv_estimator=gae",
        "actor_rollout_ref.actor.policy_loss.loss_mode=turn_ppo",
        *_RECORDED_CRITIC,
    ],
    "s_ppo": ["algorithm.adv_estimator=gae", "actor_rollout_ref.actor.policy_loss.loss_mode=s_ppo", *_RECORDED_CRITIC],
    "st_ppo": [
        "algorithm.adv_estimator=gae",
        "actor_rollout_ref.actor.policy_loss.loss_mode=st_ppo",
        *_RECORDED_CRITIC,
    ],
    "so_ppo": [
        "algorithm.adv_estimator=gae",
        "actor_rollout_ref.actor.policy_loss.loss_mode=so_ppo",
        *_RECORDED_CRITIC,
    ],
    "st_ppo_turn_gae": [
        "algorithm.adv_estimator=turn_gae",
        "actor_rollout_ref.actor.policy_loss.loss_mode=st_ppo",
        "critic.enable=True",
        "trainer.v1.trainer_mode=sorl_sync",
        *_RECORDED_CRITIC,
    ],
    "so_grpo": [
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.policy_loss.loss_mode=so_ppo",
        *_RECORDED_GROUP,
    ],
    "gspo": [
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
        "actor_rollout_ref.actor.clip_ratio_low=3e-4",
        "actor_rollout_ref.actor.clip_ratio_high=4e-4",
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
        *_RECORDED_GROUP,
    ],
    "cispo": ["algorithm.adv_estimator=grpo", "actor_rollout_ref.actor.policy_loss.loss_mode=cispo", *_RECORDED_GROUP],
}
# SORL_NORMALIZATION is refused for the ALGOs whose loss is not a SORL loss
RECORDED_NORMALIZATION_REFUSED = {"ppo", "grpo", "gspo", "cispo"}


def shell_algo_overrides(algos, **env: str) -> tuple[dict[str, list[str] | None], str]:
    """({ALGO: what common.sh's sorl_algo_overrides put in ALGO_OVERRIDES, None when it exited}, stderr).

    The environment holds nothing but RECORDED_ENV, ``env`` and PATH/HOME: no PYTHONPATH, so common.sh
    itself must find the checkout's table.
    """
    script = (
        f'source "{EXAMPLES / "common.sh"}"\n'
        'for a in "$@"; do (sorl_algo_overrides "$a" && printf "%s\\n" "== $a" "${ALGO_OVERRIDES[@]}") '
        '|| echo "== $a exit $?"; done\n'
    )
    full_env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/"), "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", "-c", script, "bash", *algos], capture_output=True, text=True, env={**full_env, **RECORDED_ENV, **env}
    )
    assert done.returncode == 0, done.stderr
    out: dict[str, list[str] | None] = {}
    for line in done.stdout.splitlines():
        if line.startswith("== "):
            name, _, status = line[3:].partition(" ")
            out[name] = None if status else []
            if status:
                assert status == "exit 2", line
        else:
            out[name].append(line)
    return out, done.stderr


def test_the_table_prints_what_the_shell_case_statement_did():
    assert set(RECORDED) == set(ALGOS)
    got, _ = shell_algo_overrides(list(ALGOS))
    for algo, expected in RECORDED.items():
        assert got[algo] == expected, algo
        assert algo_overrides(algo, RECORDED_ENV) == expected, algo

    got, stderr = shell_algo_overrides(list(ALGOS), SORL_NORMALIZATION="absolute")
    for algo, expected in RECORDED.items():
        if algo in RECORDED_NORMALIZATION_REFUSED:
            assert got[algo] is None, algo
            assert f"SORL_NORMALIZATION applies to the SORL losses, not ALGO={algo}" in stderr
        else:
            assert got[algo] == expected[:2] + _RECORDED_ABSOLUTE + expected[2:], algo

    got, _ = shell_algo_overrides(["gspo"], GSPO_CLIP_LOW="1e-3", GSPO_CLIP_HIGH="2e-3")
    assert got["gspo"][2:4] == [
        "actor_rollout_ref.actor.clip_ratio_low=1e-3",
        "actor_rollout_ref.actor.clip_ratio_high=2e-3",
    ]


def test_an_unknown_algo_exits_2_naming_the_choices(capsys):
    got, stderr = shell_algo_overrides(["ppo2"])
    assert got == {"ppo2": None}
    assert "unknown ALGO=ppo2 (ppo grpo turn_ppo s_ppo st_ppo so_ppo st_ppo_turn_gae so_grpo gspo cispo)" in stderr
    assert recipes_main(["family", "ppo2"]) == 2
    assert "unknown ALGO=ppo2" in capsys.readouterr().err


def test_recipes_command_line(capsys, monkeypatch):
    for name in RECORDED_ENV:
        monkeypatch.delenv(name, raising=False)
    assert recipes_main(["family", "gspo"]) == 0 and capsys.readouterr().out == "group\n"
    assert recipes_main(["family", "st_ppo_turn_gae"]) == 0 and capsys.readouterr().out == "critic\n"
    # a variable the ALGO's overrides need and nobody gave
    assert recipes_main(["overrides", "grpo", "--set", "KL_COEF=0.01"]) == 2
    assert "GROUP_SIZE is not set" in capsys.readouterr().err
    # --set wins over the environment
    monkeypatch.setenv("GROUP_SIZE", "3")
    assert recipes_main(["overrides", "grpo", "--set", "KL_COEF=0.01", "--set", "GROUP_SIZE=4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "actor_rollout_ref.rollout.n=4" and lines[-3] == "actor_rollout_ref.actor.kl_loss_coef=0.01"
    assert recipes_main(["overrides", "grpo", "--set", "KL_COEF"]) == 2
    assert "NAME=VALUE" in capsys.readouterr().err


def test_run_demo_takes_the_batch_of_the_algos_family():
    # 64 trajectories per step for every ALGO: the critic-free ones sample GROUP_SIZE (8) per prompt
    script = (EXAMPLES / "quickstart" / "run_demo.sh").read_text()
    assert "sorl_verl.recipes family" in script
    assert {a.name for a in ALGOS.values() if a.group} == {"grpo", "so_grpo", "gspo", "cispo"}


def _defaulted(script: Path) -> set[str]:
    """The variables ``script`` reads with a default, ``${NAME:-...}``."""
    return set(re.findall(r"\$\{([A-Z_][A-Z0-9_]*):-", script.read_text(encoding="utf-8")))


def test_the_launcher_variable_lists_match_the_scripts():
    """The sweep drops an inherited launcher variable by these lists (sorl_verl.stability.sweep.launcher_knobs):
    a variable the scripts read and the lists miss would change a run unseen."""
    assert _defaulted(EXAMPLES / "common.sh") == RECIPE_VARIABLES
    demo = _defaulted(EXAMPLES / "quickstart" / "run_demo.sh")
    assert demo <= LAUNCHER_VARIABLES | RECIPE_VARIABLES
    assert LAUNCHER_VARIABLES <= demo  # no stale entry
