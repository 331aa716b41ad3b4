"""Per-row token masks of one batched step, and their application to the logits."""

from __future__ import annotations

from dataclasses import dataclass

import torch

_BITS = torch.arange(32, dtype=torch.int32)  # bit j of a 32-bit word is token 32 * w + j


@dataclass(slots=True)
class TokenMasks:
    """The allowed tokens of the constrained rows of one step."""

    rows: list[int]
    """Rows of the step's sampled logits that are constrained (the others are untouched)."""
    bitmask: torch.Tensor
    """(len(rows), ceil(V / 32)) int32: bit j of word w set = token 32 * w + j allowed."""


def allowed_tokens(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(R, W) int32 bitmask -> (R, vocab_size) bool, True where the token is allowed."""
    bits = (bitmask.unsqueeze(-1) >> _BITS) & 1  # (R, W, 32)
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def apply_masks(logits: torch.Tensor, masks: TokenMasks) -> None:
    """In place on (B, V) logits: forbidden tokens of the constrained rows become -inf."""
    if not masks.rows:
        return
    rows = torch.tensor(masks.rows, dtype=torch.long)
    allowed = allowed_tokens(masks.bitmask, logits.shape[1])  # (R, V)
    logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))
