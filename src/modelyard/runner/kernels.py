"""Native CPU kernels of the runner, loaded once per process (runner.kernel_build: built on
this host and cached, or prebuilt for every instruction-set kind).

csrc/: `paged_decode.cpp` attention from the paged KV cache (bf16 paths: `decode_dp.cpp`,
`decode_tiles.cpp`); `rms_norm.cpp` / `fused_ops.cpp` a decoder layer's element-wise steps in
one pass each (RMSNorm, add + RMSNorm, RoPE + cache write, SwiGLU); `gemm*.cpp` the linear
layers on weights packed at load (runner.linear), SwiGLU fused into gate/up; `lora.cpp` LoRA
adapters' deltas (runner.lora.manager); `sampling.cpp` draws the tokens of unfiltered sampling rows
(runner.sampler); `claim.h` splits work across threads; `rows.h` the scans of argmax and the draw.
The library is one per process: `load(config)` loads it as the runner's `KernelConfig` says
(the ModelRunner calls it first), and `loaded()` then tells the code it builds whether the
compiled ops are there. When none load (an error, logged) or `MODELYARD_NATIVE_KERNELS=0`:
`load` is False, and the pure-torch path computes the same. `python -m modelyard.runner.kernels`
(modelyard.kernels_cli) builds this host's kernels; `--prebuild DIR` every kind's into DIR;
`--report` prints the `KernelState` as JSON."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Literal

import torch

from modelyard.runner.kernel_build import load_kernels
from modelyard.runner.kernel_config import Bf16Gemm, KernelConfig, KernelState, cpu_flags

log = logging.getLogger(__name__)


def cpu_has(flag: str) -> bool:
    """True when /proc/cpuinfo lists `flag` (e.g. "avx512_bf16") for this CPU."""
    return flag in cpu_flags()


# this process's library, once loaded (one per process), and the switches that chose it
_STATE: list[tuple[tuple[object, ...], KernelState]] = []


def state(config: KernelConfig) -> KernelState:
    """The kernels this process loaded, loading them as `config` says on the first call
    (runner.kernel_build). The library stays for the process: a later config that would
    load another one (other kind, folders or the switch) is a ValueError; the other switches
    are the callers' own."""
    library = (config.native_kernels, config.isa, config.prebuilt_dir, config.kernel_dir)
    if not _STATE:
        _STATE.append((library, load_kernels(config)))
    elif _STATE[0][0] != library:
        raise ValueError("this process's kernels were loaded for another kernel configuration")
    return _STATE[0][1]


def load(config: KernelConfig) -> bool:
    """True when the kernels are loaded (loading them as `config` says on the first call)."""
    return state(config).kind != "none"


