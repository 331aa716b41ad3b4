"""GGUF block types as the kernels read them (csrc/gguf_blocks.h, csrc/gemm_gguf.cpp).

A GGUF tensor's row is a run of blocks of its type: Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 hold 32
weights a block with a float16 scale d (and min m); the K-quants hold 256: Q4_K and Q5_K eight
sub-blocks of 32 with 6-bit scales sc and mins mn under float16 d and dmin, Q6_K sixteen of 16
with int8 scales under one d. `unpack` reads any of the eight into one form per row: integer
quants q and per-32 float32 scales (two for Q6_K, one per 16 weights) and mins, from which a
weight is d (q - offset) or d q + m by exactly the float32 operations of gguf's numpy
dequantization (`gguf.quants`): a K-quant's d sc and dmin mn are exact products, a - b is
a + (-b). `dequantize_blocks` computes the weights from that form, and `pack_gguf` writes it into
the kernel's panels, so both hold gguf's float32 weights bit for bit (tested).

Q2_K and Q3_K have no kernel (`kind_of` is None): a source dequantizes them to float.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

Q4_1, Q8_0, Q4_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K = range(8)  # the kinds (csrc Kind)
_KINDS = {
    "Q4_1": Q4_1, "Q8_0": Q8_0, "Q4_0": Q4_0, "Q5_0": Q5_0,
    "Q5_1": Q5_1, "Q4_K": Q4_K, "Q5_K": Q5_K, "Q6_K": Q6_K,
}  # fmt: skip
NAMES = {kind: name for name, kind in _KINDS.items()}
_PANEL_ROWS, _SUB = 16, 32  # output rows per panel, k per panel block
_PACK_ROWS = 4096  # rows packed at a time (bounds the int16 / int64 temporaries)


@dataclass(frozen=True, slots=True)
class _Layout:
    """How a kind's weights are formed (and packed: csrc Layout)."""

    layout: int  # csrc Layout: the panels' format
    block: int  # weights per file block
    bits: int  # bits of a quant (8: signed bytes)
    offset: int  # subtracted from the quant before the scale
    scales: int  # scales per 32 weights (Q6_K: 2)
    has_min: bool  # weight = d q + m


_LAYOUTS = {
    Q4_1: _Layout(0, 32, 4, 0, 1, True),
    Q8_0: _Layout(1, 32, 8, 0, 1, False),
    Q4_0: _Layout(2, 32, 4, 8, 1, False),
    Q5_1: _Layout(3, 32, 5, 0, 1, True),
    Q5_0: _Layout(4, 32, 5, 16, 1, False),
    Q4_K: _Layout(6, 256, 4, 0, 1, True),
    Q5_K: _Layout(3, 256, 5, 0, 1, True),
    Q6_K: _Layout(5, 256, 6, 32, 2, False),
}


@dataclass(frozen=True, slots=True)
class Blocks:
    """One weight's rows of GGUF blocks: raw (N, K / block * block bytes) uint8 in the file's
    block layout, in HF row order; kind one of this module's kinds, k the input features."""

    kind: int
    raw: npt.NDArray[np.uint8]
    k: int

    @property
    def n(self) -> int:
        return int(self.raw.shape[0])


@dataclass(frozen=True, slots=True)
class Quants:
    """A weight's blocks unpacked: weight = d (q - offset), or d q + m."""

    q: torch.Tensor  # (N, K) int16, before the offset (Q8_0: signed)
    d: torch.Tensor  # (N, K / 32, scales) float32
    m: torch.Tensor | None  # (N, K / 32) float32, or None


def kind_of(type_name: str) -> int | None:
    """A GGUF tensor type's name ("Q4_K") -> its kernel kind, None when no kernel reads it."""
    return _KINDS.get(type_name)


def layout_of(kind: int) -> int:
    """The panel format of `kind` (kinds of one layout pack alike: Q4_1 and Q4_K)."""
    return _LAYOUTS[kind].layout


