"""Linear layers, gated MLPs and embeddings on a GGUF file's own quantized blocks
(`MODELYARD_WEIGHTS=gguf`, or a model's `gguf_blocks: on`).

A weight the file holds in Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K or Q6_K keeps its blocks
(runner.gguf_blocks: `Blocks`, `kind_of`); other types (Q2_K, Q3_K, float) are the source's
float weights. The blocks are repacked once at load into panels of 16 output rows per 32-k block
(`pack_gguf`), which `csrc/gemm_gguf.cpp` widens in registers at decode row counts. The weights it
computes with are bit for bit gguf's own float32 dequantization (tested): the kernel only sums in
its own order, so the model is the same model, with a step streaming 4-6x fewer bytes than in
float32. Prompts run the same kernel (each panel widened once for all rows, or bytes times bytes
with int8 activations): dequantizing a whole weight to call `F.linear` costs more than the
product.
An embedding table dequantizes only the rows it gathers (`GGUFEmbedding`).

llama.cpp's converter stores q_proj and k_proj with the rows of each head interleaved for its
rotary layout; `unpermute_rows` gives the row order transformers (and so the converted folder)
uses.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F

from modelyard.runner.gguf_blocks import (
    NAMES,
    Q4_1,
    Q8_0,
    Blocks,
    dequantize_blocks,
    kind_of,
    layout_of,
    pack_gguf,
)
from modelyard.runner.kernel_config import KernelConfig

__all__ = [
    "DOT_FLOAT",
    "DOT_Q8",
    "Q4_1",
    "Q8_0",
    "Blocks",
    "GGUFEmbedding",
    "GGUFGatedMLP",
    "GGUFLinear",
    "GGUFSwiGLU",
    "GGUFWeights",
    "concat",
    "dequantize_blocks",
    "dequantize_gguf",
    "dot_of",
    "kind_of",
    "pack_gguf",
    "packed_linear_gguf",
    "packed_swiglu_gguf",
    "unpermute_rows",
]

log = logging.getLogger(__name__)

Projection = Callable[[torch.Tensor], torch.Tensor]
DOT_FLOAT, DOT_Q8 = 0, 1  # the kernel's products: float32, or int8 activations for one row

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


def dot_of(config: KernelConfig) -> int:
    """The kernel's product for one row as the config's `gguf_dot` says."""
    return DOT_Q8 if config.gguf_dot == "q8" else DOT_FLOAT


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
        kind = None if tensor is None else kind_of(tensor.tensor_type.name)
        if tensor is None or kind is None:
            log.warning("%s: no kernel for its type in the GGUF file, kept in float32", name)
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


def packed_linear_gguf(
    x: torch.Tensor,
    packed: torch.Tensor,
    kind: int,
    n: int,
    bias: torch.Tensor | None,
    dot: int = DOT_FLOAT,
) -> torch.Tensor:
    """x (M, K) float32 or bfloat16 contiguous -> x W^T (+ bias, float32) (M, N) of x's dtype,
    W widened from `pack_gguf`'s panels in registers, sums in float32; with `DOT_Q8` one row
    is quantized to int8 and multiplied by int8 dot products (csrc/gguf_dot.h)."""
    out: torch.Tensor = torch.ops.modelyard_kernels.packed_linear_gguf(
        x, packed, kind, n, bias, dot
    )
    return out


def dequantize_gguf(packed: torch.Tensor, kind: int, n: int) -> torch.Tensor:
    """`pack_gguf`'s panels -> the (N, K) float32 weight (the GGUF's own dequantization)."""
    out: torch.Tensor = torch.ops.modelyard_kernels.dequantize_gguf(packed, kind, n)
    return out


class GGUFLinear:
    """y = x W^T + b on a weight kept as GGUF blocks (the `Linear` interface)."""

    __slots__ = ("_bias", "_dot", "_kind", "_packed", "out_features")

    def __init__(self, blocks: Blocks, bias: torch.Tensor | None, dot: int = DOT_FLOAT) -> None:
        self.out_features = blocks.n
        self._kind, self._dot = blocks.kind, dot
        self._packed = pack_gguf(blocks)
        self._bias = None if bias is None else bias.float().contiguous()

    @staticmethod
    def of_parts(
        parts: list[Blocks], bias: torch.Tensor | None, dot: int = DOT_FLOAT
    ) -> Projection:
        """The output rows of several weights in order (q, k, v): one layer when they are of
        one kind, else one per run of a kind, their outputs concatenated."""
        if len({p.k for p in parts}) != 1:
            raise ValueError("GGUF weights of different input features")
        runs: list[list[Blocks]] = []
        for part in parts:
            if runs and runs[-1][0].kind == part.kind:
                runs[-1].append(part)
            else:
                runs.append([part])
        layers, row = [], 0
        for run in runs:
            joined = Blocks(run[0].kind, np.concatenate([p.raw for p in run]), run[0].k)
            run_bias = None if bias is None else bias[row : row + joined.n]
            layers.append(GGUFLinear(joined, run_bias, dot))
            row += joined.n
        return layers[0] if len(layers) == 1 else _Concatenated(layers)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        n = self.out_features
        return packed_linear_gguf(
            x.contiguous(), self._packed, self._kind, n, self._bias, self._dot
        )


class _Concatenated:
    """Several layers' outputs side by side: (M, K) -> (M, sum of their N)."""

    __slots__ = ("_layers", "out_features")

    def __init__(self, layers: list[GGUFLinear]) -> None:
        self._layers = layers
        self.out_features = sum(layer.out_features for layer in layers)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([layer(x) for layer in self._layers], dim=-1)


