"""Paged attention over a mixed batch (prefill chunks + decodes) on CPU.

The KV cache of one layer is a pair of tensors of shape (num_blocks, block_size, num_kv_heads,
head_dim). A request's block table lists the physical blocks of its positions in order; the slot
of position p is `block_table[p // block_size] * block_size + p % block_size`.

`AttentionMetadata.build` turns one step's requests into index tensors ONCE per step (slot
mapping, padded block tables, masks); `paged_attention` then runs per layer with tensor ops only:
1. write the new K/V into their slots (one index_copy_ per tensor);
2. decodes (one new token each) attend together: gather their blocks with one index_select and
   run one batched scaled_dot_product_attention with a padding mask;
3. each prefill chunk attends alone: a chunk starting at position 0 uses its own new K/V with a
   causal mask (no cache read); a later chunk gathers its cached blocks with an offset mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(slots=True)
class PrefillChunk:
    """One request's multi-token chunk inside the flat batch."""

    row_start: int  # first row of the chunk in the flat (T, ...) tensors
    num_tokens: int  # rows [row_start, row_start + num_tokens)
    start_position: int  # position of the first token (0 = nothing cached before)
    block_ids: torch.Tensor  # (nb,) long: the blocks covering [0, start + num_tokens)
    mask: torch.Tensor | None  # (n, nb * block_size) bool, True = attend; None = plain causal


@dataclass(slots=True)
class AttentionMetadata:
    """Per-step index tensors shared by every layer."""

    positions: torch.Tensor  # (T,) long: position of each new token
    slot_mapping: torch.Tensor  # (T,) long: flat cache slot of each new token
    decode_rows: torch.Tensor  # (D,) long: rows of single-token requests in the flat batch
    decode_block_ids: torch.Tensor  # (D, nb_max) long: padded block tables (pad = block 0)
    decode_mask: torch.Tensor  # (D, 1, 1, nb_max * block_size) bool, True = attend
    prefills: list[PrefillChunk]  # multi-token chunks, attended one by one

    @staticmethod
    def build(
        starts: Sequence[int],
        lengths: Sequence[int],
        block_tables: Sequence[Sequence[int]],
        block_size: int,
        sliding_window: int | None = None,
    ) -> AttentionMetadata:
        """Index tensors for requests i with `lengths[i]` new tokens from `starts[i]`."""
        positions: list[torch.Tensor] = []
        slots: list[torch.Tensor] = []
        decode_rows: list[int] = []
        decode_tables: list[Sequence[int]] = []
        decode_positions: list[int] = []
        prefills: list[PrefillChunk] = []
        row = 0
        for start, n, table in zip(starts, lengths, block_tables, strict=True):
            total = start + n
            nb = (total + block_size - 1) // block_size
            blocks = torch.tensor(list(table[:nb]), dtype=torch.long)  # (nb,)
            pos = torch.arange(start, total, dtype=torch.long)  # (n,)
            positions.append(pos)
            slots.append(blocks[pos // block_size] * block_size + pos % block_size)
            if n == 1:
                decode_rows.append(row)
                decode_tables.append(table[:nb])
                decode_positions.append(start)
            else:
                mask = _chunk_mask(start, n, nb * block_size, sliding_window)
                prefills.append(PrefillChunk(row, n, start, blocks, mask))
            row += n
        decode_ids, decode_mask = _decode_tensors(
            decode_tables, decode_positions, block_size, sliding_window
        )
        return AttentionMetadata(
            positions=torch.cat(positions),
            slot_mapping=torch.cat(slots),
            decode_rows=torch.tensor(decode_rows, dtype=torch.long),
            decode_block_ids=decode_ids,
            decode_mask=decode_mask,
            prefills=prefills,
        )


def _chunk_mask(start: int, n: int, width: int, window: int | None) -> torch.Tensor | None:
    """(n, width) bool mask for queries at [start, start + n) over keys [0, width)."""
    if start == 0 and (window is None or n <= window):
        return None
    q_pos = torch.arange(start, start + n).unsqueeze(1)  # (n, 1)
    k_pos = torch.arange(width).unsqueeze(0)  # (1, width)
    mask = k_pos <= q_pos
    if window is not None:
        mask &= k_pos > q_pos - window
    return mask


def _decode_tensors(
    tables: Sequence[Sequence[int]],
    positions: Sequence[int],
    block_size: int,
    window: int | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Padded (D, nb_max) block ids and (D, 1, 1, nb_max * block_size) mask."""
    d = len(tables)
    nb_max = max((len(t) for t in tables), default=0)
    ids = torch.zeros((d, nb_max), dtype=torch.long)
    for i, t in enumerate(tables):
        ids[i, : len(t)] = torch.tensor(list(t), dtype=torch.long)
    q_pos = torch.tensor(list(positions), dtype=torch.long).unsqueeze(1)  # (D, 1)
    k_pos = torch.arange(nb_max * block_size).unsqueeze(0)  # (1, L)
    mask = k_pos <= q_pos
    if window is not None:
        mask &= k_pos > q_pos - window
    return ids, mask.view(d, 1, 1, nb_max * block_size)


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """q (T, nh, hd), k/v (T, nkv, hd) new tokens; caches (NB, bs, nkv, hd) -> (T, nh, hd)."""
    _num_blocks, _block_size, nkv, hd = k_cache.shape
    k_cache.view(-1, nkv, hd).index_copy_(0, meta.slot_mapping, k)
    v_cache.view(-1, nkv, hd).index_copy_(0, meta.slot_mapping, v)
    out = torch.empty_like(q)  # (T, nh, hd)
    if meta.decode_rows.numel():
        out[meta.decode_rows] = _decode_attention(q, k_cache, v_cache, meta, scale)
    for chunk in meta.prefills:
        rows = slice(chunk.row_start, chunk.row_start + chunk.num_tokens)
        qc = q[rows].transpose(0, 1).unsqueeze(0)  # (1, nh, n, hd)
        if chunk.mask is None:
            kc = k[rows].transpose(0, 1).unsqueeze(0)  # (1, nkv, n, hd)
            vc = v[rows].transpose(0, 1).unsqueeze(0)
            o = F.scaled_dot_product_attention(
                qc, kc, vc, is_causal=True, scale=scale, enable_gqa=True
            )
        else:
            kc = _gather(k_cache, chunk.block_ids.unsqueeze(0))  # (1, nkv, L, hd)
            vc = _gather(v_cache, chunk.block_ids.unsqueeze(0))
            o = F.scaled_dot_product_attention(
                qc, kc, vc, attn_mask=chunk.mask, scale=scale, enable_gqa=True
            )
        out[rows] = o.squeeze(0).transpose(0, 1)
    return out


def _gather(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """(NB, bs, nkv, hd) cache, (B, nb) block ids -> (B, nkv, nb * bs, hd) keys or values."""
    b, nb = block_ids.shape
    _, bs, nkv, hd = cache.shape
    picked = cache.index_select(0, block_ids.reshape(-1))  # (B * nb, bs, nkv, hd)
    return picked.view(b, nb * bs, nkv, hd).transpose(1, 2)


def _decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Single-token queries of all decodes at once -> (D, nh, hd)."""
    qd = q.index_select(0, meta.decode_rows).unsqueeze(2)  # (D, nh, 1, hd)
    kd = _gather(k_cache, meta.decode_block_ids)  # (D, nkv, L, hd)
    vd = _gather(v_cache, meta.decode_block_ids)
    o = F.scaled_dot_product_attention(
        qd, kd, vd, attn_mask=meta.decode_mask, scale=scale, enable_gqa=True
    )  # (D, nh, 1, hd)
    return o.squeeze(2)