def unpack(blocks: Blocks) -> Quants:
    """The blocks' quants, scales and mins, per row."""
    spec = _LAYOUTS[blocks.kind]
    n, k = blocks.n, blocks.k
    raw = np.ascontiguousarray(blocks.raw).reshape(n * (k // spec.block), -1)  # (R, block bytes)
    q, d, m = _UNPACKERS[blocks.kind](raw)  # (R, block), (R, block / 32, scales), (R, block / 32)
    return Quants(
        torch.from_numpy(q.astype(np.int16)).view(n, k),
        torch.from_numpy(np.ascontiguousarray(d, dtype=np.float32)).view(n, k // _SUB, -1),
        None if m is None else torch.from_numpy(np.ascontiguousarray(m)).view(n, k // _SUB),
    )


def dequantize_blocks(blocks: Blocks) -> torch.Tensor:
    """(N, K) float32: gguf's own dequantization of the blocks, bit for bit."""
    spec, u = _LAYOUTS[blocks.kind], unpack(blocks)
    n, k = blocks.n, blocks.k
    q = (u.q - spec.offset).float().view(n, k // _SUB, spec.scales, -1)  # (N, B, S, 32 / S)
    w = q * u.d.unsqueeze(-1)
    if u.m is not None:
        w = w + u.m[:, :, None, None]
    return w.view(n, k)


def pack_gguf(blocks: Blocks) -> torch.Tensor:
    """The file's blocks -> (ceil(N / 16), K / 32, bytes) uint8 panels for the kernel (the
    layout of csrc/gguf_blocks.h; Q4_K and Q6_K: (ceil(N / 16), K / 256, bytes), a header of
    super-block scales and 8 blocks with byte sub-scales), `_PACK_ROWS` rows at a time."""
    parts = [
        _pack_rows(Blocks(blocks.kind, blocks.raw[r : r + _PACK_ROWS], blocks.k))
        for r in range(0, blocks.n, _PACK_ROWS)
    ]
    return parts[0] if len(parts) == 1 else torch.cat(parts).contiguous()


def _pack_rows(blocks: Blocks) -> torch.Tensor:
    spec, u = _LAYOUTS[blocks.kind], unpack(blocks)
    n, nb = blocks.n, blocks.k // _SUB
    panels = (n + _PANEL_ROWS - 1) // _PANEL_ROWS
    rows = panels * _PANEL_ROWS  # zero rows past N: scale 0, so weight 0

    def grouped(t: torch.Tensor) -> torch.Tensor:  # (N, B, ...) -> (P, B, ..., 16 rows)
        padded = t.new_zeros((rows, *t.shape[1:]))
        padded[:n] = t
        return padded.view(panels, _PANEL_ROWS, *t.shape[1:]).movedim(1, -1)

    q = _quant_bytes(grouped(u.q.view(n, nb, _SUB)), spec.bits)  # from (P, B, 32 k, 16 rows)
    if blocks.kind in (Q4_K, Q6_K):
        head, sub = _k_scales_raw(blocks)  # (N, K / 256, 1 or 2) float32, (N, B, 2) uint8
        head_bytes = grouped(head).contiguous().view(torch.uint8).view(panels, nb // 8, -1)
        body = torch.cat([grouped(sub).reshape(panels, nb, -1), q], dim=-1)
        return torch.cat([head_bytes, body.view(panels, nb // 8, -1)], dim=-1).contiguous()
    scales = [grouped(u.d)] + ([] if u.m is None else [grouped(u.m.unsqueeze(-1))])
    scale_bytes = torch.cat(scales, dim=2).contiguous().view(torch.uint8).view(panels, nb, -1)
    return torch.cat([scale_bytes, q], dim=-1).contiguous()


def _k_scales_raw(blocks: Blocks) -> tuple[torch.Tensor, torch.Tensor]:
    """A K-quant's scales as the K layouts hold them: per 256 k float32 d (and dmin: Q4_K),
    per 32 k the bytes (sc, mn) (Q4_K) or the int8 scales of its two halves (Q6_K)."""
    n, supers = blocks.n, blocks.k // 256
    raw = np.ascontiguousarray(blocks.raw).reshape(n * supers, -1)
    if blocks.kind == Q4_K:
        sc, mn = _k_sub_scales(raw)
        head = np.concatenate([_f16(raw[:, 0:2]), _f16(raw[:, 2:4])], axis=-1)
        sub = np.stack([sc, mn], axis=-1)  # (R, 8, 2)
    else:
        head = _f16(raw[:, 208:210])
        sub = np.ascontiguousarray(raw[:, 192:208]).reshape(-1, 8, 2)
    return (
        torch.from_numpy(np.ascontiguousarray(head, dtype=np.float32)).view(n, supers, -1),
        torch.from_numpy(np.ascontiguousarray(sub, dtype=np.uint8)).view(n, supers * 8, 2),
    )


def _quant_bytes(q: torch.Tensor, bits: int) -> torch.Tensor:
    """(P, B, 32 k, 16 rows) quants -> (P, B, bytes): signed bytes per k; or nibbles in groups of
    4 k, 32 bytes a group, rows r and r + 8 (r < 8) in byte 4 r + k % 4 (low, high nibble), so
    that a row's 4 k are adjacent bytes (the int8 dot products' operand), then the high bits:
    5-bit quants per k as one word (row r at bit r), Q6_K's 2 bits in groups of 4 k, 16 bytes a
    group (csrc/gguf_blocks.h)."""
    p, nb = q.shape[:2]
    if bits == 8:
        return q.to(torch.int8).view(torch.uint8).reshape(p, nb, -1)
    grouped = q.reshape(p, nb, _SUB // 4, 4, _PANEL_ROWS).transpose(-1, -2)  # (P, B, 8, 16, 4)
    low = grouped & 15
    nibbles = (low[..., :8, :] | (low[..., 8:, :] << 4)).to(torch.uint8).reshape(p, nb, -1)
    if bits == 4:
        return nibbles
    if bits == 5:
        shifts = torch.arange(_PANEL_ROWS, dtype=torch.int64)
        word = ((q.to(torch.int64) >> 4) << shifts).sum(dim=-1)  # (P, B, 32): disjoint bits
        high = word.unsqueeze(-1).view(torch.uint8)[..., :2]  # little-endian bytes
        return torch.cat([nibbles, high.reshape(p, nb, -1)], dim=-1)
    return torch.cat([nibbles, _two_bit_groups(grouped >> 4).reshape(p, nb, -1)], dim=-1)


def _two_bit_groups(h: torch.Tensor) -> torch.Tensor:
    """(P, B, 8, 16 rows, 4 k) values 0-3 -> (P, B, 8, 16) bytes: with a group's nibble bytes as
    two vectors of 32 (rows 0-7, rows 8-15; element i = row i / 4, k i % 4), byte j holds
    elements j and j + 16 of the first (bits 0-1, 2-3) and of the second (bits 4-5, 6-7)."""
    first = h[..., :8, :].flatten(-2)
    second = h[..., 8:, :].flatten(-2)
    out = first[..., :16] | (first[..., 16:] << 2) | (second[..., :16] << 4)
    return (out | (second[..., 16:] << 6)).to(torch.uint8)


# --- the file's block layouts (llama.cpp ggml-common.h; gguf.quants' numpy) -> (q, d, m)

_Array = npt.NDArray[np.generic]
_Unpacked = tuple[_Array, _Array, _Array | None]


def _f16(raw: npt.NDArray[np.uint8]) -> npt.NDArray[np.float32]:
    """(R, 2) bytes -> (R, 1) float32."""
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)


def _nibbles(qs: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """(R, 16) bytes -> (R, 32): the low nibbles, then the high ones."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1)


def _high_bit(qh: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """(R, 4) bytes, bit i for weight i -> (R, 32) values 0 or 16."""
    word = np.ascontiguousarray(qh).view(np.uint32)
    return (((word >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.uint8)


def _q4_0(raw: npt.NDArray[np.uint8]) -> _Unpacked:
    return _nibbles(raw[:, 2:18]), _f16(raw[:, 0:2])[:, None], None


def _q4_1(raw: npt.NDArray[np.uint8]) -> _Unpacked:
    return _nibbles(raw[:, 4:20]), _f16(raw[:, 0:2])[:, None], _f16(raw[:, 2:4])


def _q5_0(raw: npt.NDArray[np.uint8]) -> _Unpacked:
    q = _nibbles(raw[:, 6:22]) | _high_bit(raw[:, 2:6])
    return q, _f16(raw[:, 0:2])[:, None], None


def _q5_1(raw: npt.NDArray[np.uint8]) -> _Unpacked:
    q = _nibbles(raw[:, 8:24]) | _high_bit(raw[:, 4:8])
    return q, _f16(raw[:, 0:2])[:, None], _f16(raw[:, 2:4])


def _q8_0(raw: npt.NDArray[np.uint8]) -> _Unpacked:
    return np.ascontiguousarray(raw[:, 2:34]).view(np.int8), _f16(raw[:, 0:2])[:, None], None


def _k_sub_scales(raw: npt.NDArray[np.uint8]) -> tuple[_Array, _Array]:
    """Q4_K / Q5_K: 12 bytes of 6-bit scales and mins -> (R, 8) sc and (R, 8) mn, uint8."""
    s = raw[:, 4:16].reshape(-1, 3, 4)
    lo, mid, top = s[:, 0], s[:, 1], s[:, 2]
    sc = np.concatenate([lo & 63, (top & 15) | ((lo >> 2) & 48)], axis=-1)
    mn = np.concatenate([mid & 63, (top >> 4) | ((mid >> 2) & 48)], axis=-1)
    return sc, mn


def _k_scales(raw: npt.NDArray[np.uint8]) -> tuple[_Array, _Array]:
    """Q4_K / Q5_K: d, dmin, 12 bytes of 6-bit scales and mins -> (R, 8, 1) d sc and
    (R, 8) -dmin mn."""
    sc, mn = (v.astype(np.float32) for v in _k_sub_scales(raw))
    return (_f16(raw[:, 0:2]) * sc)[..., None], -(_f16(raw[:, 2:4]) * mn)


def _q4_k(raw: npt.NDArray[np.uint8]) -> _Unpacked:
    qs = raw[:, 16:144].reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8)[:, None]
    d, m = _k_scales(raw)
    return (qs & 15).reshape(-1, 256), d, m


def _q5_k(raw: npt.NDArray[np.uint8]) -> _Unpacked:
    ql = raw[:, 48:176].reshape(-1, 4, 1, 32) >> np.array([0, 4], np.uint8)[:, None]
    qh = raw[:, 16:48].reshape(-1, 1, 32) >> np.arange(8, dtype=np.uint8)[:, None]
    d, m = _k_scales(raw)
    return (ql & 15).reshape(-1, 256) | ((qh & 1) << 4).reshape(-1, 256), d, m


def _q6_k(raw: npt.NDArray[np.uint8]) -> _Unpacked:
    ql = raw[:, :128].reshape(-1, 2, 1, 64) >> np.array([0, 4], np.uint8)[:, None]
    qh = raw[:, 128:192].reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8)[:, None]
    q = (ql & 15).reshape(-1, 256) | ((qh & 3) << 4).reshape(-1, 256)
    sc = np.ascontiguousarray(raw[:, 192:208]).view(np.int8).astype(np.float32)
    return q, (_f16(raw[:, 208:210]) * sc).reshape(-1, 8, 2), None


_UNPACKERS = {
    Q4_0: _q4_0, Q4_1: _q4_1, Q5_0: _q5_0, Q5_1: _q5_1,
    Q8_0: _q8_0, Q4_K: _q4_k, Q5_K: _q5_k, Q6_K: _q6_k,
}  # fmt: skip
