"""The runner's kernel switches and the host's instruction-set kind.

The config layer reads them once from the environment (`KernelConfig.from_env(os.environ)`, in
engine/config.py) into the engine config, which carries them to the engine worker; the
ModelRunner loads the kernels with them (`kernels.load(config)`) and hands them to what it
builds (the model's linear layers, KV layout, attention and decode loop). Nothing here reads
the environment.

Host kinds, best first (each includes the ones after it):
- `amx`: AMX tiles for bfloat16 (Intel Sapphire/Emerald/Granite Rapids) besides AVX-512 BF16;
- `avx512-bf16`: AVX-512 with `vdpbf16ps` (AMD Zen 4/5, Intel Cooper Lake, Ice Lake+ servers);
- `avx512`: AVX-512 without bf16 dot products (Skylake-X / Cascade Lake);
- `avx2`: AVX2 + FMA only;
- `generic`: none of these (the kernels build for the bare architecture).

`MODELYARD_ISA` caps the kind the kernels are built and dispatched for, so one host tests its
lower paths (an AMX host runs the `avx512-bf16` and `avx2` kernels). A cap above the host's kind
is ignored. Where the kernels come from (runner.kernel_build):
- `MODELYARD_PREBUILT_KERNELS=DIR`: load the library of the best kind this CPU runs from DIR,
  built ahead for every kind (`python -m modelyard.runner.kernels --prebuild DIR`, as the image
  does); nothing is compiled or written at start;
- otherwise they are built on this host into `MODELYARD_KERNEL_DIR` (default
  `~/.cache/modelyard/kernels`) on first use.
The other switches:
- `MODELYARD_NATIVE_KERNELS=0`: no compiled kernels at all (the pure-torch path);
- `MODELYARD_PACKED_LINEAR=0`: linear layers on `F.linear` (for comparisons);
- `MODELYARD_DECODE_TEAM=0`: decode steps without the spinning helper thread (csrc/claim.h);
- `MODELYARD_DECODE_LOOP=0`: a step's decoder layers called one kernel at a time from Python
  instead of in one compiled loop (runner.decode_loop; the same bits, for comparisons);
- `MODELYARD_PREFILL_SDPA=1`: prompt rows attended by SDPA (its bits) instead of the kernel;
- `MODELYARD_KV_TILES=0`: bf16 KV caches keep the plain layout on AMX hosts too (by default
  they take the tile layout that decode attention reads as AMX operands: runner.kv_layout);
- `MODELYARD_WEIGHTS=int8`: weight-only int8 linear layers (a scale per output row; the
  activations stay float32 / bf16): half of bf16's bytes per decode step, a quarter of float32's,
  at a small cost in quality (runner.linear; tests/integration/runner/test_int8_quality.py);
- `MODELYARD_WEIGHTS=gguf`: a model served from a GGUF file keeps the file's quantized blocks
  (Q4_0 to Q8_0, Q4_K, Q5_K, Q6_K) for its linear layers and lm_head (runner.gguf_weights): the
  same weights as its float32 conversion, 4-6x fewer bytes per decode step;
- `MODELYARD_GGUF_DOT`: how one decoding row meets Q4_0 / Q4_1 / Q4_K / Q6_K blocks: `q8`
  (default) quantizes the row to int8 per 32 inputs and multiplies bytes (csrc/gguf_dot.h, as
  llama.cpp does; 3-4x faster, the activations rounded), `float` widens the blocks to float32
  (the float32 model's logits to summation order);
- `MODELYARD_BF16_GEMM`: when the runner's own bf16 GEMM (AMX tiles, or AVX-512 BF16) replaces
  oneDNN's at decode sizes: `auto` (default) where it gives oneDNN's bits (checked at load),
  `always` wherever it is built (its own summation order where oneDNN's differs), `onednn` never.
  Where the kernels have no AVX-512, bf16 layers keep bf16 weights that the runner's GEMM widens
  to float32 (runner.bf16_widen) unless it is `onednn`.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import msgspec

HostKind = Literal["amx", "avx512-bf16", "avx512", "avx2", "generic"]
Bf16Gemm = Literal["auto", "always", "onednn"]
Weights = Literal["", "int8", "gguf"]
GgufDot = Literal["q8", "float"]
KINDS: tuple[HostKind, ...] = ("amx", "avx512-bf16", "avx512", "avx2", "generic")
_REQUIRED: dict[HostKind, tuple[str, ...]] = {
    "amx": ("amx_tile", "amx_bf16", "avx512_bf16", "avx512bw", "avx512vl"),
    "avx512-bf16": ("avx512_bf16", "avx512f", "avx512bw", "avx512vl"),
    "avx512": ("avx512f", "avx512bw", "avx512vl"),
    "avx2": ("avx2", "fma"),
    "generic": (),
}
# what caps torch's own libraries to a lower kind, as MODELYARD_ISA caps the kernels: ATen's
# kernels, oneDNN's (bf16 matmuls) and MKL's (float32 matmuls); set before torch starts
LIBRARY_CAPS: dict[HostKind, dict[str, str]] = {
    "avx512-bf16": {
        "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16",
        "ATEN_CPU_CAPABILITY": "avx512",
        "MKL_ENABLE_INSTRUCTIONS": "AVX512",
    },
    "avx2": {
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
    },
}
# compiler flags that make a kind's code and nothing above it (`-march=native` minus the rest)
_NO_AMX = ["-mno-amx-tile", "-mno-amx-bf16", "-mno-amx-int8"]
BUILD_FLAGS: dict[HostKind, list[str]] = {
    "amx": ["-march=native"],
    "avx512-bf16": ["-march=native", *_NO_AMX],
    "avx512": ["-march=native", *_NO_AMX, "-mno-avx512bf16"],
    "avx2": ["-march=haswell", "-mtune=native"],
    "generic": ["-march=x86-64", "-mtune=native"],
}
# the same kinds for any CPU that has them (built ahead on another machine: no `native`); the
# kernels' code branches on AVX2/FMA, AVX-512 F/BW/VL/BF16 and AMX tile/bf16 only
PORTABLE_FLAGS: dict[HostKind, list[str]] = {
    "amx": ["-march=sapphirerapids"],
    "avx512-bf16": ["-march=skylake-avx512", "-mavx512bf16"],
    "avx512": ["-march=skylake-avx512"],
    "avx2": ["-march=haswell"],
    "generic": ["-march=x86-64"],
}


def cpu_flags() -> frozenset[str]:
    """The flags /proc/cpuinfo lists for this CPU (empty where it cannot be read)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_kind(flags: frozenset[str] | None = None) -> HostKind:
    """The best kind whose flags this CPU lists."""
    flags = cpu_flags() if flags is None else flags
    if platform.machine() not in ("x86_64", "AMD64"):
        return "generic"
    return next(k for k in KINDS if all(f in flags for f in _REQUIRED[k]))


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelConfig:
    """What the runner's kernels may use; the config layer builds it with `from_env`."""

    isa: HostKind  # the kind the kernels are built and dispatched for (<= the host's)
    host: HostKind  # the host's own kind
    native_kernels: bool = True  # compiled kernels at all
    packed_linear: bool = True  # linear layers on weights packed at load
    decode_team: bool = True  # a spinning helper thread inside decode steps
    decode_loop: bool = True  # a step's decoder layers in one compiled call
    prefill_sdpa: bool = False  # prompt rows on SDPA instead of the paged kernel
    kv_tiles: bool = True  # bf16 KV caches in the tile layout where AMX attention reads it
    bf16_gemm: Bf16Gemm = "auto"  # when the runner's own bf16 GEMM replaces oneDNN
    weights: Weights = ""  # "int8" / "gguf": quantized linear layers
    gguf_dot: GgufDot = "q8"  # one row times GGUF blocks: int8 activations, or float32
    prebuilt_dir: str = ""  # load a library built ahead from here ("": build on this host)
    kernel_dir: str = ""  # where this host's builds go ("": ~/.cache/modelyard/kernels)

    def has(self, kind: HostKind) -> bool:
        """True when the selected kind includes `kind`'s instructions."""
        return KINDS.index(self.isa) <= KINDS.index(kind)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> KernelConfig:
        """The `MODELYARD_*` switches of `env` (the module docstring); ValueError if bad."""
        host = host_kind()
        wanted = env.get("MODELYARD_ISA", "") or host
        if wanted not in KINDS:
            raise ValueError(f"MODELYARD_ISA must be one of {', '.join(KINDS)}, not {wanted!r}")
        isa: HostKind = max(host, wanted, key=KINDS.index)
        gemm = env.get("MODELYARD_BF16_GEMM", "auto")
        if gemm not in ("auto", "always", "onednn"):
            raise ValueError(f"MODELYARD_BF16_GEMM must be auto, always or onednn, not {gemm!r}")
        weights = env.get("MODELYARD_WEIGHTS", "")
        if weights not in ("", "int8", "gguf"):
            raise ValueError(f"MODELYARD_WEIGHTS must be int8, gguf or unset, not {weights!r}")
        dot = env.get("MODELYARD_GGUF_DOT", "q8") or "q8"
        if dot not in ("q8", "float"):
            raise ValueError(f"MODELYARD_GGUF_DOT must be q8 or float, not {dot!r}")
        prefill = env.get("MODELYARD_PREFILL_SDPA", "0") or "0"
        if prefill not in ("0", "1"):
            raise ValueError(f"MODELYARD_PREFILL_SDPA must be 0 or 1, not {prefill!r}")
        kv_tiles = env.get("MODELYARD_KV_TILES", "1") or "1"
        if kv_tiles not in ("0", "1"):
            raise ValueError(f"MODELYARD_KV_TILES must be 0 or 1, not {kv_tiles!r}")
        return cls(
            isa=isa,
            host=host,
            native_kernels=env.get("MODELYARD_NATIVE_KERNELS", "1") != "0",
            packed_linear=env.get("MODELYARD_PACKED_LINEAR", "1") != "0",
            decode_team=env.get("MODELYARD_DECODE_TEAM", "1") != "0",
            decode_loop=env.get("MODELYARD_DECODE_LOOP", "1") != "0",
            prefill_sdpa=prefill == "1",
            kv_tiles=kv_tiles == "1",
            bf16_gemm=gemm,  # type: ignore[arg-type]
            weights=weights,  # type: ignore[arg-type]
            gguf_dot=dot,  # type: ignore[arg-type]
            prebuilt_dir=env.get("MODELYARD_PREBUILT_KERNELS", ""),
            kernel_dir=env.get("MODELYARD_KERNEL_DIR", ""),
        )


class KernelState(msgspec.Struct, frozen=True, kw_only=True):
    """Which kernels a process loaded (runner.kernel_build), as the API process reports it."""

    kind: HostKind | Literal["none"]  # the kind loaded; "none": the pure-torch path is in use
    # a prebuilt folder, a build on this host, switched off, or unknown (the check failed)
    source: Literal["prebuilt", "built", "off", "unknown"]
    error: str | None = None  # why none loaded (None when loaded or switched off)
