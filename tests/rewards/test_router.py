"""The data_source router, and the rewards loaded and called through verl 0.9.1's own reward manager."""

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

import reward_fns
from reward_fns import DATA_SOURCE_FAMILY, METRIC_KEYS, compute_score, reward_name_for

CASES = [
    ("nq", "<answer>Paris</answer>", {"target": ["Paris"]}, None),
    ("bamboogle", "<answer>Paris</answer>", {"target": ["Paris"]}, None),
    ("medqa", "<answer>B</answer>", {"target": ["B"]}, {"choices": ["x", "y", "z", "w"]}),
    ("mmlu_med", "<answer>B</answer>", {"target": ["B"]}, {"choices": ["x", "y", "z", "w"]}),
    ("aime2024", "\\boxed{42}", {"target": ["42"]}, None),
    ("math_dapo", "Answer: 42", "42", None),
]


@pytest.mark.parametrize("data_source, response, gold, info", CASES)
def test_routes_every_family_with_the_same_metric_keys(data_source, response, gold, info):
    result = compute_score(data_source, response, gold, info)
    assert result["score"] == 1.0
    assert tuple(result) == METRIC_KEYS  # verl takes the key set from a batch's first sample


def test_every_search_r1_and_medical_name_is_routed():
    for name in ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique", "bamboogle"):
        assert reward_name_for(name) == "qa_em"
        assert reward_name_for(name, qa_reward="qa_em_format") == "qa_em_format"
    for name in ("medqa", "medmcqa", "pubmedqa", "mmlu_med"):
        assert reward_name_for(name) == "mcqa"
    assert reward_name_for(np.str_("nq")) == "qa_em"  # numpy strings from a parquet column


def test_unknown_data_source_fails_clearly():
    with pytest.raises(ValueError, match="No reward for data_source='squad'.*Known data sources"):
        compute_score("squad", "<answer>x</answer>", {"target": ["x"]})


def test_extra_info_reward_fn_overrides_the_table():
    info = {"reward_fn": "qa_em"}
    assert compute_score("my_toy_set", "<answer>Paris</answer>", {"target": ["Paris"]}, info)["score"] == 1.0
    with pytest.raises(ValueError, match="not a reward"):
        compute_score("my_toy_set", "x", {"target": ["x"]}, {"reward_fn": "bleu"})


def test_reward_kwargs_reach_only_the_rewards_that_take_them():
    wrong = "<think>a</think><answer>Lyon</answer>"
    assert compute_score("nq", wrong, {"target": ["Paris"]}, format_score=0.1)["score"] == pytest.approx(0.1)
    # format_score is qa_em's; mcqa does not take it and is not disturbed by it.
    assert compute_score("medqa", "<answer>A</answer>", {"target": ["A"]}, None, format_score=0.1)["score"] == 1.0
    result = compute_score("nq", wrong, {"target": ["Paris"]}, qa_reward="qa_em_format", structure_format_score=0.3)
    assert result["score"] == pytest.approx(0.3)
    with pytest.raises(ValueError, match="Unknown reward kwargs"):
        compute_score("nq", wrong, {"target": ["Paris"]}, fromat_score=0.1)


class CharTokenizer:
    """Token id = code point; enough for verl's reward manager, which only decodes the response."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(int(i)) for i in ids if int(i) > 0)


def test_verl_reward_manager_loads_and_calls_the_router():
    from verl import DataProto
    from verl.trainer.ppo.reward import load_reward_manager

    config = OmegaConf.create(
        {
            "reward": {
                "custom_reward_function": {
                    "path": "pkg://reward_fns",
                    "name": "compute_score",
                    "reward_kwargs": {"qa_reward": "qa_em_format"},
                },
                "reward_manager": {"source": "register", "name": "naive"},
                "reward_model": {"enable": False},
            }
        }
    )
    manager = load_reward_manager(config, CharTokenizer())
    rows = [
        ("nq", "<think>t</think><answer>Paris</answer>", {"target": np.array(["Paris"])}, {"choices": []}),
        ("medqa", "<answer>(C)</answer>", {"target": np.array(["C"])}, {"choices": ["a", "b", "c", "d"]}),
        ("aime2024", "\\boxed{7}", {"target": np.array(["8"])}, {"choices": []}),
    ]
    width = max(len(r[1]) for r in rows)
    responses = torch.zeros(len(rows), width, dtype=torch.long)
    attention = torch.zeros(len(rows), 2 + width, dtype=torch.long)
    attention[:, :2] = 1
    for i, (_, text, _, _) in enumerate(rows):
        responses[i, : len(text)] = torch.tensor([ord(c) for c in text])
        attention[i, 2 : 2 + len(text)] = 1
    data = DataProto.from_dict(
        tensors={"responses": responses, "attention_mask": attention},
        non_tensors={
            "data_source": np.array([r[0] for r in rows], dtype=object),
            "reward_model": np.array([{"ground_truth": r[2], "style": "rule"} for r in rows], dtype=object),
            "extra_info": np.array([r[3] for r in rows], dtype=object),
        },
    )
    outputs = [manager.loop.run_until_complete(manager.run_single(data[i : i + 1])) for i in range(len(rows))]
    assert [o["reward_score"] for o in outputs] == [1.0, 1.0, 0.0]
    assert all(tuple(o["reward_extra_info"]) == METRIC_KEYS for o in outputs)
    assert outputs[0]["reward_extra_info"]["format_ok"] == 1.0  # qa_em_format was selected through reward_kwargs


def test_table_covers_the_documented_names():
    assert set(DATA_SOURCE_FAMILY) == {
        *reward_fns.SEARCH_R1_SOURCES,
        *reward_fns.MEDICAL_SOURCES,
        *reward_fns.MATH_SOURCES,
    }
