"""Reward throughput (responses/s) on typical responses, and seconds on 1 MB adversarial outputs.

A reward worker scores every rollout; these figures show it is never the bottleneck and stays linear
on pathological outputs (the tests only guard against hangs).
"""

import time

from reward_fns import compute_score

TYPICAL = {
    "nq (qa_em)": ("nq", "<think>x</think><search>q</search><information>Doc 1 Paris</information>"
               "<think>y</think><answer>the City of Paris</answer>", {"target": ["Paris", "City of Paris"]}, None, {}),
    "nq (qa_em_format)": ("nq", "<think>x</think><search>q</search><information>Doc 1 Paris</information>"
                      "<think>y</think><answer>Lyon</answer>", {"target": ["Paris"]}, None, {"qa_reward": "qa_em_format"}),
    "medqa (mcqa)": ("medqa", "<think>x</think><answer>The answer is (B)</answer>", {"target": ["B"]},
                     {"choices": ["alpha", "beta", "gamma", "delta"]}, {}),
    "aime2024 (math)": ("aime2024", "so $x=\\frac{3}{4}$ and \\boxed{\\dfrac{3}{4}}", {"target": ["0.75"]}, None, {}),
}
MB = 1 << 20
HUGE = {
    "unclosed <answer> x 131k": "<answer>" * (MB // 8),
    "1 MB of spaces in an answer": "<answer>answer is" + " " * MB + "x</answer>",
    "1 MB nested braces": "\\boxed{" + "{" * MB + "}" * MB + "}",
}


# Many aliases / golds against one huge answer: the cost must be linear in answer + aliases, not their product.
ALIASES = {"target": [f"alias number {i} of the answer" for i in range(1000)]}
WORDS = ("paris city light river seine alias number answer " * (MB // 48))[:MB]
MANY_GOLDS = {
    "qa_em: 1 MB answer x 1000 aliases": ("nq", f"<answer>{WORDS}</answer>", ALIASES, {}),
    "qa_em: 5 MB answer x 1000 aliases": ("nq", f"<answer>{WORDS * 5}</answer>", ALIASES, {}),
    "qa_em_format: 1 MB x 1000 aliases": ("nq", f"<think>t</think><answer>{WORDS}</answer>", ALIASES,
                                          {"qa_reward": "qa_em_format"}),
    "math: 999 digits x 1000 golds": ("aime2024", "\\boxed{" + "9" * 999 + "x}",
                                      {"target": [str(i) * 3 for i in range(1000)]}, {}),
}


def main():
    print(f"{'typical response':<24} {'responses/s':>12}")
    for name, (source, text, gold, info, kwargs) in TYPICAL.items():
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < 0.5:
            compute_score(source, text, gold, info, **kwargs)
            n += 1
        print(f"{name:<24} {n / (time.perf_counter() - start):>12,.0f}")
    print(f"\n{'1 MB adversarial output':<32} {'s (all 4 rewards)':>18}")
    for name, text in HUGE.items():
        start = time.perf_counter()
        for source, _, gold, info, kwargs in TYPICAL.values():
            compute_score(source, text, gold, info, **kwargs)
        print(f"{name:<32} {time.perf_counter() - start:>18.3f}")
    print(f"\n{'one answer, many golds':<36} {'s':>8}")
    for name, (source, text, gold, kwargs) in MANY_GOLDS.items():
        start = time.perf_counter()
        compute_score(source, text, gold, None, **kwargs)
        print(f"{name:<36} {time.perf_counter() - start:>8.3f}")


if __name__ == "__main__":
    main()
