"""bfloat16 linear layers on hosts whose kernels have no AVX-512 (AVX2-only x86, `generic`).

torch's own bf16 matmul is scalar there (oneDNN's bf16 kernels need AVX-512), so bf16 models
used to be no option on such hosts. Here a layer keeps its bf16 weight in 16-column panels
(`pack`: (ceil(N / 16), K, 16), k-major), and:
- up to `DECODE_ROWS` rows (decode steps) the runner's kernel (`csrc/gemm_int8.cpp`,
  `packed_linear_bf16w`) streams the panels, widens each bf16 weight to float32 in registers
  (exact: the bits moved up) and sums over k in float32 FMAs: half the bytes of float32 per
  step;
- past that (prompts) the panels are widened to a float32 weight for one `F.linear` in float32
  (MKL's AVX2 sgemm; widening is ~1 % of the matmul's time).
Either way the result is rounded to bf16 once. The sums are float32 in their own order, so
results can differ from a float32 reference in bf16's last bit now and then (tested within one
bf16 step). `MODELYARD_BF16_GEMM=onednn` keeps torch's path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from modelyard.runner import kernels
from modelyard.runner.kernel_config import kernel_config

DECODE_ROWS = 64  # up to this many rows a call runs the kernel, past it F.linear in float32
_NR = 16  # output columns per panel (csrc/gemm_int8.cpp: kNR)


def available() -> bool:
    """True where bf16 layers take this path: kernels built without AVX-512, switch not off."""
    config = kernel_config()
    return config.bf16_gemm != "onednn" and not config.has("avx512") and kernels.load()


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
    if x.shape[0] <= DECODE_ROWS:
        out: torch.Tensor = torch.ops.modelyard_kernels.packed_linear_bf16w(
            x.contiguous(), packed, n, bias
        )
        return out
    return F.linear(x.float(), unpack(packed, n).float(), bias).to(torch.bfloat16)
