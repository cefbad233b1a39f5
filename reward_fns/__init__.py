"""Rule rewards for the Search-R1 QA sets, the MIRAGE medical sets and competition math, plus a router.

Each reward is a verl custom reward ``compute_score(data_source, solution_str, ground_truth, extra_info=None)``
returning a dict with ``score`` and the extra metrics of :data:`reward_fns._text.METRIC_KEYS` (the same
keys for every reward, which verl needs when one batch mixes task families):

=================  ========================================  =========================================
reward             module (``custom_reward_function.path``)  data sources routed to it
=================  ========================================  =========================================
``qa_em``          ``pkg://reward_fns.qa_em``                nq, triviaqa, popqa, hotpotqa,
                                                             2wikimultihopqa, musique, bamboogle
``qa_em_format``   ``pkg://reward_fns.qa_em_format``         the same, with ``qa_reward=qa_em_format``
``mcqa``           ``pkg://reward_fns.mcqa``                 medqa, medmcqa, pubmedqa, mmlu_med
``math``           ``pkg://reward_fns.math``                 dapo_math, math_dapo, aime2024
=================  ========================================  =========================================

The router :func:`compute_score` (``pkg://reward_fns``) picks the reward by ``data_source``, so one run
can mix families. A row whose ``extra_info`` has ``reward_fn`` (one of the names above) uses that reward
whatever its data source: the way to score a custom data set without editing this table.
"""

from __future__ import annotations

import inspect

from reward_fns import math as math_reward
from reward_fns import mcqa, qa_em, qa_em_format
from reward_fns._text import METRIC_KEYS

REWARDS = {
    "qa_em": qa_em.compute_score,
    "qa_em_format": qa_em_format.compute_score,
    "mcqa": mcqa.compute_score,
    "math": math_reward.compute_score,
}

SEARCH_R1_SOURCES = ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle")
MEDICAL_SOURCES = ("medqa", "medmcqa", "pubmedqa", "mmlu_med")
# dapo_math and aime2024 are what data_prep.math writes; math_dapo is the data_source of
# BytedTsinghua-SIA/DAPO-Math-17k's published parquet, so that file can be used as is.
MATH_SOURCES = ("dapo_math", "math_dapo", "aime2024")

# data_source -> reward family ("qa" resolves to qa_em or qa_em_format by the router's `qa_reward`).
DATA_SOURCE_FAMILY = {
    **{name: "qa" for name in SEARCH_R1_SOURCES},
    **{name: "mcqa" for name in MEDICAL_SOURCES},
    **{name: "math" for name in MATH_SOURCES},
}

# verl passes these to every custom reward when a reward-model router is configured; no rule reward uses them.
_VERL_RUNTIME_KWARGS = frozenset({"reward_router_address", "reward_model_tokenizer"})


def _accepted_kwargs(fn) -> frozenset[str]:
    parameters = inspect.signature(fn).parameters
    return frozenset(parameters) - {"data_source", "solution_str", "ground_truth", "extra_info"}


_ACCEPTED = {name: _accepted_kwargs(fn) for name, fn in REWARDS.items()}
_ANY_ACCEPTED = frozenset().union(*_ACCEPTED.values())


def reward_name_for(data_source, extra_info=None, qa_reward: str = "qa_em") -> str:
    """The reward a row is scored with; ValueError naming the known data sources when there is none."""
    override = extra_info.get("reward_fn") if isinstance(extra_info, dict) else None
    if override is not None and not isinstance(override, str):
        raise ValueError(f"extra_info.reward_fn must be a reward name (a string), got {type(override).__name__} "
                         f"{override!r:.80}; choose one of {sorted(REWARDS)}")
    if override:
        if override not in REWARDS:
            raise ValueError(f"extra_info.reward_fn={override!r} is not a reward; choose one of {sorted(REWARDS)}")
        return str(override)
    family = DATA_SOURCE_FAMILY.get(str(data_source))
    if family is None:
        raise ValueError(
            f"No reward for data_source={data_source!r}. Known data sources: {sorted(DATA_SOURCE_FAMILY)}; "
            f"or set extra_info.reward_fn to one of {sorted(REWARDS)}."
        )
    if family == "qa":
        if qa_reward not in ("qa_em", "qa_em_format"):
            raise ValueError(f"qa_reward={qa_reward!r}: choose 'qa_em' or 'qa_em_format'")
        return qa_reward
    return family


def compute_score(data_source, solution_str, ground_truth, extra_info=None, qa_reward: str = "qa_em", **reward_kwargs):
    """Router: score one response with the reward of its ``data_source`` (table in the module docstring).

    ``reward_kwargs`` (verl's ``custom_reward_function.reward_kwargs``) go to each reward that takes them,
    e.g. ``format_score`` to qa_em or ``structure_format_score`` to qa_em_format; a keyword no reward
    takes is a ValueError, so a typo never passes silently.
    """
    unknown = set(reward_kwargs) - _ANY_ACCEPTED - _VERL_RUNTIME_KWARGS
    if unknown:
        raise ValueError(f"Unknown reward kwargs {sorted(unknown)}; the rewards take {sorted(_ANY_ACCEPTED)}")
    name = reward_name_for(data_source, extra_info, qa_reward)
    kwargs = {key: value for key, value in reward_kwargs.items() if key in _ACCEPTED[name]}
    return REWARDS[name](
        data_source=data_source, solution_str=solution_str, ground_truth=ground_truth, extra_info=extra_info, **kwargs
    )


__all__ = ["METRIC_KEYS", "REWARDS", "DATA_SOURCE_FAMILY", "compute_score", "reward_name_for"]
