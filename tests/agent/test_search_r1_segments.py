"""The ``search_r1`` loop in segment mode, and the episode pool driving it, on a scripted policy.

An episode cut into segments and carried over must be the same episode, token for token, as the
one generated whole; staggered placement spreads the trained turn positions from the first step.
"""

import asyncio

import pytest
import torch

from sorl_verl.agent.segments import SEGMENT_KEY, STATE_KEY, EpisodePool, SegmentConfig, segment_rollout_metrics

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# max_turns=2: two search turns, then the final (answer) turn: a horizon of 3 model turns
TURNS = [
    "<search> capital France </search>",
    "no action here",  # invalid: the corrective observation follows
    "<answer> Paris </answer>",
]


@pytest.fixture(autouse=True)
def fake_search(monkeypatch, fake_retriever):
    """Every search goes to the fake retriever (the loop imports ``get_client`` by name)."""
    from sorl_verl.agent import retrieval_client, search_r1_loop

    client = retrieval_client.RetrievalClient.from_retriever(fake_retriever, "fake")
    monkeypatch.setattr(search_r1_loop, "get_client", lambda spec, http: client)


def run_whole(build_search_r1, scripted_server, turns=TURNS, **options):
    server = scripted_server(turns)

    async def main():
        loop = build_search_r1(server, **options)
        return await loop.run({"temperature": 1.0}, raw_prompt=QUESTION)

    return asyncio.run(main()), server


def run_segments(build_search_r1, scripted_server, turns=TURNS, segment_turns=1, start_fraction=0.0, **options):
    """Segments of one episode until it ends, each continuing the previous one's state."""
    server = scripted_server(turns)
    outputs = []

    async def main():
        loop = build_search_r1(server, **options)
        state = None
        while True:
            segment = {"episode_id": 7, "turns": segment_turns, "start_fraction": start_fraction, "state": state}
            output = await loop.run({"temperature": 1.0}, raw_prompt=QUESTION, **{SEGMENT_KEY: segment})
            outputs.append(output)
            info = output.extra_fields[STATE_KEY]
            if info["done"]:
                return
            state = info["state"]

    asyncio.run(main())
    return outputs, server


def strip_bootstrap(output):
    """The segment's own tokens: without the extra mask-0 token of an unfinished segment."""
    cut = len(output.response_ids) - (0 if output.extra_fields[STATE_KEY]["done"] else 1)
    logprobs = output.response_logprobs[:cut] if output.response_logprobs else None
    return output.response_ids[:cut], output.response_mask[:cut], logprobs


def test_segments_continue_the_episode_bit_for_bit(build_search_r1, scripted_server, tokenizer):
    whole, whole_server = run_whole(build_search_r1, scripted_server)
    segments, segment_server = run_segments(build_search_r1, scripted_server, segment_turns=1)

    assert [s.extra_fields[STATE_KEY]["done"] for s in segments] == [False, False, True]
    assert [s.extra_fields[STATE_KEY]["first_turn"] for s in segments] == [0, 1, 2]
    assert [s.extra_fields[STATE_KEY]["turns"] for s in segments] == [1, 1, 1]
    # the policy saw exactly the same contexts
    assert [c["prompt_ids"] for c in segment_server.calls] == [c["prompt_ids"] for c in whole_server.calls]

    carried_ids, carried_mask, carried_logprobs = [], [], []
    for segment in segments:
        # the trained prompt is the question plus the context carried so far, bit for bit
        assert segment.prompt_ids == whole.prompt_ids + carried_ids
        ids, mask, logprobs = strip_bootstrap(segment)
        carried_ids, carried_mask, carried_logprobs = (
            carried_ids + ids,
            carried_mask + mask,
            carried_logprobs + logprobs,
        )
    assert carried_ids == whole.response_ids
    assert carried_mask == whole.response_mask
    assert carried_logprobs == whole.response_logprobs  # per-token log-probs stay aligned

    for segment in segments[:-1]:
        # unfinished: one extra mask-0 token (the bootstrap position), reward 0 without the reward function
        assert segment.response_mask[-1] == 0 and segment.response_ids[-1] == tokenizer.pad_token_id
        assert segment.reward_score == 0.0
    assert segments[-1].reward_score is None  # the reward function scores the episode's last segment
    assert segments[-1].extra_fields["search_r1_answered"] is True
    # the carried state's turn versions cover every model turn before the next segment
    assert len(segments[1].extra_fields[STATE_KEY]["context_turn_versions"]) == 1


def test_staggered_warmup_is_context_and_the_segment_starts_after_it(build_search_r1, scripted_server):
    whole, _ = run_whole(build_search_r1, scripted_server)
    # fraction 0.4 of a 3-turn horizon: one warm-up turn, then a 1-turn segment
    segments, _ = run_segments(build_search_r1, scripted_server, segment_turns=1, start_fraction=0.4)
    first = segments[0].extra_fields[STATE_KEY]
    assert first["first_turn"] == 1 and first["turns"] == 1 and not first["done"]
    assert len(first["context_turn_versions"]) == 1  # the warm-up turn is context
    starts = [i for i, m in enumerate(whole.response_mask) if m and (i == 0 or not whole.response_mask[i - 1])]
    # prompt = question + the warm-up turn and its observation; response = the 2nd turn onwards
    assert segments[0].prompt_ids == whole.prompt_ids + whole.response_ids[: starts[1]]
    assert strip_bootstrap(segments[0])[0] == whole.response_ids[starts[1] : starts[2]]
    assert [s.extra_fields[STATE_KEY]["first_turn"] for s in segments] == [1, 2]


