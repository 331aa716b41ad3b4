"""Native CPU kernels of the runner, compiled once per machine and cached.

csrc/: `paged_decode.cpp` attention from the paged KV cache (bf16 paths: `decode_dp.cpp`,
`decode_tiles.cpp`); `rms_norm.cpp` / `fused_ops.cpp` a decoder layer's element-wise steps in
one pass each (RMSNorm, add + RMSNorm, RoPE + cache write, SwiGLU); `gemm*.cpp` the linear
layers on weights packed at load (runner.linear), SwiGLU fused into gate/up; `lora.cpp` LoRA
adapters' deltas (runner.lora); `sampling.cpp` draws the tokens of unfiltered sampling rows
(runner.sampler); `claim.h` splits work across threads; `rows.h` the scans of argmax and the draw.
torch's extension builder (g++, ninja) builds them into `MODELYARD_KERNEL_DIR` (default
`~/.cache/modelyard/kernels`) under a name hashing sources, their folder, torch and CPU flags,
one builder at a time (runner.build_lock); `scripts/setup` builds ahead. A failed build or
`MODELYARD_NATIVE_KERNELS=0`: `load()` is False, and the pure-torch path computes the same."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

import torch

from modelyard.runner.build_lock import exclusive_build
from modelyard.runner.kernel_config import BUILD_FLAGS, cpu_flags, kernel_config

log = logging.getLogger(__name__)

_CSRC = Path(__file__).with_name("csrc")
_SOURCES = tuple(sorted(_CSRC.glob("*.cpp")))  # bindings.cpp registers every op (ops.h)
_HEADERS = tuple(sorted(_CSRC.glob("*.h")))


def _flags() -> list[str]:
    """Compiler flags for the selected instruction-set kind (kernel_config: MODELYARD_ISA)."""
    return ["-O3", *BUILD_FLAGS[kernel_config().isa], "-fopenmp", "-ffp-contract=fast"]


def cpu_has(flag: str) -> bool:
    """True when /proc/cpuinfo lists `flag` (e.g. "avx512_bf16") for this CPU."""
    return flag in cpu_flags()


def _build_name() -> str:
    # the sources' folder too: torch's build files name sources by path (one build per checkout)
    digest = hashlib.sha256()
    texts = [f.read_text() for f in (*_SOURCES, *_HEADERS)]
    folder = str(_SOURCES[0].parent.resolve())
    flags = " ".join(sorted(cpu_flags()))
    for part in (*texts, folder, torch.__version__, " ".join(_flags()), flags):
        digest.update(part.encode())
    return f"modelyard_kernels_{kernel_config().isa}_{digest.hexdigest()[:12]}"


def _build_dir(name: str) -> Path:
    root = os.environ.get("MODELYARD_KERNEL_DIR") or Path.home() / ".cache/modelyard/kernels"
    path = Path(root) / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def _ninja_on_path() -> None:
    """torch's builder runs `ninja` from PATH; the `ninja` package's copy lives in the venv's
    bin folder, which is not on PATH when the venv's python is run directly."""
    if shutil.which("ninja"):
        return
    with contextlib.suppress(ImportError):
        import ninja

        os.environ["PATH"] = f"{ninja.BIN_DIR}{os.pathsep}{os.environ.get('PATH', '')}"


@functools.cache
def load() -> bool:
    """Build (first time) and register the kernels; False when unavailable or switched off."""
    if not kernel_config().native_kernels:
        return False
    from torch.utils import cpp_extension

    name = _build_name()
    _ninja_on_path()
    build_dir = _build_dir(name)
    try:
        with exclusive_build(build_dir):
            cpp_extension.load(
                name=name,
                sources=[str(f) for f in _SOURCES],
                extra_cflags=_flags(),
                extra_ldflags=["-fopenmp"],
                build_directory=str(build_dir),
                is_python_module=False,
                verbose=False,
            )
    except Exception as exc:  # a missing compiler or ninja: fall back, loudly
        log.warning("native kernels unavailable, using the torch path: %s", exc)
        return False
    return True


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
    A no-op when `enabled` is False or the kernels are not built."""
    if not (enabled and load()):
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
    return load() and bool(torch.ops.modelyard_kernels.bf16_gemm_supported())


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
def bf16_gemm_path() -> Bf16Path | None:
    """Which of the runner's bf16 GEMMs replaces oneDNN at decode sizes (None: neither).

    `amx` where the kernels have AMX tiles, else `avx512` where they have AVX-512 BF16; by
    default (`MODELYARD_BF16_GEMM=auto`) only where it gives oneDNN's bits here; `always` takes
    it regardless (its own summation order: bf16 results then part from F.linear's in the last
    bit now and then); `onednn` never."""
    mode = kernel_config().bf16_gemm
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
    return load() and bool(torch.ops.modelyard_kernels.amx_ready())


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


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    state = "ready" if load() else "unavailable (torch path in use)"
    print(f"modelyard kernels for {kernel_config().isa}:", state)
