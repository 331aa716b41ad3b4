"""Every decoder layer of a step in one compiled call (`csrc/decode_loop.cpp`).

`DecoderModel._fused_layers` runs a layer as eight kernel calls from Python. On a 2-core host the
interpreter and torch's dispatcher between those calls take ~1-1.5 ms of a decode step, while
the step's helper thread (`kernels.team`) only spins. Where every layer's projections run on
one of the runner's own GEMMs (float32 panels, or the bf16 AVX-512 / AMX kernels) without
biases or LoRA, and the step's attention is the compiled kernel's, `DecodeLoop` calls the same
kernels in the same order from C++: the same bits, without the gaps.
`MODELYARD_DECODE_LOOP=0` keeps the Python loop (for comparisons).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from modelyard.runner import kernels
from modelyard.runner.attention import AttentionMetadata, kernel_attends
from modelyard.runner.kernel_config import KernelConfig
from modelyard.runner.linear import Linear, NativeWeight, SwiGLU

GEMM_KINDS = {"float32": 0, "avx512": 1, "amx": 2}  # csrc/decode_loop.cpp's Gemm


@dataclass(frozen=True, slots=True, kw_only=True)
class LoopShape:
    """What the loop needs of the model besides its weights."""

    num_heads: int
    head_dim: int
    eps: float
    scale: float
    layout: int  # the caches' layout (runner.kv_layout)
    prefill_sdpa: bool  # the kernel switch: prefill chunks on SDPA (runner.attention)


@dataclass(frozen=True, slots=True)
class DecodeLoop:
    """The packed weights of every layer in the kernel's order, and the caches they fill."""

    gemm: int  # GEMM_KINDS
    max_rows: int  # the most rows every layer's GEMM takes
    intermediate: int
    weights: list[torch.Tensor]  # per layer: qkv, o, gate/up, down
    norms: list[torch.Tensor]  # per layer: input, post-attention
    k_caches: list[torch.Tensor]
    v_caches: list[torch.Tensor]
    shape: LoopShape

    @classmethod
    def build(
        cls,
        projections: Sequence[tuple[object, object, object, object]],
        norms: Sequence[tuple[torch.Tensor, torch.Tensor]],
        caches: tuple[list[torch.Tensor], list[torch.Tensor]],
        shape: LoopShape,
        kernel_config: KernelConfig,
    ) -> DecodeLoop | None:
        """projections: each layer's (qkv, o, mlp_in, down). None where a layer has another
        kind of projection (LoRA hooks, int8, GGUF, oneDNN, a bias) or the kinds differ, or
        `kernel_config.decode_loop` is off."""
        if not (kernel_config.decode_loop and kernels.loaded()):
            return None
        found = [_native(layer) for layer in projections]
        if not found or any(layer is None for layer in found):
            return None
        parts = [part for layer in found if layer is not None for part in layer]
        kinds = {part.kind for part in parts}
        if len(kinds) != 1:
            return None
        mlp_in = projections[0][2]
        assert isinstance(mlp_in, SwiGLU)
        return cls(
            gemm=GEMM_KINDS[kinds.pop()],
            max_rows=min(part.max_rows for part in parts),
            intermediate=mlp_in.width,
            weights=[part.packed for part in parts],
            norms=[norm for pair in norms for norm in pair],
            k_caches=caches[0],
            v_caches=caches[1],
            shape=shape,
        )

    def covers(self, meta: AttentionMetadata, rows: int, dtype: torch.dtype) -> bool:
        """True when a step of `rows` rows runs here exactly as the Python loop would run it."""
        shape = self.shape
        return rows <= self.max_rows and kernel_attends(
            meta, dtype, shape.head_dim, shape.layout, prefill_sdpa=shape.prefill_sdpa
        )

    def run(
        self, x: torch.Tensor, meta: AttentionMetadata, cos: torch.Tensor, signed_sin: torch.Tensor
    ) -> None:
        """x (T, H) contiguous, the residual stream after the embedding: updated in place to
        the last layer's output (before the final norm)."""
        tables, seq_lens = meta.kernel_rows()
        s = self.shape
        torch.ops.modelyard_kernels.decode_layers(
            x, self.weights, self.norms, self.k_caches, self.v_caches, cos, signed_sin,
            meta.positions, meta.slot_mapping, tables, seq_lens, self.gemm, s.num_heads,
            self.intermediate, s.eps, s.scale, meta.sliding_window or 0, s.layout,
            kernels.torch_sum_width(),
        )  # fmt: skip


def _native(layer: tuple[object, object, object, object]) -> list[NativeWeight] | None:
    qkv, o, mlp_in, down = layer
    if not (isinstance(qkv, Linear) and isinstance(o, Linear) and isinstance(down, Linear)):
        return None
    if not isinstance(mlp_in, SwiGLU):
        return None
    parts = [qkv.native(), o.native(), mlp_in.native(), down.native()]
    return None if any(part is None for part in parts) else [p for p in parts if p is not None]