def loaded() -> bool:
    """True when `load` has loaded the kernels in this process (the compiled ops exist)."""
    return bool(_STATE) and _STATE[0][1].kind != "none"


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    window: int | None,
    layout: int = 0,
) -> torch.Tensor:
    """q (D, nh, hd) float32 or bfloat16 (heads contiguous, rows any stride apart: a view of the
    fused qkv rows will do); caches (nkv, NB, bs, hd) of q's dtype in `layout` (runner.kv_layout:
    0 plain, 1 tiles); block_tables
    (D, nb_max) long; seq_lens (D,) long keys per request -> (D, nh, hd) of q's dtype,
    contiguous. Call only after `load()` is True."""
    out: torch.Tensor = torch.ops.modelyard_kernels.paged_decode_attention(
        q, k_cache, v_cache, block_tables, seq_lens, scale, window or 0, layout
    )
    return out


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x (T, H) float32 or bfloat16 contiguous -> weight * x / sqrt(mean(x^2) + eps), as HF's
    RMSNorm (bf16: its bits, the mean of squares summed in torch's order: `torch_sum_width`)."""
    out: torch.Tensor = torch.ops.modelyard_kernels.rms_norm(x, weight, eps, torch_sum_width())
    return out


def add_rms_norm(
    x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """x += delta in place (the residual stream), then return rms_norm(x)."""
    out: torch.Tensor = torch.ops.modelyard_kernels.add_rms_norm(
        x, delta, weight, eps, torch_sum_width()
    )
    return out


@functools.cache
def torch_sum_width() -> int:
    """The vector width (8 or 16 floats) at which the kernels' sum of squares gives torch's own
    float32 sum bit for bit on this host (its order follows torch's vectorized cascade sum, whose
    vectors are as wide as the CPU capability torch dispatches to), checked on random rows of
    several widths; 0 where neither does, and the bf16 norms then call torch's reduction."""
    generator = torch.Generator().manual_seed(0)
    rows = [
        (torch.randn(17, h, generator=generator) * 4).bfloat16() for h in (576, 200, 1000, 4104)
    ]
    for width in (16, 8):
        found = (torch.ops.modelyard_kernels.mean_squares(x, width) for x in rows)
        expected = (x.float().pow(2).mean(-1) for x in rows)
        if all(torch.equal(a, b) for a, b in zip(found, expected, strict=True)):
            return width
    return 0


@contextlib.contextmanager
def team(enabled: bool = True) -> Iterator[None]:
    """Inside: the kernels' parallel calls share their work with a helper thread that spins
    between calls instead of sleeping (`csrc/claim.h`), for a decode step's ~150 short calls.
    A no-op when `enabled` is False or the kernels are not loaded."""
    if not (enabled and loaded()):
        yield
        return
    torch.ops.modelyard_kernels.team_begin()
    try:
        yield
    finally:
        torch.ops.modelyard_kernels.team_end()


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    """x (T, 2I) bfloat16 contiguous rows [gate | up] -> silu(gate) * up (T, I), rounded to bf16
    after the silu and after the product, as the two torch ops do."""
    out: torch.Tensor = torch.ops.modelyard_kernels.silu_mul(x)
    return out


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """torch.argmax(x, dim=-1) for x (R, V) float32 or bfloat16 contiguous: the first maximum
    (NaN counts as the maximum), faster than torch's CPU argmax (docs/benchmarks.md)"""
    out: torch.Tensor = torch.ops.modelyard_kernels.argmax_rows(x)
    return out


def rope_store(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    signed_sin: torch.Tensor,
    positions: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    num_heads: int,
    layout: int = 0,
) -> None:
    """Rotate the q and k heads of qkv (T, (nh + 2 nkv) hd) in place with the (P, hd) tables
    at `positions`, then write the k and v heads into the caches (nkv, NB, bs, hd), in `layout`
    (runner.kv_layout), at `slots` (flat slot = block * bs + offset)."""
    torch.ops.modelyard_kernels.rope_store(
        qkv, cos, signed_sin, positions, k_cache, v_cache, slots, num_heads, layout
    )


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """(N, K) float32 -> (ceil(N / 16), K, 16) panels for `packed_linear` (zero-padded)."""
    out: torch.Tensor = torch.ops.modelyard_kernels.pack_weight(weight)
    return out


def packed_linear(
    x: torch.Tensor, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None
) -> torch.Tensor:
    """x (M, K) float32 contiguous, `pack_weight` panels, N, bias (N,) or None -> (M, N)."""
    out: torch.Tensor = torch.ops.modelyard_kernels.packed_linear(x, packed, out_features, bias)
    return out


def bf16_gemm_supported() -> bool:
    """True when the kernels were built with AVX-512 BF16 (`packed_linear_bf16` runs)."""
    return loaded() and bool(torch.ops.modelyard_kernels.bf16_gemm_supported())


@functools.cache
def bf16_gemm_exact() -> bool:
    """True when the runner's AVX-512 BF16 GEMM gives oneDNN's bits on this host:
    `packed_linear_bf16` and `packed_swiglu_bf16` equal F.linear (and F.silu(gate) * up) on
    random rows of the model's shapes, checked once at load. Its summation order is the one
    oneDNN's AVX-512 BF16 kernels use; where oneDNN picks other kernels (AMX, another torch),
    the order differs."""
    if not bf16_gemm_supported():
        return False
    return _gives_onednns_bits(packed_linear_bf16, packed_swiglu_bf16, (1, 7, 32, 200))


# rows up to which the AMX kernel runs (oneDNN's AMX kernels sum in its order up to here)
AMX_ROWS = 32


@functools.cache
def amx_gemm_exact() -> bool:
    """True when the runner's AMX GEMM gives oneDNN's bits at up to `AMX_ROWS` rows here
    (oneDNN's own AMX kernels at those sizes sum each output over k in order, as tiles do;
    past 32 rows they split the sum otherwise), checked once at load like `bf16_gemm_exact`."""
    if not amx_ready():
        return False
    return _gives_onednns_bits(packed_linear_amx, packed_swiglu_amx, (1, 7, 17, AMX_ROWS))


def _gives_onednns_bits(
    linear: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor],
    swiglu: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor],
    row_counts: tuple[int, ...],
) -> bool:
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator).bfloat16()

    for k in (576, 1536):
        weight, gate, up = (randn(96, k) * 0.05 for _ in range(3))
        packed, both = pack_bf16(weight), pack_swiglu_bf16(gate, up)
        for rows in row_counts:
            x = randn(rows, k)
            same = torch.equal(linear(x, packed, 96), F.linear(x, weight)) and torch.equal(
                swiglu(x, both, 96), F.silu(F.linear(x, gate)) * F.linear(x, up)
            )
            if not same:
                log.warning(
                    "the runner's %s does not sum in oneDNN's order on this host", linear.__name__
                )
                return False
    return True


