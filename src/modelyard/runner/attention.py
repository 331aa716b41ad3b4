"""Paged attention over a mixed batch (prefill chunks + decodes) on CPU.

The KV cache of one layer is a pair of tensors of shape (num_kv_heads, num_blocks, block_size,
head_dim): heads first, so gathering a request's blocks yields (nkv, L, hd) per request,
contiguous, the layout the attention matmuls read directly. A request's block table lists the
physical blocks of its positions in order; the slot of position p is
`block_table[p // block_size] * block_size + p % block_size` (slots index dim 1 of the
(nkv, num_blocks * block_size, hd) view).

`AttentionMetadata.build` turns one step's requests into index tensors ONCE per step (slot
mapping, padded block tables, masks); `paged_attention` then runs per layer with tensor ops only.
The new K/V are written into their slots first (`store_kv`: one index_copy_ per tensor; with the
compiled kernels the model's fused RoPE op writes them instead). Then:
- with the runner's kernels built (runner.kernels; float32 or bfloat16), ONE C++ call attends
  every row of the step, decodes and prefill rows alike: a row at position p is a query over
  keys [0, p] of its request, read in place from the cache through the block table
  (`AttentionMetadata.kernel_rows`; a prefill chunk's rows share its table). A prefill row so
  costs what SDPA's causal flash kernel would, in one call per layer instead of one per chunk
  (less time than SDPA: docs/benchmarks.md), with SDPA's arithmetic
  but not its summation order: results within its rounding, not its bits.
  `MODELYARD_PREFILL_SDPA=1` keeps SDPA for prefill chunks (their bits then equal
  transformers' for a prompt attended whole). On AMX hosts a bf16 cache takes the tile layout
  (runner.kv_layout: within each block K and V are stored as the operands of AMX tile
  multiplies), which only the kernel reads;
- otherwise decodes (one new token each) attend together: the torch path gathers their blocks
  request-major with one index_select into scratch buffers allocated once per step and shared
  by every layer (a fresh 1-2 MB tensor per layer costs more in page faults than the copy
  itself), then runs one grouped attention (`grouped_decode_attention`) on the contiguous
  (D, nkv, L, hd) result: the g query heads sharing a KV head attend as g query rows of that
  head, so K/V are never repeated; and each prefill chunk attends alone with SDPA: a chunk
  starting at position 0 uses its own new K/V with a causal mask (no cache read); a later
  chunk gathers its cached blocks with an offset mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from modelyard.runner import kernels
from modelyard.runner.kv_layout import KV_PLAIN


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
    decode_block_ids: torch.Tensor  # (D * nb_max,) long: padded block tables (pad = block 0)
    decode_seq_lens: torch.Tensor  # (D,) long: keys of each decode (its position + 1)
    block_size: int
    sliding_window: int | None
    prefills: list[PrefillChunk]  # multi-token chunks (on SDPA: attended one by one)
    all_decodes: bool  # every row is a decode, in order: decode_rows is 0..T-1
    decode_cache_rows: torch.Tensor | None = None  # (D * nkv * nb_max,) see decode_gather_ids
    decode_scratch: tuple[torch.Tensor, torch.Tensor] | None = None  # gathered K and V
    _decode_mask: torch.Tensor | None = None  # see decode_mask
    _kernel_rows: tuple[torch.Tensor, torch.Tensor] | None = None  # see kernel_rows

    def kernel_rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every row of the step as the kernel reads it: (T, nb_max) long block tables (a
        prefill chunk's rows share its request's table; padding block 0) and (T,) long key
        counts (position + 1). Built at the first layer and reused by the others."""
        if self._kernel_rows is None:
            d = self.decode_seq_lens.numel()
            if self.all_decodes:
                self._kernel_rows = (self.decode_block_ids.view(d, -1), self.decode_seq_lens)
            else:
                decode_tables = self.decode_block_ids.view(d, -1 if d else 0)
                width = max(decode_tables.shape[1], *(c.block_ids.numel() for c in self.prefills))
                tables = torch.zeros(self.positions.numel(), width, dtype=torch.long)
                tables[self.decode_rows, : decode_tables.shape[1]] = decode_tables
                for c in self.prefills:
                    tables[c.row_start : c.row_start + c.num_tokens, : c.block_ids.numel()] = (
                        c.block_ids
                    )
                self._kernel_rows = (tables, self.positions + 1)
        return self._kernel_rows

    def decode_mask(self) -> torch.Tensor:
        """(D, 1, 1, nb_max * block_size) bool, True = attend: what each decode may see in its
        padded gathered blocks. Built at the first layer that needs it (the torch path; the
        compiled kernel reads seq lens) and reused by the others."""
        if self._decode_mask is None:
            d = self.decode_seq_lens.numel()
            width = self.decode_block_ids.numel() // max(d, 1) * self.block_size
            q_pos = (self.decode_seq_lens - 1).unsqueeze(1)  # (D, 1)
            k_pos = torch.arange(width).unsqueeze(0)  # (1, L)
            allowed = k_pos <= q_pos
            if self.sliding_window is not None:
                allowed &= k_pos > q_pos - self.sliding_window
            self._decode_mask = allowed.view(d, 1, 1, width)
        return self._decode_mask

    def decode_gather_ids(self, num_kv_heads: int, num_blocks: int) -> torch.Tensor:
        """Rows of the (nkv * NB, bs, hd) cache view holding the decodes' blocks, request-major.

        Computed at the first layer and reused by the others (every layer's cache has the same
        shape). Gathered in this order, the rows form (D, nkv, nb_max * bs, hd) contiguously.
        """
        if self.decode_cache_rows is None:
            d = self.decode_seq_lens.numel()
            ids = self.decode_block_ids.view(d, 1, -1)  # (D, 1, nb_max)
            offsets = torch.arange(num_kv_heads, dtype=torch.long).view(1, -1, 1) * num_blocks
            self.decode_cache_rows = (ids + offsets).view(-1)
        return self.decode_cache_rows

    def decode_buffers(self, cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Scratch K and V (D * nkv * nb_max, bs, hd) for the gathered blocks, one per step."""
        if self.decode_scratch is None:
            shape = (self.decode_block_ids.numel() * cache.shape[0], *cache.shape[2:])
            self.decode_scratch = (
                torch.empty(shape, dtype=cache.dtype),
                torch.empty(shape, dtype=cache.dtype),
            )
        return self.decode_scratch

    def with_window(self, window: int | None) -> AttentionMetadata:
        """The same step attended with sliding window `window` (a model whose layers differ in
        window: runner.models.decoder); itself when the window is its own. The index tensors
        and the per-step buffers are shared; the masks are the window's."""
        if window == self.sliding_window:
            return self
        prefills = [
            replace(
                c,
                mask=_chunk_mask(
                    c.start_position, c.num_tokens, c.block_ids.numel() * self.block_size, window
                ),
            )
            for c in self.prefills
        ]
        return replace(self, sliding_window=window, prefills=prefills, _decode_mask=None)

    @staticmethod
    def build(
        starts: Sequence[int],
        lengths: Sequence[int],
        block_tables: Sequence[Sequence[int]],
        block_size: int,
        sliding_window: int | None = None,
    ) -> AttentionMetadata:
        """Index tensors for requests i with `lengths[i]` new tokens from `starts[i]`."""
        positions: list[int] = []
        slots: list[int] = []
        decode_rows: list[int] = []
        decode_tables: list[Sequence[int]] = []
        prefills: list[PrefillChunk] = []
        row = 0
        for start, n, table in zip(starts, lengths, block_tables, strict=True):
            total = start + n
            nb = (total + block_size - 1) // block_size
            positions.extend(range(start, total))
            slots.extend(_slots(table, start, total, block_size))
            if n == 1:
                decode_rows.append(row)
                decode_tables.append(table[:nb])
            else:
                blocks = torch.tensor(list(table[:nb]), dtype=torch.long)  # (nb,)
                mask = _chunk_mask(start, n, nb * block_size, sliding_window)
                prefills.append(PrefillChunk(row, n, start, blocks, mask))
            row += n
        decode_positions = [positions[r] for r in decode_rows]
        decode_ids = _padded_block_ids(decode_tables)
        return AttentionMetadata(
            positions=torch.tensor(positions, dtype=torch.long),
            slot_mapping=torch.tensor(slots, dtype=torch.long),
            decode_rows=torch.tensor(decode_rows, dtype=torch.long),
            decode_block_ids=decode_ids,
            decode_seq_lens=torch.tensor(decode_positions, dtype=torch.long) + 1,
            block_size=block_size,
            sliding_window=sliding_window,
            prefills=prefills,
            all_decodes=not prefills,
        )


def _slots(table: Sequence[int], start: int, end: int, block_size: int) -> list[int]:
    """Flat cache slots of positions [start, end), one range per block touched."""
    out: list[int] = []
    for b in range(start // block_size, (end + block_size - 1) // block_size):
        base = table[b] * block_size - b * block_size  # slot of position p is base + p
        out.extend(range(base + max(start, b * block_size), base + min(end, (b + 1) * block_size)))
    return out


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


def _padded_block_ids(tables: Sequence[Sequence[int]]) -> torch.Tensor:
    """Flat (D * nb_max,) block ids, each table padded with block 0 to the longest."""
    nb_max = max((len(t) for t in tables), default=0)
    ids = [b for t in tables for b in (*t, *([0] * (nb_max - len(t))))]
    return torch.tensor(ids, dtype=torch.long)


def store_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
) -> None:
    """Write the step's new k/v (T, nkv, hd) into their cache slots (one index_copy_ each)."""
    nkv, hd = k_cache.shape[0], k_cache.shape[3]
    k_cache.view(nkv, -1, hd).index_copy_(1, meta.slot_mapping, k.transpose(0, 1))
    v_cache.view(nkv, -1, hd).index_copy_(1, meta.slot_mapping, v.transpose(0, 1))


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
    layout: int = KV_PLAIN,
    *,
    prefill_sdpa: bool,
) -> torch.Tensor:
    """q (T, nh, hd), k/v (T, nkv, hd) new tokens; caches (nkv, NB, bs, hd) -> (T, nh, hd).

    The new k/v must already be in the caches (`store_kv`, or the fused `kernels.rope_store`).
    Caches in the tile layout (runner.kv_layout) are read by the kernel alone. `prefill_sdpa`:
    the kernel switch (runner.kernel_config) that keeps prefill chunks on SDPA.
    """
    nkv, hd = k_cache.shape[0], k_cache.shape[3]
    if kernel_attends(meta, q.dtype, hd, layout, prefill_sdpa=prefill_sdpa):
        tables, seq_lens = meta.kernel_rows()
        return kernels.paged_decode_attention(
            q, k_cache, v_cache, tables, seq_lens, scale, meta.sliding_window, layout
        )
    if meta.all_decodes:
        return _decode_attention(q, k_cache, v_cache, meta, scale)
    out = torch.empty_like(q)  # (T, nh, hd)
    if meta.decode_rows.numel():
        qd = q.index_select(0, meta.decode_rows)
        out[meta.decode_rows] = _decode_attention(qd, k_cache, v_cache, meta, scale)
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
            rows_of_heads = _head_rows(chunk.block_ids, nkv, k_cache.shape[1])
            kc = _gather(k_cache, rows_of_heads).unsqueeze(0)  # (1, nkv, L, hd)
            vc = _gather(v_cache, rows_of_heads).unsqueeze(0)
            o = F.scaled_dot_product_attention(
                qc, kc, vc, attn_mask=chunk.mask, scale=scale, enable_gqa=True
            )
        out[rows] = o.squeeze(0).transpose(0, 1)
    return out


