"""The ``search_r1`` agent loop on a scripted policy: Search-R1's protocol, masks, budgets."""

import asyncio
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from sorl_verl.agent.retrieval_client import RetrievalError, format_passages
from sorl_verl.agent.search_r1_loop import (
    INVALID_ACTION_MESSAGE,
    information_block,
    parse_action,
    stop_prefix_length,
)
from sorl_verl.algos.turns import segment_turns

REPO = Path(__file__).resolve().parents[2]


def segments(output):
    """``[(mask_value, token_ids), ...]``: the response split into runs of equal mask."""
    runs = []
    for token_id, mask in zip(output.response_ids, output.response_mask, strict=True):
        if runs and runs[-1][0] == mask:
            runs[-1][1].append(token_id)
        else:
            runs.append((mask, [token_id]))
    return runs


def test_invalid_action_message_is_search_r1s_verbatim():
    # search_r1/llm_agent/generation.py, execute_predictions (backslash-continued f-string).
    assert INVALID_ACTION_MESSAGE == (
        "\nMy previous action is invalid. If I want to search, I should put the query between <search> and "
        "</search>. If I want to give the final answer, I should put the answer between <answer> and </answer>. "
        "Let me try again.\n"
    )
    assert information_block("  Doc 1(Title: x) y\n") == "\n\n<information>Doc 1(Title: x) y</information>\n\n"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>hm</think><search> capital of France </search>", ("search", "capital of France")),
        ("<answer>Paris</answer>", ("answer", "Paris")),
        ("<answer>\nmulti\nline </answer>", ("answer", "multi\nline")),
        ("<search>a</answer>", (None, "")),
        ("no tags at all", (None, "")),
        ("<search></search>", ("search", "")),
        ("<answer>x</answer><search>y</search>", ("answer", "x")),  # first complete pair wins
    ],
)
def test_parse_action_is_search_r1s_regex(text, expected):
    assert parse_action(text) == expected


def test_search_then_answer_masks_exactly_the_model_tokens(run_search_r1, tokenizer, fake_retriever):
    turns = ["<think>I need the capital.</think>\n<search> capital France </search>", "<answer> Paris </answer>"]
    output, server, retriever = run_search_r1(turns, retriever=fake_retriever)

    expected_observation = information_block(format_passages(fake_retriever.search(["capital France"], 3)[0]))
    observation_ids = tokenizer.encode(expected_observation, add_special_tokens=False)
    # Token in, token out: the model's ids come back unchanged (they are a char-level
    # tokenization the BPE would never produce), observations are the only tokenized text.
    assert segments(output) == [(1, server.returned[0]), (0, observation_ids), (1, server.returned[1])]
    assert server.returned[0] != tokenizer.encode(turns[0], add_special_tokens=False)
    assert tokenizer.decode(observation_ids) == expected_observation
    assert 'Doc 1(Title: "Paris") Paris is the capital' in expected_observation
    # The retriever got Search-R1's query: the stripped tag content, topk 3.
    assert retriever.calls[-1] == (["capital France"], 3)

    # Each generation continues the exact token context (prompt + everything so far).
    assert server.calls[1]["prompt_ids"] == output.prompt_ids + server.returned[0] + observation_ids
    assert server.calls[0]["prompt_ids"] == output.prompt_ids
    assert tokenizer.decode(output.prompt_ids).endswith("<|im_start|>assistant\n")
    params = server.calls[0]["sampling_params"]
    assert params["stop"] == ["</search>", "</answer>"] and params["include_stop_str_in_output"] is True
    assert params["temperature"] == 1.0 and params["max_tokens"] == 500
    assert len({call["request_id"] for call in server.calls}) == 1  # one sticky session

    # Log-probs are the server's for model tokens and 0 for observation tokens.
    first, second = len(server.returned[0]), len(server.returned[1])
    assert output.response_logprobs[:first] == [-(1 + p / 1000) for p in range(first)]
    assert output.response_logprobs[first : first + len(observation_ids)] == [0.0] * len(observation_ids)
    assert output.response_logprobs[-second:] == [-(2 + p / 1000) for p in range(second)]

    extra = output.extra_fields
    assert (extra["search_r1_model_turns"], extra["search_r1_searches"], extra["search_r1_invalid_actions"]) == (
        2,
        1,
        0,
    )
    assert extra["search_r1_answered"] is True and extra["search_r1_truncated"] is False
    assert extra["search_r1_actions"] == ["search", "answer"]
    assert output.num_turns == 4  # user + 2 assistant + 1 observation, verl's convention
    assert output.metrics.generate_sequences > 0