Bf16Path = Literal["avx512", "amx"]


@functools.cache
def bf16_gemm_path(mode: Bf16Gemm) -> Bf16Path | None:
    """Which of the runner's bf16 GEMMs replaces oneDNN at decode sizes (None: neither), for
    the config's `bf16_gemm` mode.

    `amx` where the kernels have AMX tiles, else `avx512` where they have AVX-512 BF16; by
    default (`MODELYARD_BF16_GEMM=auto`) only where it gives oneDNN's bits here; `always` takes
    it regardless (its own summation order: bf16 results then part from F.linear's in the last
    bit now and then); `onednn` never."""
    if mode == "onednn":
        return None
    if amx_ready():
        return "amx" if mode == "always" or amx_gemm_exact() else None
    if bf16_gemm_supported():
        return "avx512" if mode == "always" or bf16_gemm_exact() else None
    return None


def amx_ready() -> bool:
    """True when the kernels were built for AMX tiles and the OS granted this process the tile
    state (arch_prctl(ARCH_REQ_XCOMP_PERM), asked once): `packed_linear_amx` runs."""
    return loaded() and bool(torch.ops.modelyard_kernels.amx_ready())


def packed_linear_amx(x: torch.Tensor, packed: torch.Tensor, n: int) -> torch.Tensor:
    """`packed_linear_bf16` on AMX tiles, K a multiple of 32."""
    out: torch.Tensor = torch.ops.modelyard_kernels.packed_linear_amx(x, packed, n)
    return out


def packed_swiglu_amx(x: torch.Tensor, packed: torch.Tensor, width: int) -> torch.Tensor:
    """`packed_swiglu_bf16` on AMX tiles, K a multiple of 32."""
    out: torch.Tensor = torch.ops.modelyard_kernels.packed_swiglu_amx(x, packed, width)
    return out


def pack_bf16(weight: torch.Tensor) -> torch.Tensor:
    """(N, K) bfloat16, K even -> (ceil(N / 16), K / 2, 16, 2) panels for `packed_linear_bf16`."""
    out: torch.Tensor = torch.ops.modelyard_kernels.pack_bf16(weight)
    return out