def test_episode_that_ends_in_its_warmup_trains_its_last_turn(build_search_r1, scripted_server):
    segments, _ = run_segments(build_search_r1, scripted_server, turns=["<answer> Paris </answer>"], start_fraction=0.9)
    assert len(segments) == 1
    info = segments[0].extra_fields[STATE_KEY]
    assert info["done"] and info["first_turn"] == 0 and info["turns"] == 1
    assert segments[0].response_mask[-1] == 1 and 1 in segments[0].response_mask


def test_context_outgrowing_the_budget_ends_the_episode_without_error(build_search_r1, scripted_server):
    long_turn = "<search> " + "word " * 30 + "</search>"
    segments, _ = run_segments(
        build_search_r1, scripted_server, turns=[long_turn], segment_turns=1, response_length=200, max_turns=10
    )
    info = segments[-1].extra_fields[STATE_KEY]
    assert info["done"] and segments[-1].extra_fields["search_r1_truncated"] is True
    assert segments[-1].reward_score is None  # scored by the reward function, as a truncated whole episode
    total = sum(len(strip_bootstrap(s)[0]) for s in segments)
    assert total <= 200
    assert all(len(s.prompt_ids) + len(s.response_ids) <= len(segments[0].prompt_ids) + 200 for s in segments)


def advance_pool(pool, build_search_r1, scripted_server, fetch_rows, turns=TURNS):
    """One step of the segment trainer without Ray: the pool's rows through the real loop."""
    server = scripted_server(turns * 50)

    async def main():
        loop = build_search_r1(server)
        rows = pool.next_rows(fetch_rows)
        return await asyncio.gather(*(loop.run({"temperature": 1.0}, **row) for row in rows))

    outputs = asyncio.run(main())
    states = [o.extra_fields[STATE_KEY] for o in outputs]
    counts = pool.update({s["episode_id"]: s for s in states})
    return outputs, states, counts


def make_fetch(batch=4):
    counter = {"n": 0}

    def fetch_rows():
        rows = []
        for _ in range(batch):
            counter["n"] += 1
            rows.append({"raw_prompt": QUESTION, "index": counter["n"], "dummy_tensor": torch.zeros(1)})
        return rows

    return fetch_rows, counter


def pool_config(resets, turns=1, pool_size=8, seed=3):
    return SegmentConfig(turns=turns, resets=resets, pool_size=pool_size, seed=seed)


def test_staggered_positions_spread_from_step_one_sync_ones_do_not(build_search_r1, scripted_server):
    # a policy that never answers: every episode runs the whole 3-turn horizon
    never_answers = ["<search> capital France </search>"]
    positions = {}
    for resets in ("sync", "staggered"):
        pool = EpisodePool(pool_config(resets), batch_size=8)
        fetch_rows, _ = make_fetch()
        _, states, _ = advance_pool(pool, build_search_r1, scripted_server, fetch_rows, turns=never_answers)
        positions[resets] = segment_rollout_metrics(states)
        assert sorted({s["first_turn"] for s in states}) == ([0] if resets == "sync" else [0, 1, 2])
    assert positions["sync"]["rollout/turn_position_std"] == 0.0
    assert positions["staggered"]["rollout/turn_position_std"] > 0.5
    assert positions["staggered"]["rollout/segment_episode_end_fraction"] > 0  # those placed at the last turn


def test_pool_carries_over_and_replaces_ended_episodes(build_search_r1, scripted_server, tmp_path):
    never_answers = ["<search> capital France </search>"]
    pool = EpisodePool(pool_config("sync", pool_size=4), batch_size=4)
    fetch_rows, counter = make_fetch()
    contexts = {}
    for step in range(4):
        outputs, states, counts = advance_pool(pool, build_search_r1, scripted_server, fetch_rows, turns=never_answers)
        for output, state in zip(outputs, states, strict=True):
            episode = state["episode_id"]
            if episode in contexts:  # carried over: the new prompt continues the previous context exactly
                assert output.prompt_ids == contexts[episode]
            if not state["done"]:
                contexts[episode] = state["state"]["prompt_ids"] + state["state"]["context_ids"]
        # sync: the pool stays in phase; 3-turn episodes end at steps 3, 6, ...
        assert {s["first_turn"] for s in states} == {step % 3}
        assert counts["ended"] == (4 if step % 3 == 2 else 0)
    assert counter["n"] == 8  # the first 4 episodes, then 4 replacements
    assert sorted(e.episode_id for e in pool.slots) == [4, 5, 6, 7]

    # the pool survives a checkpoint: saved, loaded into a new pool, same next rows
    torch.save(pool.state_dict(), tmp_path / "pool.pt")
    restored = EpisodePool(pool_config("sync", pool_size=4), batch_size=4)
    restored.load_state_dict(torch.load(tmp_path / "pool.pt", weights_only=False))
    original_rows = pool.next_rows(fetch_rows)
    restored_rows = restored.next_rows(fetch_rows)
    for a, b in zip(original_rows, restored_rows, strict=True):
        assert a[SEGMENT_KEY] == b[SEGMENT_KEY] and a["index"] == b["index"]
    assert all(row[SEGMENT_KEY]["state"] is not None for row in restored_rows)