def test_turn_segmentation_finds_one_turn_per_model_segment(run_search_r1):
    turns = ["<search> Seine river </search>", "hmm", "<search> Danube </search>", "<answer> ten </answer>"]
    output, _, _ = run_search_r1(turns, max_turns=4)
    mask = torch.tensor([output.response_mask])
    found = segment_turns(mask)
    assert found.num_turns == output.extra_fields["search_r1_model_turns"] == 4
    model_segments = [ids for value, ids in segments(output) if value == 1]
    assert found.turn_lengths.tolist() == [len(ids) for ids in model_segments]
    assert output.extra_fields["search_r1_actions"] == ["search", "invalid", "search", "answer"]


def test_invalid_action_appends_search_r1s_corrective_message(run_search_r1, tokenizer):
    output, server, retriever = run_search_r1(["I am not sure what to do.", "<answer> Paris </answer>"])
    runs = segments(output)
    assert runs[0] == (1, server.returned[0])
    assert runs[1] == (0, tokenizer.encode(INVALID_ACTION_MESSAGE, add_special_tokens=False))
    assert runs[2] == (1, server.returned[1])
    assert output.extra_fields["search_r1_invalid_actions"] == 1
    assert output.extra_fields["search_r1_searches"] == 0 and retriever.calls == []
    assert output.extra_fields["search_r1_answered"] is True


@pytest.mark.parametrize("max_turns", [0, 1, 2, 3])
def test_max_turns_then_one_final_turn_that_is_never_executed(run_search_r1, max_turns):
    output, server, retriever = run_search_r1(["<search> Paris </search>"], max_turns=max_turns)
    # max_turns search steps, then the final generation: its search is recorded, not run.
    assert len(server.calls) == max_turns + 1
    assert len(retriever.calls) == output.extra_fields["search_r1_searches"] == max_turns
    assert [value for value, _ in segments(output)] == [1, 0] * max_turns + [1]
    assert output.extra_fields["search_r1_actions"] == ["search"] * (max_turns + 1)
    assert output.extra_fields["search_r1_answered"] is False
    assert output.extra_fields["search_r1_model_turns"] == max_turns + 1


def test_observations_are_cut_to_their_first_max_obs_length_tokens(run_search_r1, tokenizer, fake_retriever):
    output, server, _ = run_search_r1(
        ["<search> capital France </search>", "<answer> Paris </answer>"], max_obs_length=7, retriever=fake_retriever
    )
    full = tokenizer.encode(
        information_block(format_passages(fake_retriever.search(["capital France"], 3)[0])), add_special_tokens=False
    )
    assert len(full) > 7
    assert segments(output)[1] == (0, full[:7])


def test_returned_tokens_are_cut_after_the_first_completed_stop_tag(run_search_r1, tokenizer):
    # A backend that ignores `stop` keeps generating; the loop cuts after `</search>` itself.
    rambling = "<search> Berlin </search> and more text <answer> Berlin </answer>"
    output, server, retriever = run_search_r1([rambling, "<answer> Berlin </answer>"])
    kept = segments(output)[0][1]
    assert tokenizer.decode(kept) == "<search> Berlin </search>"
    assert kept == server.returned[0][: len(kept)]
    assert retriever.calls[-1][0] == ["Berlin"]
    assert output.extra_fields["search_r1_actions"] == ["search", "answer"]


def test_stop_prefix_length_keeps_the_whole_token_that_completes_the_tag():
    pieces = ["<se", "arch> q </sea", "rch>tail", " more"]
    decode = lambda ids: "".join(pieces[i] for i in ids)  # noqa: E731
    assert stop_prefix_length(decode, [0, 1, 2, 3]) == 3
    assert stop_prefix_length(decode, [0, 1]) == 2  # no complete tag: everything
    assert stop_prefix_length(decode, []) == 0


