"""Per-row token masks of one batched step, and their application to the logits."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# byte value -> its 8 bits, lowest first: (256, 8) bool. A row's int32 words read as
# little-endian bytes (x86-64 and arm64 hosts) put token 8 * b + j at bit j of byte b.
_BYTE_BITS = ((torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1).bool()


@dataclass(slots=True)
class TokenMasks:
    """The allowed tokens of the constrained rows of one step."""

    rows: list[int]
    """Rows of the step's sampled logits that are constrained (the others are untouched)."""
    bitmask: torch.Tensor
    """(len(rows), ceil(V / 32)) int32: bit j of word w set = token 32 * w + j allowed."""


def allowed_tokens(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(R, W) int32 bitmask -> (R, vocab_size) bool, True where the token is allowed."""
    by = bitmask.contiguous().view(torch.uint8).long()  # (R, 4W)
    return _BYTE_BITS[by].reshape(bitmask.shape[0], -1)[:, :vocab_size]  # (R, 32W) -> (R, V)


def apply_masks(logits: torch.Tensor, masks: TokenMasks) -> None:
    """In place on (B, V) logits: forbidden tokens of the constrained rows become -inf."""
    if not masks.rows:
        return
    forbidden = ~allowed_tokens(masks.bitmask, logits.shape[1])  # (R, V)
    if masks.rows == list(range(logits.shape[0])):  # every row constrained: no gather
        logits.masked_fill_(forbidden, float("-inf"))
        return
    rows = torch.tensor(masks.rows, dtype=torch.long)
    logits[rows] = logits[rows].masked_fill(forbidden, float("-inf"))
