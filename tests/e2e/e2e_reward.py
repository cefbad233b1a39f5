"""Reward for the e2e runs: Search-R1's exact match plus a small length-dependent term.

A random tiny model never answers correctly, so exact match alone gives all-zero rewards,
zero GRPO advantages and no update; the length term makes rewards differ within a group so
that the losses produce gradients and the weights must change.
"""

from reward_fns.qa_em import compute_score as qa_em_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    exact = qa_em_score(data_source, solution_str, ground_truth, extra_info)["score"]
    return float(exact) + (len(solution_str) % 17) / 17.0