def test_response_length_budget_is_respected(run_search_r1):
    turns = ["<search> capital France </search>"] * 3
    output, server, _ = run_search_r1(turns, response_length=60, max_turns=3)
    assert len(output.response_ids) == len(output.response_mask) == len(output.response_logprobs) == 60
    assert output.extra_fields["search_r1_truncated"] is True
    # Every request asked for at most what was left of the budget.
    for call in server.calls:
        used = len(call["prompt_ids"]) - len(output.prompt_ids)
        assert call["sampling_params"]["max_tokens"] == min(500, 60 - used)


def test_generation_cut_by_the_budget_ends_the_trajectory(run_search_r1):
    output, server, _ = run_search_r1(["x" * 100], response_length=40)
    assert len(server.calls) == 1
    assert output.response_mask == [1] * 40 and output.response_ids == server.returned[0][:40]
    assert output.extra_fields["search_r1_truncated"] is True


def test_trailing_eos_dropped_before_an_observation_but_kept_at_the_end(run_search_r1, tokenizer, scripted_server):
    eos = tokenizer.eos_token_id
    char_ids = scripted_server([]).char_ids
    first = char_ids("no action") + [eos]
    last = char_ids("<answer> Paris </answer>")
    final = char_ids("still nothing") + [eos]
    output, _, _ = run_search_r1([first, last])
    assert segments(output)[0] == (1, first[:-1])
    output, _, _ = run_search_r1([final], max_turns=0)
    assert output.response_ids == final and output.response_mask == [1] * len(final)


def test_retrieval_failure_raises(run_search_r1):
    class BrokenRetriever:
        def search(self, queries, topk=3):
            return [[{"no": "document"}]]

    with pytest.raises(RetrievalError, match="document.contents"):
        run_search_r1(["<search> x </search>"], retriever=BrokenRetriever())


def test_options_from_the_example_agent_loop_config(build_search_r1, scripted_server):
    entries = OmegaConf.load(REPO / "examples/configs/search_r1_agent.yaml")
    (entry,) = [e for e in entries if e.name == "search_r1"]
    options = {k: v for k, v in entry.items() if k != "_target_"}  # "name" reaches the class, as in verl
    options.update(max_turns=7, topk=5)

    async def build():
        return build_search_r1(scripted_server([]), **options)

    loop = asyncio.run(build())
    assert (loop.max_turns, loop.topk, loop.max_obs_length, loop.max_tokens_per_turn) == (7, 5, 500, 500)
    assert loop.retriever_spec == "embedded"


@pytest.mark.parametrize("bad", [{"max_turns": -1}, {"topk": 0}, {"max_obs_length": 0}, {"max_tokens_per_turn": 1.5}])
def test_bad_options_are_refused_with_their_name(build_search_r1, scripted_server, bad):
    async def build():
        return build_search_r1(scripted_server([]), **bad)

    with pytest.raises(Exception, match=next(iter(bad))):
        asyncio.run(build())


def test_runs_on_the_embedded_wikipedia_index(run_search_r1, tokenizer, monkeypatch, tmp_path):
    """The default retriever: BM25 over the shipped Wikipedia summaries, built into a temp cache."""
    monkeypatch.setenv("SORL_VERL_CACHE", str(tmp_path))
    turns = ["<search> capital of France </search>", "<search></search>", "<answer> Paris </answer>"]
    output, _, _ = run_search_r1(turns, retriever="embedded", max_obs_length=5000, response_length=12000)
    runs = segments(output)
    first_observation = tokenizer.decode(runs[1][1])
    assert first_observation.startswith("\n\n<information>Doc 1(Title: ")
    assert "Doc 3(Title: " in first_observation and "France" in first_observation
    # An empty query (Search-R1 sends it as is) gets an empty information block, not a crash.
    assert tokenizer.decode(runs[3][1]) == information_block("")
    assert output.extra_fields["search_r1_searches"] == 2 and output.extra_fields["search_r1_answered"] is True


def test_runs_against_the_project_retrieval_server_over_http(
    run_search_r1, tokenizer, project_retrieval_server, fake_retriever
):
    # The server wraps its own FakeRetriever; a second one (deterministic) gives the expected hits.
    turns = ["<search> Seine river </search>", "<answer> Paris </answer>"]
    output, _, _ = run_search_r1(turns, retriever=project_retrieval_server + "/retrieve")
    observation = tokenizer.decode(segments(output)[1][1])
    assert observation == information_block(format_passages(fake_retriever.search(["Seine river"], 3)[0]))
    assert output.extra_fields["search_r1_searches"] == 1
