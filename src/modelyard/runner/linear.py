"""Linear layers with the weight packed once for the runner's own float32 GEMM.

A decode step multiplies a few dozen rows (one per running request) by every weight. `F.linear`
hands that to MKL's sgemm, which re-packs the (N, K) weight on every call (30-35 GFLOP/s at 32
rows for SmolLM2's lm_head on a 2-core AVX2 host); oneDNN with a weight packed once does better
(~60-85) but still leaves half of the FMA peak (~92 GFLOP/s per core here) unused at 32 rows.
The runner's kernel (`csrc/gemm.cpp`: 16-column weight panels packed at load, a 6 x 16
register-blocked micro-kernel, the next weight chunk prefetched at decode sizes) reaches 85-95
GFLOP/s at 32 rows over the whole model's weights on the same host, and matches `F.linear` at
prefill sizes (~120 GFLOP/s at 2048 rows over SmolLM2's four layer shapes; see
docs/benchmarks.md).

`SwiGLU` packs a layer's gate and up weights together, 16 rows of each in turn, and the kernel
applies silu(gate) * up to each pair of 16-column tiles while they are still in L1, so the
(T, 2I) projection is never written to memory and read back (at 2048 prefill rows that pass cost
~3 % of the step).

Only float32 is packed; bfloat16 keeps `F.linear` on the unpacked weight. Without the compiled
kernels, or with `MODELYARD_PACKED_LINEAR=0` (for comparisons), float32 uses `F.linear` too.
Results differ from `F.linear` only in summation order (~1e-6 relative).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from modelyard.runner import kernels


def packing_available(dtype: torch.dtype) -> bool:
    """True when weights of this dtype are packed for the runner's GEMM on this host."""
    if dtype != torch.float32 or os.environ.get("MODELYARD_PACKED_LINEAR", "1") == "0":
        return False
    return kernels.load()


class Linear:
    """y = x W^T + b for x (M, K), W (N, K), b (N,) or None; W packed when `pack`."""

    __slots__ = ("_bias", "_packed", "_weight", "out_features")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, *, pack: bool) -> None:
        self.out_features = int(weight.shape[0])
        self._bias = bias
        self._packed: torch.Tensor | None = None
        self._weight: torch.Tensor | None = weight
        if pack:
            self._packed = kernels.pack_weight(weight)
            self._weight = None  # the packed copy replaces it

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._packed is not None:
            return kernels.packed_linear(
                x.contiguous(), self._packed, self.out_features, self._bias
            )
        if self._weight is None:  # pragma: no cover - one of the two is always set
            raise RuntimeError("Linear has no weight")
        return F.linear(x, self._weight, self._bias)


class SwiGLU:
    """x -> silu(x Wg^T) * (x Wu^T) for Wg, Wu (I, K): a Llama MLP's input side."""

    __slots__ = ("_packed", "_weight", "width")

    def __init__(self, gate: torch.Tensor, up: torch.Tensor, *, pack: bool) -> None:
        self.width = int(gate.shape[0])
        self._packed: torch.Tensor | None = None
        self._weight: torch.Tensor | None = None
        if pack:
            self._packed = kernels.pack_swiglu(gate, up)
        else:
            self._weight = torch.cat([gate, up]).contiguous()  # one matmul for both

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._packed is not None:
            return kernels.packed_swiglu(x.contiguous(), self._packed, self.width)
        if self._weight is None:  # pragma: no cover - one of the two is always set
            raise RuntimeError("SwiGLU has no weight")
        gate, up = F.linear(x, self._weight).chunk(2, dim=-1)
        return F.silu(gate).mul_(up)
