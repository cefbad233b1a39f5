"""Turn segmentation of a response from its ``response_mask``, fully vectorized.

A **turn** is a maximal run of ``response_mask == 1`` tokens in one row: the tokens the model
generated between two tool observations (observation and template tokens have mask 0). This
definition is the paper's (SORL, arXiv 2511.20718: a turn is one agent action); computing it
from the mask alone is our choice, so no agent-loop bookkeeping has to travel with the batch.

Turns get a global id, numbered row by row, left to right: row 0's turns are ``0..K_0-1``,
row 1's follow, and so on. Every per-turn tensor below is indexed by that id.

Everything is scatter/cumsum based: no Python loop over rows, turns or tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["TurnSegments", "segment_turns"]


@dataclass(frozen=True)
class TurnSegments:
    """The turns of a ``(batch, response_len)`` mask.

    Attributes:
        scatter_index: ``(batch * response_len,)`` long, the global turn id of each token
            (row-major), with off-mask tokens sent to the spare slot ``num_turns``: they are summed
            there and dropped, which avoids boolean gathers on the hot path.
        turn_lengths: ``(num_turns,)`` long, tokens per turn (always >= 1).
        turn_row: ``(num_turns,)`` long, the row each turn belongs to.
        turn_index: ``(num_turns,)`` long, 0-based position of the turn within its row (1st turn = 0).
        turns_per_row: ``(batch,)`` long, number of turns in each row (0 for an all-masked row).
        row_offset: ``(batch,)`` long, global id of each row's first turn (``cumsum - turns_per_row``).
        starts: ``(batch, response_len)`` bool, True on the first token of each turn.
        num_turns: total number of turns in the batch.
        shape: ``(batch, response_len)``.
    """

    scatter_index: torch.Tensor
    turn_lengths: torch.Tensor
    turn_row: torch.Tensor
    turn_index: torch.Tensor
    turns_per_row: torch.Tensor
    row_offset: torch.Tensor
    starts: torch.Tensor
    num_turns: int
    shape: torch.Size

    @property
    def token_turn_id(self) -> torch.Tensor:
        """``(batch, response_len)`` long: each token's global turn id, -1 off-mask."""
        ids = self.scatter_index.view(self.shape)
        return ids.masked_fill(ids == self.num_turns, -1)

    def segment_sum(self, values: torch.Tensor) -> torch.Tensor:
        """Sum of ``values`` over each turn's tokens; differentiable.

        Args:
            values: ``(batch, response_len)``. Off-mask entries are ignored (even inf/nan ones
                only reach the dropped spare slot).

        Returns:
            ``(num_turns,)`` in the dtype of ``values``.
        """
        sums = values.new_zeros(self.num_turns + 1).index_add(0, self.scatter_index, values.reshape(-1))
        return sums[: self.num_turns]

    def segment_mean(self, values: torch.Tensor) -> torch.Tensor:
        """Mean of ``values`` over each turn's tokens: ``(batch, response_len)`` -> ``(num_turns,)``."""
        return self.segment_sum(values) / self.turn_lengths.to(values.dtype)

    def broadcast(self, turn_values: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
        """Give every token its turn's value: ``(num_turns,)`` -> ``(batch, response_len)``.

        Off-mask tokens get ``fill``. Differentiable with respect to ``turn_values``.
        """
        padded = torch.cat([turn_values, turn_values.new_full((1,), fill)])
        return padded.index_select(0, self.scatter_index).view(self.shape)

    def per_row_sum(self, turn_values: torch.Tensor) -> torch.Tensor:
        """Sum per row of per-turn values: ``(num_turns,)`` -> ``(batch,)``; differentiable."""
        return turn_values.new_zeros(self.shape[0]).index_add(0, self.turn_row, turn_values)


def segment_turns(response_mask: torch.Tensor) -> TurnSegments:
    """Split each row of ``response_mask`` into turns (maximal runs of ones).

    Args:
        response_mask: ``(batch, response_len)``, bool or 0/1 of any dtype.

    Returns:
        :class:`TurnSegments`. A turn cut by the end of the response (no closing 0) is still a
        turn; an all-masked row has no turn.
    """
    if response_mask.dim() != 2:
        raise ValueError(f"response_mask must be (batch, response_len), got shape {tuple(response_mask.shape)}")
    mask = response_mask.bool()
    batch, response_len = mask.shape
    device = mask.device

    starts = mask.clone()
    starts[:, 1:] &= ~mask[:, :-1]
    # Counting starts over the flattened (row-major) batch numbers the turns globally at once.
    running_count = starts.view(-1).cumsum(0)
    num_turns = int(running_count[-1]) if running_count.numel() else 0
    scatter_index = (running_count - 1).masked_fill_(~mask.view(-1), num_turns)

    turns_per_row = starts.sum(dim=1)
    turn_row = torch.repeat_interleave(torch.arange(batch, device=device), turns_per_row)
    row_offset = turns_per_row.cumsum(0) - turns_per_row
    turn_index = torch.arange(num_turns, device=device) - row_offset[turn_row]
    turn_lengths = torch.bincount(scatter_index, minlength=num_turns + 1)[:num_turns]
    return TurnSegments(
        scatter_index=scatter_index,
        turn_lengths=turn_lengths,
        turn_row=turn_row,
        turn_index=turn_index,
        turns_per_row=turns_per_row,
        row_offset=row_offset,
        starts=starts,
        num_turns=num_turns,
        shape=torch.Size((batch, response_len)),
    )
