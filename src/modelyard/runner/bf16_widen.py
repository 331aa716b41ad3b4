"""bfloat16 linear layers on hosts whose kernels have no AVX-512 (AVX2-only x86, `generic`).

torch's own bf16 matmul is scalar there (oneDNN's bf16 kernels need AVX-512), so bf16 models
used to be no option on such hosts. Here a layer keeps its bf16 weight in 16-column panels
(`pack`: (ceil(N / 16), K, 16), k-major, the float32 GEMM's layout), and the runner's kernel
(`packed_linear_bf16w`) widens the weights to float32 (exact: the bits moved up) and sums over
k in float32 FMAs, so memory delivers half the bytes of float32:
- one row (a decode step of one request): four panel streams widened in registers, a shift for
  the even columns and a mask for the odd ones (`csrc/gemm_int8.cpp`), at memory's rate;
- more rows: the float32 GEMM (`csrc/gemm.cpp`), whose first micro-kernel call on each chunk of
  panels widens it into an L1 buffer that the calls for the other rows read: the float32 GEMM's
  sums, bit for bit, at about its speed, and no float32 copy of the weight at prompt sizes.
The result is rounded to bf16 once. The sums are float32 in their own order, so results can
differ from a float32 reference in bf16's last bit now and then (tested within one bf16 step).
`MODELYARD_BF16_GEMM=onednn` keeps torch's path.
"""

from __future__ import annotations

import torch

from modelyard.runner import kernels
from modelyard.runner.kernel_config import KernelConfig

_NR = 16  # output columns per panel (csrc/panels.h: kNR)


def available(config: KernelConfig) -> bool:
    """True where bf16 layers take this path: kernels built without AVX-512, switch not off."""
    return config.bf16_gemm != "onednn" and not config.has("avx512") and kernels.loaded()


def pack(weight: torch.Tensor) -> torch.Tensor:
    """(N, K) bfloat16 -> (ceil(N / 16), K, 16) panels, zero-padded past N."""
    n, k = weight.shape
    panels = (n + _NR - 1) // _NR
    padded = torch.zeros(panels * _NR, k, dtype=torch.bfloat16)
    padded[:n] = weight
    return padded.view(panels, _NR, k).transpose(1, 2).contiguous()


def unpack(packed: torch.Tensor, n: int) -> torch.Tensor:
    """The (N, K) weight of `pack`'s panels."""
    panels, k, _ = packed.shape
    return packed.transpose(1, 2).reshape(panels * _NR, k)[:n]


def linear(
    x: torch.Tensor, packed: torch.Tensor, n: int, bias: torch.Tensor | None
) -> torch.Tensor:
    """x (M, K) bfloat16 -> x W^T (+ bias, float32) (M, N) bfloat16."""
    out: torch.Tensor = torch.ops.modelyard_kernels.packed_linear_bf16w(
        x.contiguous(), packed, n, bias
    )
    return out
