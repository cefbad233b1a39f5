"""The algorithms of the recipes: one table from an ``ALGO`` name to its loss, advantage and overrides.

``examples/common.sh`` (the paper recipes and, through them, the quick starts) turns ``ALGO`` into
verl Hydra overrides with this module's command line::

    python -m sorl_verl.recipes overrides ALGO [--set NAME=VALUE ...]   # one override per line
    python -m sorl_verl.recipes family ALGO                             # "critic" or "group"

The values the overrides hold (``MODEL``, ``CRITIC_LR``, ``KL_COEF``, ``GROUP_SIZE``, ...: the
recipes' variables, :data:`RECIPE_VARIABLES`) are read from ``--set`` first, then from the
environment; an unknown ``ALGO`` exits 2 naming the choices. The stability benchmark
(:mod:`sorl_verl.stability.grid`) and the table tool (:func:`sorl_verl.tables.method_name`) read the
same table, so adding an algorithm is one entry of :data:`ALGOS`.

The module needs the standard library only: a recipe's shell runs it with whatever ``PYTHON`` is,
before verl is imported anywhere.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "ALGOS",
    "CRITIC_OVERRIDES",
    "GROUP_OVERRIDES",
    "LOSS_DEFAULTS",
    "METRIC_PREFIX",
    "NORMALIZATION_OVERRIDES",
    "RECIPE_VARIABLES",
    "SORL_CONFIG_OVERRIDE",
    "Algo",
    "RecipeError",
    "algo_overrides",
    "display_name",
    "get_algo",
]

# Prefix of every metric sorl_verl logs into verl's metrics (losses, correction, async trainers).
METRIC_PREFIX = "actor/sorl/"

# The SORL policy losses (registered into verl by sorl_verl.algos.losses) and the paper's variants:
# which importance ratio and whether the clipping-bias correction is on. Read by
# sorl_verl.algos.config for each loss name's defaults.
LOSS_DEFAULTS: dict[str, dict[str, str]] = {
    "turn_ppo": {"ratio_level": "turn", "normalization": "none"},
    "s_ppo": {"ratio_level": "token", "normalization": "relative"},
    "st_ppo": {"ratio_level": "turn", "normalization": "relative"},
    "so_ppo": {"ratio_level": "turn", "normalization": "relative"},
}

# Makes verl build the actor's policy-loss config as sorl_verl's, which takes the SORL options
# (normalization, norm_scope, tau, kappa: sorl_verl.algos.config).
SORL_CONFIG_OVERRIDE = "actor_rollout_ref.actor.policy_loss._target_=sorl_verl.algos.config.SorlPolicyLossConfig"


@dataclass(frozen=True)
class Algo:
    """One ``ALGO`` of the recipes.

    Args:
        name: the ``ALGO`` value.
        loss_mode: verl's ``actor.policy_loss.loss_mode`` (``vanilla`` is verl's PPO loss; the SORL
            names are registered by sorl_verl on ``import verl``).
        adv_estimator: verl's ``algorithm.adv_estimator``.
        critic: True for the PPO family (a critic, one sample per prompt, KL in the reward: the
            :data:`CRITIC_OVERRIDES`); False for the critic-free family (``GROUP_SIZE`` samples per
            prompt, KL as a loss: the :data:`GROUP_OVERRIDES`).
        display: the paper's name of the method (tables and figures).
        overrides: further Hydra overrides of this algorithm; ``{NAME}`` is a recipe variable,
            ``{NAME:default}`` one with a default when it is unset or empty.
    """

    name: str
    loss_mode: str
    adv_estimator: str
    critic: bool
    display: str
    overrides: tuple[str, ...] = ()

    @property
    def group(self) -> bool:
        """Whether the algorithm samples a group of ``GROUP_SIZE`` responses per prompt (no critic)."""
        return not self.critic

    @property
    def sorl_loss(self) -> bool:
        """Whether the loss is one of the SORL losses (the ones ``SORL_NORMALIZATION`` configures)."""
        return self.loss_mode in LOSS_DEFAULTS


ALGOS: dict[str, Algo] = {
    a.name: a
    for a in (
        Algo("ppo", "vanilla", "gae", True, "PPO"),
        Algo("grpo", "vanilla", "grpo", False, "GRPO"),
        Algo("turn_ppo", "turn_ppo", "gae", True, "Turn-PPO"),
        Algo("s_ppo", "s_ppo", "gae", True, "S-PPO"),
        Algo("st_ppo", "st_ppo", "gae", True, "ST-PPO"),
        # The paper's later name for st_ppo (same defaults); kept so tables can say SO-PPO.
        Algo("so_ppo", "so_ppo", "gae", True, "SO-PPO"),
        # Turn-level critic: one value per turn (sorl_verl.algos.advantages.turn_gae). verl turns the
        # critic on by itself only for gae, and hands values only to gae: hence critic.enable and
        # the sorl_sync trainer, which passes the critic's values to turn_gae.
        Algo(
            "st_ppo_turn_gae",
            "st_ppo",
            "turn_gae",
            True,
            "ST-PPO (turn-GAE)",
            ("critic.enable=True", "trainer.v1.trainer_mode=sorl_sync"),
        ),
        # With a group-relative advantage (no critic) the paper calls so_ppo "SO-GRPO".
        Algo("so_grpo", "so_ppo", "grpo", False, "SO-GRPO"),
        # verl's built-in GSPO (sequence-level ratio, arXiv 2507.18071) with GRPO advantages: the
        # sequence-level baseline of the stability benchmark (sorl_verl.stability). The GSPO paper's
        # settings: its sequence ratio is a per-token geometric mean, so its clip range is ~1000x
        # narrower than PPO's (3e-4 / 4e-4), and the loss is a mean over sequences.
        Algo(
            "gspo",
            "gspo",
            "grpo",
            False,
            "GSPO",
            (
                "actor_rollout_ref.actor.clip_ratio_low={GSPO_CLIP_LOW:3e-4}",
                "actor_rollout_ref.actor.clip_ratio_high={GSPO_CLIP_HIGH:4e-4}",
                "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
            ),
        ),
        # verl's built-in CISPO (clipped, stop-gradient importance weights on every token, arXiv
        # 2506.13585) with GRPO advantages, at verl's clip settings: a baseline users compare against.
        Algo("cispo", "cispo", "grpo", False, "CISPO"),
    )
}

# The PPO family's overrides: the critic (same model as the actor) and Search-R1's PPO: KL penalty
# inside the reward, rollout n=1.
CRITIC_OVERRIDES: tuple[str, ...] = (
    "critic.model.path={MODEL}",
    "critic.optim.lr={CRITIC_LR}",
    "critic.optim.lr_warmup_steps_ratio={CRITIC_WARMUP_RATIO}",
    "critic.ppo_micro_batch_size_per_gpu={MICRO_BATCH_PER_GPU}",
    "critic.fsdp.param_offload={FSDP_OFFLOAD}",
    "critic.fsdp.optimizer_offload={FSDP_OFFLOAD}",
    "algorithm.use_kl_in_reward=True",
    "algorithm.kl_ctrl.kl_coef={KL_COEF}",
    "actor_rollout_ref.rollout.n=1",
)
# The critic-free family's: Search-R1's GRPO, KL as a loss term (low-variance estimator),
# GROUP_SIZE samples per prompt.
GROUP_OVERRIDES: tuple[str, ...] = (
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_coef={KL_COEF}",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.rollout.n={GROUP_SIZE}",
)
# SORL_NORMALIZATION (relative|absolute|none; empty: each loss name's default in LOSS_DEFAULTS):
# the clipping-bias correction of a SORL loss, through sorl_verl's policy-loss config.
NORMALIZATION_OVERRIDES: tuple[str, ...] = (
    SORL_CONFIG_OVERRIDE,
    "+actor_rollout_ref.actor.policy_loss.normalization={SORL_NORMALIZATION}",
)

# The variables examples/common.sh reads with a default (``${NAME:-...}``): the recipes' knobs.
# common.sh documents each; a test checks this list against the script.
RECIPE_VARIABLES: frozenset[str] = frozenset(
    {
        # hardware
        "NNODES",
        "N_GPUS_PER_NODE",
        "ROLLOUT_TP",
        "ROLLOUT_GPU_MEM",
        "FSDP_OFFLOAD",
        # model and algorithm
        "MODEL",
        "ALGO",
        "SORL_NORMALIZATION",
        "GSPO_CLIP_LOW",
        "GSPO_CLIP_HIGH",
        # optimisation
        "ACTOR_LR",
        "CRITIC_LR",
        "ACTOR_WARMUP_RATIO",
        "CRITIC_WARMUP_RATIO",
        "TRAIN_BATCH_SIZE",
        "PPO_MINI_BATCH_SIZE",
        "MICRO_BATCH_PER_GPU",
        "LOG_PROB_MICRO_BATCH_PER_GPU",
        "CLIP_RATIO",
        "KL_COEF",
        "GROUP_SIZE",
        "GAMMA",
        "LAM",
        # schedule
        "TOTAL_STEPS",
        "TOTAL_EPOCHS",
        "SAVE_FREQ",
        "TEST_FREQ",
        # run folder, logging, reward
        "PROJECT",
        "RUN_ROOT",
        "LOGGERS",
        "REWARD_FN",
        # the Search-R1 agent loop
        "RETRIEVER_URL",
        "MAX_TURNS",
        "TOPK",
        "MAX_TOKENS_PER_TURN",
        "MAX_OBS_LENGTH",
        "MAX_PROMPT_LENGTH",
        "MAX_RESPONSE_LENGTH",
        # the shell itself
        "PYTHON",
        "SORL_DRY_RUN",
    }
)


class RecipeError(ValueError):
    """An unknown ALGO, a missing variable or a setting the ALGO refuses; the message says which."""


def get_algo(name: str) -> Algo:
    """The table's entry for ``name``; :class:`RecipeError` naming the choices when there is none."""
    try:
        return ALGOS[name]
    except KeyError:
        raise RecipeError(f"unknown ALGO={name} ({' '.join(ALGOS)})") from None


