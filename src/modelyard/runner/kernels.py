"""Native CPU kernels of the runner, compiled once per machine and cached.

`csrc/paged_decode.cpp` holds decode attention that reads K/V straight from the paged cache. It is
built with torch's C++ extension builder (g++ and ninja) into `MODELYARD_KERNEL_DIR` (default
`~/.cache/modelyard/kernels`), under a name that hashes the source, the torch version and the
CPU flags, so a changed source or another machine builds afresh and a cached build loads in
milliseconds. `scripts/setup` builds it ahead (`python -m modelyard.runner.kernels`), so no
engine start pays the ~1 min compile. Where the build fails (no compiler) or
`MODELYARD_NATIVE_KERNELS=0`, `load()` returns False and the runner keeps its pure-torch path,
which computes the same thing.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import platform
import shutil
from pathlib import Path

import torch

log = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("csrc") / "paged_decode.cpp"
_FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=fast"]


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def _build_name() -> str:
    digest = hashlib.sha256()
    for part in (_SOURCE.read_text(), torch.__version__, " ".join(_FLAGS), _cpu_flags()):
        digest.update(part.encode())
    return f"modelyard_kernels_{digest.hexdigest()[:12]}"


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
    if os.environ.get("MODELYARD_NATIVE_KERNELS", "1") == "0":
        return False
    from torch.utils import cpp_extension

    name = _build_name()
    _ninja_on_path()
    try:
        cpp_extension.load(
            name=name,
            sources=[str(_SOURCE)],
            extra_cflags=_FLAGS,
            extra_ldflags=["-fopenmp"],
            build_directory=str(_build_dir(name)),
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
) -> torch.Tensor:
    """q (D, nh, hd) float32; caches (nkv, NB, bs, hd); block_tables (D, nb_max) long;
    seq_lens (D,) long keys per request -> (D, nh, hd). Call only after `load()` is True."""
    out: torch.Tensor = torch.ops.modelyard_kernels.paged_decode_attention(
        q, k_cache, v_cache, block_tables, seq_lens, scale, window or 0
    )
    return out


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO)
    print("modelyard kernels:", "ready" if load() else "unavailable (torch path in use)")