def packed_swiglu_gguf(
    x: torch.Tensor, packed: torch.Tensor, kind: int, width: int, dot: int = DOT_FLOAT
) -> torch.Tensor:
    """x (M, K) float32 or bfloat16 contiguous, `pack_swiglu_gguf` panels -> (M, I)
    silu(x Wg^T) * (x Wu^T), the (M, 2I) projections never written out."""
    out: torch.Tensor = torch.ops.modelyard_kernels.packed_swiglu_gguf(x, packed, kind, width, dot)
    return out


def pack_swiglu_gguf(gate: Blocks, up: Blocks) -> torch.Tensor:
    """`pack_gguf`'s panels of gate and up in turn (gate panel p, then up panel p); their kinds
    of one layout (`layout_of`)."""
    both = torch.stack([pack_gguf(gate), pack_gguf(up)], dim=1)  # (P, 2, B, bytes)
    return both.flatten(0, 1).contiguous()


class GGUFGatedMLP:
    """act(x Wg^T) * (x Wu^T) on gate and up weights kept as GGUF blocks (the `SwiGLU` call):
    act silu, or gelu_tanh (Gemma's gelu_pytorch_tanh). silu with gate and up in one panel
    layout runs the fused kernel; otherwise two layers and the activation in torch."""

    __slots__ = ("_run", "width")

    def __init__(
        self, gate: Blocks, up: Blocks, act: Literal["silu", "gelu_tanh"], dot: int = DOT_FLOAT
    ) -> None:
        if gate.n != up.n or gate.k != up.k:
            raise ValueError("gate and up weights of different shapes")
        self.width = gate.n
        fused = act == "silu" and layout_of(gate.kind) == layout_of(up.kind)
        self._run: Projection = (
            _FusedSwiGLU(gate, up, dot) if fused else _TwoLayers(gate, up, act, dot)
        )

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._run(x)


class _FusedSwiGLU:
    __slots__ = ("_dot", "_kind", "_packed", "_width")

    def __init__(self, gate: Blocks, up: Blocks, dot: int) -> None:
        self._kind, self._width, self._dot = gate.kind, gate.n, dot
        self._packed = pack_swiglu_gguf(gate, up)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return packed_swiglu_gguf(x.contiguous(), self._packed, self._kind, self._width, self._dot)


class _TwoLayers:
    __slots__ = ("_act", "_gate", "_up")

    def __init__(
        self, gate: Blocks, up: Blocks, act: Literal["silu", "gelu_tanh"], dot: int
    ) -> None:
        self._gate, self._up = GGUFLinear(gate, None, dot), GGUFLinear(up, None, dot)
        self._act = act

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self._gate(x), self._up(x)
        if self._act == "silu":
            return F.silu(gate).mul_(up)
        return F.gelu(gate, approximate="tanh").mul_(up)


class GGUFSwiGLU(GGUFGatedMLP):
    """silu(x Wg^T) * (x Wu^T): `GGUFGatedMLP`'s silu case."""

    __slots__ = ()

    def __init__(self, gate: Blocks, up: Blocks, dot: int = DOT_FLOAT) -> None:
        super().__init__(gate, up, "silu", dot)


class GGUFEmbedding:
    """Rows of an embedding table kept as GGUF blocks, dequantized only as gathered; `blocks`
    also serve a tied lm_head (`GGUFLinear(embedding.blocks, None)`)."""

    __slots__ = ("blocks",)

    def __init__(self, blocks: Blocks) -> None:
        self.blocks = blocks

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (T,) int64 -> (T, K) float32, gguf's dequantization of those rows."""
        rows = self.blocks.raw[ids.cpu().numpy()]  # (T, row bytes): a copy of T rows
        return dequantize_blocks(Blocks(self.blocks.kind, rows, self.blocks.k))

    def __repr__(self) -> str:
        return f"GGUFEmbedding({NAMES[self.blocks.kind]}, {self.blocks.n} x {self.blocks.k})"
