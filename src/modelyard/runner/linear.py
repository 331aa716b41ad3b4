"""Linear layers with the weight packed once for the runner's own float32 GEMM.

A decode step multiplies a few dozen rows (one per running request) by every weight. `F.linear`
hands that to MKL's sgemm, which re-packs the (N, K) weight on every call; oneDNN with a weight
packed once does better but still leaves much of the FMA peak unused at decode row counts. The
runner's kernel (`csrc/gemm.cpp`: 16-column weight panels packed at load, a 6 x 16
register-blocked micro-kernel, the next weight chunk prefetched as one is computed) runs near that
peak at decode sizes and level with `F.linear` at prefill sizes (figures: docs/benchmarks.md,
"Figures behind choices in the code"). Built for AVX-512, the micro-kernel holds 12 x 16
outputs in 16-float registers instead (same bits).

`SwiGLU` packs a layer's gate and up weights together, 16 rows of each in turn, and the kernel
applies silu(gate) * up to each pair of 16-column tiles while they are still in L1, so the
(T, 2I) projection is never written to memory and read back.

bfloat16 weights are packed once too, where torch's oneDNN has native bf16 kernels (AVX-512
BF16 / AMX hosts): oneDNN's own blocked layout (`mkldnn._reorder_linear_weight`), so a call no
longer re-lays the weight out. `F.linear` in bf16 runs the same oneDNN kernels, so the result is
bit-identical to it (tested), and faster at decode row counts; at prefill sizes the two are
level. At decode sizes (up to 64 rows) and K up to 3072,
bf16 runs the runner's own GEMM instead (`csrc/gemm_bf16.cpp`: `vdpbf16ps` panels, the next
weights prefetched), which sums in oneDNN's order and so gives the same bits (tested at 1-64
rows), and faster still over a decode step's weights. bf16 `SwiGLU` runs it at every row count
(the order holds there too, tested to 2048 rows), with silu(gate) * up applied to its tiles as
the float32 kernel does. On AMX hosts the runner's AMX tile GEMM (`csrc/gemm_amx.cpp`, the same
panels) runs instead at up to 32 rows, where oneDNN's AMX kernels sum in its order (tested at
1-32 rows; past 32 they split the sum otherwise and keep the layer), SwiGLU fused likewise,
faster than oneDNN at decode sizes, where a step is bound by streaming the weights. Which
kernel, if any, is `kernels.bf16_gemm_path(mode)`: only where it finds oneDNN's bits at load unless
`MODELYARD_BF16_GEMM=always` (runner.kernel_config); elsewhere bf16 keeps oneDNN. Where the
kernels have no AVX-512 (torch's bf16 matmul is scalar there) bf16 layers keep their weights
as bf16 panels that the runner's GEMM widens to float32 as it reads them (runner.bf16_widen).

With `MODELYARD_WEIGHTS=int8` (float32 or bf16 models, kernels built) every layer keeps its
weight as int8 with a float32 scale per output row instead (`csrc/gemm_int8.cpp`: widened in
registers, summed in float32) at decode sizes, and dequantized to the model's dtype for one
`F.linear` per call at prompt sizes: fewer bytes to stream per decode step, results within the
int8 rounding of the weights (the quality bounds are tested on the real model).

Without the compiled kernels, or with `MODELYARD_PACKED_LINEAR=0` (for comparisons), float32
and bfloat16 use `F.linear`. float32 results differ from `F.linear` only in summation order
(~1e-6 relative).

Each layer is given the runner's `KernelConfig` (`kernel_config=`), which says which of these
paths the switches allow.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F

from modelyard.runner import bf16_widen, kernels
from modelyard.runner.kernel_config import Bf16Gemm, KernelConfig

Gemm = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


def packing_available(dtype: torch.dtype, kernel_config: KernelConfig) -> bool:
    """True when weights of this dtype are packed once on this host (float32: the runner's
    GEMM; bfloat16: oneDNN's layout, where oneDNN has native bf16 kernels)."""
    if not kernel_config.packed_linear:
        return False
    if dtype == torch.bfloat16:
        return _onednn_bf16(kernel_config) or bf16_widen.available(kernel_config)
    return dtype == torch.float32 and kernels.loaded()


def _onednn_bf16(kernel_config: KernelConfig) -> bool:
    """oneDNN's bf16 matmul runs natively here (AVX-512 BF16 or AMX), not emulated."""
    if not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
        return False
    native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return native and kernels.cpu_has("avx512_bf16") and kernel_config.has("avx512-bf16")


def _pack_onednn(weight: torch.Tensor) -> torch.Tensor:
    """A bf16 (N, K) weight in oneDNN's blocked layout, for `_onednn_linear`."""
    packed: torch.Tensor = torch.ops.mkldnn._reorder_linear_weight(weight, _ROWS_HINT)
    return packed


def _onednn_linear(
    x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None
) -> torch.Tensor:
    out: torch.Tensor = torch.ops.mkldnn._linear_pointwise(
        x.contiguous(), packed, bias, "none", [], ""
    )
    return out


_ROWS_HINT = 32  # the row count oneDNN picks its layout for: a decode batch
_DECODE_ROWS = 64  # bf16 up to this many rows runs the runner's own GEMM where it is built
# ... for K up to this: there its summation order is oneDNN's (measured bit-identical at 1-64
# rows); past it oneDNN runs the layer, since its order was not measured there
_EXACT_K = 3072


def runner_gemm(k: int, *, swiglu: bool, mode: Bf16Gemm) -> tuple[Gemm, int] | None:
    """The runner's bf16 GEMM for inputs of K features, and the most rows it takes, where
    `kernels.bf16_gemm_path(mode)` has one that handles this K; None: oneDNN's."""
    path = kernels.bf16_gemm_path(mode)
    if path == "amx" and k % 32 == 0:
        gemm = kernels.packed_swiglu_amx if swiglu else kernels.packed_linear_amx
        return gemm, kernels.AMX_ROWS
    if path == "avx512" and k % 2 == 0 and k <= _EXACT_K:
        gemm = kernels.packed_swiglu_bf16 if swiglu else kernels.packed_linear_bf16
        return gemm, _ANY_ROWS if swiglu else _DECODE_ROWS
    return None


_ANY_ROWS = 1 << 62


class NativeWeight(NamedTuple):
    """A weight packed for one of the runner's GEMMs (`kind`: float32, avx512 or amx, the bf16
    path) and the most rows that GEMM takes for it."""

    kind: str
    packed: torch.Tensor
    max_rows: int


def _bf16_kind(mode: Bf16Gemm) -> str:
    path = kernels.bf16_gemm_path(mode)
    if path is None:  # pragma: no cover - a runner GEMM is only set up on a path
        raise RuntimeError("no runner bf16 GEMM on this host")
    return path


class Linear:
    """y = x W^T + b for x (M, K), W (N, K), b (N,) or None; W packed when `pack`."""

    __slots__ = (
        "_bf16",
        "_bias",
        "_gemm",
        "_int8",
        "_mode",
        "_onednn",
        "_packed",
        "_weight",
        "_widen",
        "out_features",
    )

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        *,
        pack: bool,
        kernel_config: KernelConfig,
        decode: bool = True,
    ) -> None:
        """`pack`: as `packing_available` says for the weight's dtype; `decode`: False leaves
        bf16 rows of every count to oneDNN (for SwiGLU's prefill)."""
        self.out_features = int(weight.shape[0])
        self._mode = kernel_config.bf16_gemm
        self._bias = bias
        self._packed: torch.Tensor | None = None
        self._onednn: torch.Tensor | None = None
        self._bf16: torch.Tensor | None = None
        self._gemm: tuple[Gemm, int] | None = None  # the runner's bf16 GEMM, up to rows
        self._int8: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None
        self._weight: torch.Tensor | None = weight
        self._widen: tuple[torch.Tensor, torch.Tensor | None] | None = None
        if pack and int8_weights(kernel_config):
            packed, scale = kernels.pack_int8(weight)
            self._int8 = (packed, scale, None if bias is None else bias.float().contiguous())
            self._weight = None
        elif pack and weight.dtype == torch.bfloat16 and bf16_widen.available(kernel_config):
            bias32 = None if bias is None else bias.float().contiguous()
            self._widen = (bf16_widen.pack(weight), bias32)
            self._weight = None
        elif pack and weight.dtype == torch.bfloat16:
            self._onednn = _pack_onednn(weight)
            self._weight = None
            if bias is None and decode:
                self._gemm = runner_gemm(int(weight.shape[1]), swiglu=False, mode=self._mode)
            if self._gemm is not None:
                self._bf16 = kernels.pack_bf16(weight)
        elif pack:
            self._packed = kernels.pack_weight(weight)
            self._weight = None  # the packed copy replaces it

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._packed is not None:
            return kernels.packed_linear(
                x.contiguous(), self._packed, self.out_features, self._bias
            )
        if self._int8 is not None:
            return self._int8_linear(x)
        if self._widen is not None:
            return bf16_widen.linear(x, self._widen[0], self.out_features, self._widen[1])
        if self._bf16 is not None and self._gemm is not None and x.shape[0] <= self._gemm[1]:
            return self._gemm[0](x.contiguous(), self._bf16, self.out_features)
        if self._onednn is not None:
            return _onednn_linear(x, self._onednn, self._bias)
        if self._weight is None:  # pragma: no cover - one of the two is always set
            raise RuntimeError("Linear has no weight")
        return F.linear(x, self._weight, self._bias)

    def native(self) -> NativeWeight | None:
        """This layer as runner.decode_loop calls it: where the runner's own GEMM runs it and it
        has no bias; None elsewhere."""
        if self._bias is not None:
            return None
        if self._packed is not None:
            return NativeWeight("float32", self._packed, _ANY_ROWS)
        if self._bf16 is not None and self._gemm is not None:
            return NativeWeight(_bf16_kind(self._mode), self._bf16, self._gemm[1])
        return None

    def _int8_linear(self, x: torch.Tensor) -> torch.Tensor:
        packed, scale, bias = self._int8  # type: ignore[misc]
        n = self.out_features
        if x.shape[0] <= _DECODE_ROWS:
            return kernels.packed_linear_int8(x.contiguous(), packed, scale, n, bias)
        weight = kernels.dequantize_int8(packed, scale, n).to(x.dtype)
        return F.linear(x, weight, None if bias is None else bias.to(x.dtype))


