"""Linear layers on a GGUF file's own quantized blocks (`MODELYARD_WEIGHTS=gguf`, or a model's
`gguf_blocks: on`).

A GGUF model is served from a float32 folder converted once from the file (runner.loader). With
this switch, and the kernels built, its Llama linear layers and lm_head keep the file's blocks
instead: Q4_1 (5 bits a weight: the packaged default model's layers) and Q8_0 (8.5 bits: its
embedding, which is also its tied lm_head). Other block types keep the float32 weights.

The blocks are repacked once at load into panels of 16 output rows per 32-k block
(`pack_gguf`), which `csrc/gemm_gguf.cpp` widens in registers at decode row counts. The weights
it computes with are bit for bit the converted folder's (tested): the kernel only sums in its own
order, so the model is the same model, with a step streaming ~6x fewer bytes than in float32.
Past `DECODE_ROWS` rows (prompts) a call dequantizes the panels and runs one `F.linear`.

llama.cpp's converter stores q_proj and k_proj with the rows of each head interleaved for its
rotary layout; `unpermute_rows` gives the row order transformers (and so the converted folder)
uses.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

Q4_1, Q8_0 = 0, 1  # the kernel's kinds
_KINDS = {"Q4_1": Q4_1, "Q8_0": Q8_0}
DECODE_ROWS = 64  # up to this many rows a call runs the kernel, past it F.linear

# HF weight name (of layer {i}) -> the GGUF tensor name
_LAYER_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


@dataclass(frozen=True, slots=True)
class Blocks:
    """One weight's rows of GGUF blocks: raw (N, K / 32 * block bytes) uint8, in HF row order."""

    kind: int
    raw: npt.NDArray[np.uint8]
    k: int

    @property
    def n(self) -> int:
        return int(self.raw.shape[0])


class GGUFWeights:
    """The quantized blocks of a GGUF file's Llama weights, by HF name (memory-mapped)."""

    def __init__(self, path: Path, config: Any) -> None:
        from gguf import GGUFReader

        reader = GGUFReader(str(path))
        self._tensors = {t.name: t for t in reader.tensors}
        self._heads = int(config.num_attention_heads)
        self._kv_heads = int(getattr(config, "num_key_value_heads", None) or self._heads)

    def layer(self, index: int, name: str) -> Blocks | None:
        """`name` ("self_attn.q_proj", "mlp.down_proj", ...) of layer `index`, or None when
        the file holds it in a type the kernel does not read."""
        blocks = self._blocks(f"blk.{index}.{_LAYER_NAMES[name]}.weight")
        if blocks is None or name not in ("self_attn.q_proj", "self_attn.k_proj"):
            return blocks
        heads = self._heads if name == "self_attn.q_proj" else self._kv_heads
        rows = unpermute_rows(blocks.n, heads)
        return Blocks(blocks.kind, blocks.raw[rows], blocks.k)

    def lm_head(self) -> Blocks | None:
        """The output weight (the token embedding when the model ties them)."""
        name = "output.weight" if "output.weight" in self._tensors else "token_embd.weight"
        return self._blocks(name)

    def _blocks(self, name: str) -> Blocks | None:
        tensor = self._tensors.get(name)
        kind = None if tensor is None else _KINDS.get(tensor.tensor_type.name)
        if tensor is None or kind is None:
            log.warning("%s: not Q4_1 / Q8_0 in the GGUF file, kept in float32", name)
            return None
        k = int(tensor.shape[0])  # ggml's ne[0]: the input features
        return Blocks(kind, np.asarray(tensor.data), k)


def unpermute_rows(n: int, heads: int) -> npt.NDArray[np.int64]:
    """Row order that undoes llama.cpp's rotary permutation of a q/k weight of n rows: row
    r of the result is row `order[r]` of the file's."""
    half = n // heads // 2
    order = np.arange(n).reshape(heads, half, 2)  # file rows by (head, pair, member)
    return order.swapaxes(1, 2).reshape(n)  # by (head, member, pair): each half in turn


def concat(parts: list[Blocks | None]) -> Blocks | None:
    """The rows of several weights of one kind, in order (None if any is None or kinds differ)."""
    if any(p is None for p in parts):
        return None
    present = [p for p in parts if p is not None]
    if len({p.kind for p in present}) != 1 or len({p.k for p in present}) != 1:
        return None
    return Blocks(present[0].kind, np.concatenate([p.raw for p in present]), present[0].k)


