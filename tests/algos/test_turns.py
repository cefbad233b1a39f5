"""Turn segmentation against a plain Python reference."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sorl_verl.algos.turns import segment_turns


def reference_turns(mask):
    """Per row, the list of turns as lists of token positions (slow, obvious)."""
    rows = []
    for row in mask.tolist():
        turns, current = [], []
        for position, on in enumerate(row):
            if on:
                current.append(position)
            elif current:
                turns.append(current)
                current = []
        if current:
            turns.append(current)
        rows.append(turns)
    return rows


def check_against_reference(mask):
    segments = segment_turns(mask)
    rows = reference_turns(mask)
    expected_ids = torch.full(mask.shape, -1, dtype=torch.long)
    lengths, turn_row, turn_index = [], [], []
    next_id = 0
    for row, turns in enumerate(rows):
        for k, turn in enumerate(turns):
            expected_ids[row, turn] = next_id
            lengths.append(len(turn))
            turn_row.append(row)
            turn_index.append(k)
            next_id += 1
    assert segments.num_turns == next_id
    assert torch.equal(segments.token_turn_id, expected_ids)
    assert segments.turn_lengths.tolist() == lengths
    assert segments.turn_row.tolist() == turn_row
    assert segments.turn_index.tolist() == turn_index
    assert segments.turns_per_row.tolist() == [len(turns) for turns in rows]

    values = torch.randn(mask.shape, dtype=torch.float64)
    sums = segments.segment_sum(values)
    means = segments.segment_mean(values)
    for turn_id, (row, turn) in enumerate((r, t) for r, ts in enumerate(rows) for t in ts):
        assert torch.isclose(sums[turn_id], values[row, turn].sum())
        assert torch.isclose(means[turn_id], values[row, turn].mean())
    broadcast = segments.broadcast(means, fill=-7.0)
    for row, turns in enumerate(rows):
        for turn in turns:
            assert torch.allclose(broadcast[row, turn], means[expected_ids[row, turn[0]]])
    assert torch.all(broadcast[~mask.bool()] == -7.0)


def test_hand_made_mask_with_edge_cases():
    mask = torch.tensor(
        [
            [1, 1, 0, 0, 1, 1, 1, 0],  # two turns
            [0, 0, 0, 0, 0, 0, 0, 0],  # all masked: no turn
            [1, 0, 1, 0, 1, 1, 1, 1],  # one-token turns, last turn cut by the response length
            [0, 1, 1, 1, 1, 1, 1, 1],  # a single turn to the end
        ]
    )
    check_against_reference(mask)
    segments = segment_turns(mask)
    assert segments.turn_lengths.tolist() == [2, 3, 1, 1, 4, 7]
    assert segments.turns_per_row.tolist() == [2, 0, 3, 1]


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 5),
    length=st.integers(1, 17),
    density=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**16),
)
def test_random_masks_match_reference(rows, length, density, seed):
    generator = torch.Generator().manual_seed(seed)
    mask = torch.rand(rows, length, generator=generator) < density
    check_against_reference(mask)


def test_segment_sum_ignores_nonfinite_off_mask_values_and_is_differentiable():
    mask = torch.tensor([[1, 1, 0, 1], [0, 1, 1, 0]], dtype=torch.bool)
    values = torch.tensor([[1.0, 2.0, float("nan"), 3.0], [float("-inf"), 4.0, 5.0, float("inf")]], requires_grad=True)
    segments = segment_turns(mask)
    means = segments.segment_mean(values)
    assert means.tolist() == [1.5, 3.0, 4.5]
    means.sum().backward()
    expected_grad = torch.tensor([[0.5, 0.5, 0.0, 1.0], [0.0, 0.5, 0.5, 0.0]])
    assert torch.equal(values.grad, expected_grad)


def test_rejects_non_2d_mask():
    try:
        segment_turns(torch.ones(3))
    except ValueError as error:
        assert "(batch, response_len)" in str(error)
    else:
        raise AssertionError("a 1-d mask must be rejected")