def int8_weights(kernel_config: KernelConfig) -> bool:
    """True when linear layers keep int8 weights (MODELYARD_WEIGHTS=int8, kernels loaded)."""
    return kernel_config.weights == "int8" and kernels.loaded()


class SwiGLU:
    """x -> silu(x Wg^T) * (x Wu^T) for Wg, Wu (I, K): a Llama MLP's input side."""

    __slots__ = ("_bf16", "_both", "_fused_act", "_gemm", "_mode", "_packed", "width")

    def __init__(
        self, gate: torch.Tensor, up: torch.Tensor, *, pack: bool, kernel_config: KernelConfig
    ) -> None:
        self.width = int(gate.shape[0])
        self._mode = kernel_config.bf16_gemm
        self._packed: torch.Tensor | None = None
        self._bf16: torch.Tensor | None = None
        self._both: Linear | None = None
        # bf16 with the kernels built: the activation in one pass (torch's two roundings)
        self._fused_act = gate.dtype == torch.bfloat16 and kernels.loaded()
        int8 = pack and int8_weights(kernel_config)  # the concatenated weight: an int8 Linear
        bf16 = pack and gate.dtype == torch.bfloat16 and not int8
        gemm = runner_gemm(int(gate.shape[1]), swiglu=True, mode=self._mode) if bf16 else None
        self._gemm = gemm
        if pack and gate.dtype == torch.float32 and not int8:
            self._packed = kernels.pack_swiglu(gate, up)
        if self._gemm is not None:
            # bf16 on the runner's GEMM (oneDNN's summation order: tested) with the activation
            # applied to its tiles
            self._bf16 = kernels.pack_swiglu_bf16(gate, up)
        if self._packed is None and (self._gemm is None or self._gemm[1] < _ANY_ROWS):
            # one matmul for both, for every row count or past the runner GEMM's (bf16: packed
            # by oneDNN when `pack`)
            both = torch.cat([gate, up]).contiguous()
            self._both = Linear(both, None, pack=pack, kernel_config=kernel_config, decode=False)

    def native(self) -> NativeWeight | None:
        """As `Linear.native`: gate/up packed together for the runner's fused SwiGLU."""
        if self._packed is not None:
            return NativeWeight("float32", self._packed, _ANY_ROWS)
        if self._bf16 is not None and self._gemm is not None:
            return NativeWeight(_bf16_kind(self._mode), self._bf16, self._gemm[1])
        return None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._packed is not None:
            return kernels.packed_swiglu(x.contiguous(), self._packed, self.width)
        if self._bf16 is not None and self._gemm is not None and x.shape[0] <= self._gemm[1]:
            return self._gemm[0](x.contiguous(), self._bf16, self.width)
        if self._both is None:  # pragma: no cover - one of the two is always set
            raise RuntimeError("SwiGLU has no weight")
        both = self._both(x)
        if self._fused_act:
            return kernels.silu_mul(both.contiguous())
        gate, up = both.chunk(2, dim=-1)
        return F.silu(gate).mul_(up)