def pack_gguf(blocks: Blocks) -> torch.Tensor:
    """The file's blocks -> (ceil(N / 16), K / 32, bytes) uint8 panels for the kernel: per
    (panel, block) the 16 rows' float32 scales (Q4_1: then the mins), then per k the 16 rows'
    quants (Q4_1: row j in the low nibble of byte j, row j + 8 in its high nibble)."""
    n, nb = blocks.n, blocks.k // 32
    raw = torch.from_numpy(np.array(blocks.raw)).view(n, nb, -1)  # a copy: the file is read-only
    panels = (n + 15) // 16
    padded = torch.zeros(panels * 16, nb, raw.shape[2], dtype=torch.uint8)
    padded[:n] = raw  # zero rows past N: scale 0, so weight 0
    grouped = padded.view(panels, 16, nb, -1).transpose(1, 2)  # (P, B, 16 rows, bytes)
    d = grouped[..., 0:2].contiguous().view(torch.float16).float()  # (P, B, 16, 1)
    if blocks.kind == Q4_1:
        m = grouped[..., 2:4].contiguous().view(torch.float16).float()
        qs = grouped[..., 4:20]  # (P, B, 16, 16): byte j: weight j (low), weight j + 16 (high)
        q = torch.cat([qs & 15, qs >> 4], dim=-1).transpose(2, 3)  # (P, B, 32 k, 16 rows)
        quants = (q[..., :8] | (q[..., 8:] << 4)).contiguous()  # (P, B, 32, 8)
        scales = torch.cat([d.squeeze(-1), m.squeeze(-1)], dim=-1)  # (P, B, 32) floats
    else:
        quants = grouped[..., 2:34].transpose(2, 3).contiguous()  # (P, B, 32 k, 16) int8 bits
        scales = d.squeeze(-1)  # (P, B, 16)
    scale_bytes = scales.contiguous().view(torch.uint8)
    return torch.cat([scale_bytes, quants.view(panels, nb, -1)], dim=-1).contiguous()


def packed_linear_gguf(
    x: torch.Tensor, packed: torch.Tensor, kind: int, n: int, bias: torch.Tensor | None
) -> torch.Tensor:
    """x (M, K) float32 or bfloat16 contiguous -> x W^T (+ bias, float32) (M, N) of x's dtype,
    W widened from `pack_gguf`'s panels in registers, sums in float32."""
    out: torch.Tensor = torch.ops.modelyard_kernels.packed_linear_gguf(x, packed, kind, n, bias)
    return out


def dequantize_gguf(packed: torch.Tensor, kind: int, n: int) -> torch.Tensor:
    """`pack_gguf`'s panels -> the (N, K) float32 weight (the GGUF's own dequantization)."""
    out: torch.Tensor = torch.ops.modelyard_kernels.dequantize_gguf(packed, kind, n)
    return out


class GGUFLinear:
    """y = x W^T + b on a weight kept as GGUF blocks (the `Linear` interface)."""

    __slots__ = ("_bias", "_kind", "_packed", "out_features")

    def __init__(self, blocks: Blocks, bias: torch.Tensor | None) -> None:
        self.out_features = blocks.n
        self._kind = blocks.kind
        self._packed = pack_gguf(blocks)
        self._bias = None if bias is None else bias.float().contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        n = self.out_features
        if x.shape[0] <= DECODE_ROWS:
            return packed_linear_gguf(x.contiguous(), self._packed, self._kind, n, self._bias)
        weight = dequantize_gguf(self._packed, self._kind, n).to(x.dtype)
        return F.linear(x, weight, None if self._bias is None else self._bias.to(x.dtype))


def packed_swiglu_gguf(
    x: torch.Tensor, packed: torch.Tensor, kind: int, width: int
) -> torch.Tensor:
    """x (M, K) float32 or bfloat16 contiguous, `pack_swiglu_gguf` panels -> (M, I)
    silu(x Wg^T) * (x Wu^T), the (M, 2I) projections never written out."""
    out: torch.Tensor = torch.ops.modelyard_kernels.packed_swiglu_gguf(x, packed, kind, width)
    return out


def pack_swiglu_gguf(gate: Blocks, up: Blocks) -> torch.Tensor:
    """`pack_gguf`'s panels of gate and up in turn (gate panel p, then up panel p)."""
    both = torch.stack([pack_gguf(gate), pack_gguf(up)], dim=1)  # (P, 2, B, bytes)
    return both.flatten(0, 1).contiguous()


class GGUFSwiGLU:
    """silu(x Wg^T) * (x Wu^T) on gate and up weights kept as GGUF blocks (the `SwiGLU` call)."""

    __slots__ = ("_kind", "_packed", "width")

    def __init__(self, gate: Blocks, up: Blocks) -> None:
        if gate.kind != up.kind or gate.n != up.n or gate.k != up.k:
            raise ValueError("gate and up weights of different GGUF types or shapes")
        self.width = gate.n
        self._kind = gate.kind
        self._packed = pack_swiglu_gguf(gate, up)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] <= DECODE_ROWS:
            return packed_swiglu_gguf(x.contiguous(), self._packed, self._kind, self.width)
        panels = self._packed.view(-1, 2, *self._packed.shape[1:])
        gate, up = (
            dequantize_gguf(panels[:, h].contiguous(), self._kind, self.width).to(x.dtype)
            for h in (0, 1)
        )
        return F.silu(F.linear(x, gate)).mul_(F.linear(x, up))