def _fill(template: str, values: Mapping[str, str]) -> str:
    """``template`` with each ``{NAME}`` / ``{NAME:default}`` replaced by its value (shell ``${NAME:-default}``)."""
    out, rest = [], template
    while "{" in rest:
        head, _, rest = rest.partition("{")
        field, _, rest = rest.partition("}")
        name, has_default, default = field.partition(":")
        value = values.get(name) or ""
        if not value and not has_default:
            raise RecipeError(f"{name} is not set (needed for `{template}`)")
        out += [head, value or default]
    return "".join(out) + rest


def algo_overrides(name: str, values: Mapping[str, str]) -> list[str]:
    """The Hydra overrides of ``ALGO=name``, the recipes' variables taken from ``values``.

    Order: estimator and loss, ``SORL_NORMALIZATION``'s (when set), the algorithm's own, then its
    family's (:data:`CRITIC_OVERRIDES` or :data:`GROUP_OVERRIDES`).
    """
    algo = get_algo(name)
    templates = [
        f"algorithm.adv_estimator={algo.adv_estimator}",
        f"actor_rollout_ref.actor.policy_loss.loss_mode={algo.loss_mode}",
    ]
    if values.get("SORL_NORMALIZATION"):
        if not algo.sorl_loss:
            raise RecipeError(f"SORL_NORMALIZATION applies to the SORL losses, not ALGO={name}")
        templates += NORMALIZATION_OVERRIDES
    templates += algo.overrides
    templates += CRITIC_OVERRIDES if algo.critic else GROUP_OVERRIDES
    return [_fill(t, values) for t in templates]


def display_name(loss_mode: str, adv_estimator: str) -> str | None:
    """The paper's name of the ALGO that runs ``(loss_mode, adv_estimator)``; None when no ALGO does."""
    for algo in ALGOS.values():
        if (algo.loss_mode, algo.adv_estimator) == (loss_mode, adv_estimator):
            return algo.display
    return None


def _parse_set(items: list[str]) -> dict[str, str]:
    values = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise RecipeError(f"--set wants NAME=VALUE, got {item!r}")
        values[name] = value
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sorl_verl.recipes", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    over = sub.add_parser("overrides", help="the ALGO's Hydra overrides, one per line")
    over.add_argument("algo")
    over.add_argument(
        "--set", action="append", default=[], metavar="NAME=VALUE", help="a recipe variable (wins over the environment)"
    )
    family = sub.add_parser(
        "family", help='"critic" (PPO family) or "group" (critic-free, GROUP_SIZE samples per prompt)'
    )
    family.add_argument("algo")
    args = parser.parse_args(argv)
    try:
        if args.command == "family":
            print("critic" if get_algo(args.algo).critic else "group")
        else:
            print("\n".join(algo_overrides(args.algo, {**os.environ, **_parse_set(args.set)})))
    except RecipeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