def _head_rows(block_ids: torch.Tensor, num_kv_heads: int, num_blocks: int) -> torch.Tensor:
    """(n,) block ids -> (nkv * n,) rows of the (nkv * NB, bs, hd) cache view, head-major."""
    offsets = torch.arange(num_kv_heads, dtype=torch.long).unsqueeze(1) * num_blocks  # (nkv, 1)
    return (block_ids.unsqueeze(0) + offsets).view(-1)


def _gather(cache: torch.Tensor, head_rows: torch.Tensor) -> torch.Tensor:
    """(nkv, NB, bs, hd) cache, rows from `_head_rows` -> (nkv, n * bs, hd), contiguous."""
    nkv, num_blocks, bs, hd = cache.shape
    return cache.view(nkv * num_blocks, bs, hd).index_select(0, head_rows).view(nkv, -1, hd)


def _decode_attention(
    qd: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Single-token queries (D, nh, hd) of all decodes at once -> (D, nh, hd)."""
    nkv, num_blocks, bs, hd = k_cache.shape
    d = qd.shape[0]
    if native_decode_ready(qd.dtype, hd):
        tables = meta.decode_block_ids.view(d, -1)
        return kernels.paged_decode_attention(
            qd,  # a view of the qkv rows: the kernel takes any row stride
            k_cache,
            v_cache,
            tables,
            meta.decode_seq_lens,
            scale,
            meta.sliding_window,
        )
    rows = meta.decode_gather_ids(nkv, num_blocks)
    kd, vd = meta.decode_buffers(k_cache)
    torch.index_select(k_cache.view(-1, bs, hd), 0, rows, out=kd)
    torch.index_select(v_cache.view(-1, bs, hd), 0, rows, out=vd)
    return grouped_decode_attention(
        qd, kd.view(d, nkv, -1, hd), vd.view(d, nkv, -1, hd), meta.decode_mask(), scale
    )


def kernel_attends(
    meta: AttentionMetadata, dtype: torch.dtype, head_dim: int, layout: int, *, prefill_sdpa: bool
) -> bool:
    """True when `paged_attention` hands every row of the step to the compiled kernel."""
    if layout != KV_PLAIN:
        return True
    return native_decode_ready(dtype, head_dim) and (meta.all_decodes or not prefill_sdpa)


def native_decode_ready(dtype: torch.dtype, head_dim: int) -> bool:
    """True when decodes use the compiled kernel (float32 or bfloat16, head_dim a multiple of 8,
    kernels loaded), else the torch path below."""
    native = dtype in (torch.float32, torch.bfloat16) and head_dim % 8 == 0
    return native and kernels.loaded()


def grouped_decode_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """One query token per request with grouped KV heads, without repeating K/V.

    q (D, nh, hd); k/v (D, nkv, L, hd) (any strides with the last dim contiguous); mask
    (D, 1, 1, L) bool, True = attend, at least one True per request. Query head h uses KV head
    h // g (g = nh // nkv, as SDPA's enable_gqa). The g query heads of a KV head are passed as
    g query rows of that head, all under the request's mask: one (D, nkv, g, L) attention
    instead of (D, nh, 1, L) with K/V repeated or re-read per query head. Returns (D, nh, hd).
    """
    d, nh, hd = q.shape
    nkv = k.shape[1]
    qg = q.view(d, nkv, nh // nkv, hd)
    if q.dtype != torch.float32:
        o = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=scale)
        return o.reshape(d, nh, hd)
    scores = torch.matmul(qg * scale, k.transpose(-1, -2))  # (D, nkv, g, L)
    scores.masked_fill_(mask.logical_not(), float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v).reshape(d, nh, hd)