def packed_linear_bf16(x: torch.Tensor, packed: torch.Tensor, n: int) -> torch.Tensor:
    """x (M, K) bfloat16 contiguous, `pack_bf16` panels, N -> x W^T (M, N) bfloat16."""
    out: torch.Tensor = torch.ops.modelyard_kernels.packed_linear_bf16(x, packed, n)
    return out


def pack_swiglu_bf16(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's gate and up weights (I, K) bfloat16, K even -> `pack_bf16` panels alternating
    16 gate rows and the same 16 up rows, as (ceil(I / 16), 2, K / 2, 16, 2), for
    `packed_swiglu_bf16` (which refuses `pack_bf16`'s 4-D panels)."""
    out: torch.Tensor = torch.ops.modelyard_kernels.pack_swiglu_bf16(gate, up)
    return out


def packed_swiglu_bf16(x: torch.Tensor, packed: torch.Tensor, width: int) -> torch.Tensor:
    """x (M, K) bfloat16 contiguous, `pack_swiglu_bf16` panels, I -> (M, I) bf16
    silu(x Wg^T) * (x Wu^T) with the bits of F.linear, F.silu and the product (each rounds to
    bf16), made tile by tile: the (M, 2I) projections are never written out."""
    out: torch.Tensor = torch.ops.modelyard_kernels.packed_swiglu_bf16(x, packed, width)
    return out


def pack_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) float weight -> int8 panels (ceil(N / 16), K, 16) for `packed_linear_int8` and a
    float32 scale per output row (zero-padded to the panels): symmetric, max |w| -> 127."""
    w = weight.float()
    scale = w.abs().amax(dim=1).clamp_min(1e-12) / 127.0  # (N,)
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    n, k = q.shape
    panels = (n + 15) // 16
    padded = torch.zeros(panels * 16, k, dtype=torch.int8)
    padded[:n] = q
    scales = torch.zeros(panels * 16)
    scales[:n] = scale
    return padded.view(panels, 16, k).transpose(1, 2).contiguous(), scales


def dequantize_int8(packed: torch.Tensor, scale: torch.Tensor, n: int) -> torch.Tensor:
    """`pack_int8`'s panels and scale back to the (N, K) float32 weight they stand for."""
    panels, k, _ = packed.shape
    rows = packed.transpose(1, 2).reshape(panels * 16, k)[:n]
    return rows.float() * scale[:n, None]


def packed_linear_int8(
    x: torch.Tensor,
    packed: torch.Tensor,
    scale: torch.Tensor,
    n: int,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """x (M, K) float32 or bfloat16 contiguous -> x (W_q * s)^T (+ bias, float32) (M, N) of x's
    dtype, the int8 weights widened in registers and the sums made in float32."""
    out: torch.Tensor = torch.ops.modelyard_kernels.packed_linear_int8(x, packed, scale, n, bias)
    return out


def pack_swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's gate and up weights (I, K) float32 -> panels for `packed_swiglu`, 16 gate rows
    and the same 16 up rows in turn (zero-padded)."""
    out: torch.Tensor = torch.ops.modelyard_kernels.pack_swiglu(gate, up)
    return out


def packed_swiglu(x: torch.Tensor, packed: torch.Tensor, width: int) -> torch.Tensor:
    """x (M, K) float32 contiguous, `pack_swiglu` panels, I -> (M, I) silu(x Wg^T) * (x Wu^T),
    computed tile by tile: the (M, 2I) projections are never written out."""
    out: torch.Tensor = torch.ops.modelyard_kernels.packed_swiglu(x, packed, width)
    return out


if __name__ == "__main__":  # `python -m modelyard.runner.kernels` (scripts/setup, the image):
    # the command is modelyard.kernels_cli, its process's config layer (run by name: the
    # runner imports nothing above it)
    import runpy

    runpy.run_module("modelyard.kernels_cli", run_name="__main__", alter_sys=True)
