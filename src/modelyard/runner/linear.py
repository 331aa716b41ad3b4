"""Linear layers with the weight prepared once for the CPU's fastest kernel.

`F.linear` hands each call to MKL's sgemm, which re-packs the (N, K) weight on every call; at
decode batch sizes (M = 1-64 rows) that packing dominates, worst for the lm_head (49152 x 576
for SmolLM2: 30-35 GFLOP/s at M = 32 on a 2-core AVX2 host). oneDNN can pack the weight once
into its blocked layout (`mkldnn._reorder_linear_weight`) and run every later call on it
(`mkldnn._linear_pointwise`, the kernels torch.compile's CPU backend uses for frozen fp32
linears): 1.2-2.5x faster at M = 32 on the same host, and no slower for prefill sizes.

Only float32 is packed: oneDNN's bfloat16 kernels need AVX-512 BF16 / AMX, and elsewhere fall
back to a reference path far slower than `F.linear`. `MODELYARD_PACKED_LINEAR=0` turns packing
off (for comparisons). Results differ from `F.linear` only in summation order (~1e-6 relative).
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

_PACK_BATCH_HINT = 32  # the row count oneDNN tunes its layout for; any row count works


def packing_available(dtype: torch.dtype) -> bool:
    """True when weights of this dtype are packed for oneDNN on this build and host."""
    if dtype != torch.float32 or os.environ.get("MODELYARD_PACKED_LINEAR", "1") == "0":
        return False
    available = bool(torch.backends.mkldnn.is_available())  # type: ignore[no-untyped-call]
    return available and hasattr(torch.ops.mkldnn, "_linear_pointwise")


class Linear:
    """y = x W^T + b for x (M, K), W (N, K), b (N,) or None; W packed when `pack`."""

    __slots__ = ("_bias", "_packed", "_weight", "out_features")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, *, pack: bool) -> None:
        self.out_features = int(weight.shape[0])
        self._bias = bias
        self._packed: torch.Tensor | None = None
        self._weight: torch.Tensor | None = weight
        if pack:
            self._packed = torch.ops.mkldnn._reorder_linear_weight(weight, _PACK_BATCH_HINT)
            self._weight = None  # the packed copy replaces it

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._packed is not None:
            out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
                x.contiguous(), self._packed, self._bias, "none", [None], ""
            )
            return out
        if self._weight is None:  # pragma: no cover - one of the two is always set
            raise RuntimeError("Linear has no weight")
        return F.linear(x, self._weight, self._bias)
