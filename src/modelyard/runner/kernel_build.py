"""Where the runner's kernels come from: built on this host, or prebuilt for every kind.

`load_kernels(config)` loads them once per process and says which kind it loaded:
- `config.prebuilt_dir` set (MODELYARD_PREBUILT_KERNELS; the image): the folder holds one
  library per instruction-set kind, compiled ahead by `prebuild` with `PORTABLE_FLAGS` (no
  `-march=native`: the build machine's CPU does not matter). The best kind that this CPU runs,
  capped by MODELYARD_ISA, is loaded read-only: no compiler, no lock, nothing written, so a
  non-root user loads a folder that root built. A library is named by its kind and a hash of the
  sources and torch's version: a folder built from other sources loads nothing.
- unset: torch's extension builder (g++, ninja) compiles csrc/ for the selected kind
  (`BUILD_FLAGS`) into `config.kernel_dir` under a name hashing the sources, their folder, torch,
  the flags and the CPU's flags, one builder at a time (runner.build_lock); `scripts/setup`
  builds ahead. torch runs `ninja` from PATH: the process that starts a builder puts it there
  (modelyard.build_tools: the kernels command, the engine worker's spawner, the `LLM`).
When nothing loads, the reason is logged at error level and the kind is "none": the pure-torch
path computes the same, slower. `MODELYARD_NATIVE_KERNELS=0` switches them off (not an error).
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import torch

from modelyard.runner.build_lock import exclusive_build
from modelyard.runner.kernel_config import (
    BUILD_FLAGS,
    KINDS,
    PORTABLE_FLAGS,
    HostKind,
    KernelConfig,
    KernelState,
    cpu_flags,
)

log = logging.getLogger(__name__)

_CSRC = Path(__file__).with_name("csrc")
SOURCES = tuple(sorted(_CSRC.glob("*.cpp")))  # bindings.cpp registers every op (ops.h)
HEADERS = tuple(sorted(_CSRC.glob("*.h")))
_LDFLAGS = ["-fopenmp"]


class KernelsUnavailable(RuntimeError):
    """No library of the runner's kernels could be loaded."""


def kind_flags(kind: HostKind, *, portable: bool = False) -> list[str]:
    """Compiler flags for `kind`: this host's (`BUILD_FLAGS`) or any CPU's (`PORTABLE_FLAGS`)."""
    arch = PORTABLE_FLAGS[kind] if portable else BUILD_FLAGS[kind]
    return ["-O3", *arch, "-fopenmp", "-ffp-contract=fast"]


def _digest(*parts: str) -> str:
    digest = hashlib.sha256()
    for part in (*(f.read_text() for f in (*SOURCES, *HEADERS)), *parts):
        digest.update(part.encode())
    return digest.hexdigest()[:12]


def built_name(isa: HostKind) -> str:
    """This host's build of `isa`. The sources' folder counts: torch's build files name sources
    by path (one build per checkout)."""
    folder = str(SOURCES[0].parent.resolve())
    flags = " ".join(kind_flags(isa))
    return f"modelyard_kernels_{isa}_{_digest(folder, torch.__version__, flags, _cpu())}"


def _cpu() -> str:
    return " ".join(sorted(cpu_flags()))


def prebuilt_name(kind: HostKind) -> str:
    """The library file's stem for `kind` in a prebuilt folder (sources, torch and flags)."""
    flags = " ".join(kind_flags(kind, portable=True))
    return f"modelyard_kernels_{kind}_{_digest(torch.__version__, flags)}"


def load_kernels(config: KernelConfig) -> KernelState:
    """Load the kernels as `config` says (module docstring); never raises."""
    if not config.native_kernels:
        return KernelState(kind="none", source="off")
    source: Literal["prebuilt", "built"] = "prebuilt" if config.prebuilt_dir else "built"
    try:
        if config.prebuilt_dir:
            kind = load_prebuilt(Path(config.prebuilt_dir), config.isa)
        else:
            load_built(config)
            kind = config.isa
    except Exception as exc:  # a missing compiler, folder or library: torch path, loudly
        error = f"{type(exc).__name__}: {exc}"
        log.error("native kernels unavailable, the slower torch path is in use: %s", error)
        return KernelState(kind="none", source=source, error=error)
    log.info("native kernels loaded: %s (%s)", kind, source)
    return KernelState(kind=kind, source=source)


def load_prebuilt(folder: Path, ceiling: HostKind) -> HostKind:
    """Load the best kind at or below `ceiling` that `folder` holds; KernelsUnavailable if none."""
    tried = []
    for kind in KINDS[KINDS.index(ceiling) :]:
        path = folder / f"{prebuilt_name(kind)}.so"
        if not path.is_file():
            continue
        try:
            torch.ops.load_library(str(path))  # type: ignore[no-untyped-call]
        except (OSError, RuntimeError) as exc:
            tried.append(f"{path.name}: {exc}")
            continue
        if kind != ceiling:
            log.warning("no prebuilt %s kernels in %s: loaded the %s ones", ceiling, folder, kind)
        return kind
    held = sorted(p.name for p in folder.glob("*.so")) if folder.is_dir() else "no such folder"
    raise KernelsUnavailable(
        f"no prebuilt kernels for {ceiling} or below, these sources and torch "
        f"{torch.__version__} loaded from {folder} (holds: {held}; failed: {tried or 'none'})"
    )


def load_built(config: KernelConfig) -> None:
    """Build (first time) this host's kernels for `config.isa` and load them."""
    from torch.utils import cpp_extension

    name = built_name(config.isa)
    build_dir = Path(config.kernel_dir or Path.home() / ".cache/modelyard/kernels") / name
    build_dir.mkdir(parents=True, exist_ok=True)
    with exclusive_build(build_dir):
        cpp_extension.load(
            name=name,
            sources=[str(f) for f in SOURCES],
            extra_cflags=kind_flags(config.isa),
            extra_ldflags=_LDFLAGS,
            build_directory=str(build_dir),
            is_python_module=False,
            verbose=False,
        )


def prebuild(folder: Path, kinds: Iterable[HostKind] = KINDS) -> list[Path]:
    """Compile one library per kind into `folder` (readable by every user), loading none."""
    folder.mkdir(parents=True, exist_ok=True)
    built = []
    for kind in kinds:
        name = prebuilt_name(kind)
        target = folder / f"{name}.so"
        with tempfile.TemporaryDirectory(prefix=f"{name}-") as scratch:
            log.info("building the %s kernels", kind)
            _compile(name, kind_flags(kind, portable=True), Path(scratch))
            shutil.copyfile(Path(scratch) / f"{name}.so", target)
        target.chmod(0o644)
        built.append(target)
    return built


def _compile(name: str, cflags: list[str], build_dir: Path) -> None:
    """Compile and link csrc/ into build_dir/<name>.so without loading it: a kind above this
    CPU's must not be loaded here (its initialisers may use instructions the CPU lacks), and
    torch's public `load` always loads, so this calls the build step `load` is made of."""
    from torch.utils import cpp_extension

    cpp_extension._write_ninja_file_and_build_library(
        name=name,
        sources=[str(f) for f in SOURCES],
        extra_cflags=cflags,
        extra_cuda_cflags=[],
        extra_sycl_cflags=[],
        extra_ldflags=_LDFLAGS,
        extra_include_paths=[],
        build_directory=str(build_dir),
        verbose=False,
        with_cuda=False,
        with_sycl=False,
    )
