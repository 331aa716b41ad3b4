"""`--emulate KIND`: a lower host kind played on a higher host, every system capped alike.

A benchmark run with `--emulate avx512-bf16` (or `avx2`) re-executes itself with
- modelyard's kernels built and dispatched for that kind (`MODELYARD_ISA`),
- torch's, oneDNN's and MKL's own code capped to it (`ATEN_CPU_CAPABILITY`,
  `ONEDNN_MAX_CPU_ISA`, `MKL_ENABLE_INSTRUCTIONS`): the matmul ceiling, the prompt GEMMs and
  vLLM's linear layers,
- vLLM told what such a CPU reports (benchmarks/emulate/sitecustomize.py: `torch.cpu` says no
  AMX, and for `avx2` no AVX-512, so vLLM picks its kernels for that kind),
- llama.cpp from a build for that kind (`--llamacpp-python` names it; the native build of an
  AMX host uses AVX-512 BF16 for a bf16 GGUF, as a Zen 4 build does).
What it cannot change is the host itself: its clock, caches and memory bandwidth stay those of
the machine it runs on, so an emulated result stands beside, not for, a run on such a host.
Results go to benchmarks/results/<kind>/emulated-on-<host kind>/.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from modelyard.runner.kernel_config import KINDS, LIBRARY_CAPS, host_kind

# torch's own libraries capped to the kind (runner.kernel_config: also what test_isa_paths sets)
CAPS = LIBRARY_CAPS
VARIABLE = "BENCH_EMULATE"  # the kind played, read by benchmarks/emulate/sitecustomize.py
SITE = Path(__file__).parent / "emulate"


def emulated_kind() -> str | None:
    """The kind this run plays, or None for the host's own."""
    return os.environ.get(VARIABLE) or None


def emulate(kind: str | None) -> None:
    """Re-execute this script with every system capped to `kind` (a no-op once it is)."""
    if not kind or emulated_kind() == kind:
        return
    if kind not in CAPS:
        raise SystemExit(f"--emulate takes one of {', '.join(CAPS)}, not {kind!r}")
    if KINDS.index(kind) <= KINDS.index(host_kind()):  # type: ignore[arg-type]
        raise SystemExit(f"--emulate {kind}: this host is {host_kind()}, not above it")
    env = {**os.environ, **CAPS[kind], "MODELYARD_ISA": kind, VARIABLE: kind}
    os.execve(sys.executable, [sys.executable, *sys.argv], env)


def peer_extra() -> dict[str, str]:
    """What a peer's environment adds under emulation: the site hook that caps torch.cpu."""
    return {"PYTHONPATH": str(SITE)} if emulated_kind() else {}


def results_subdir() -> str:
    """'' on the host's own kind, '<kind>/emulated-on-<host kind>' when emulating."""
    kind = emulated_kind()
    return f"{kind}/emulated-on-{host_kind()}" if kind else ""


def describe() -> dict[str, object] | None:
    """What a result JSON records of the emulation (None when there is none)."""
    kind = emulated_kind()
    if not kind:
        return None
    return {
        "kind": kind,
        "on_host_kind": host_kind(),
        "caps": {**CAPS[kind], "MODELYARD_ISA": kind},
        "peers": "torch.cpu reports the kind's features (benchmarks/emulate/sitecustomize.py)",
        "caveat": "clock, caches and memory bandwidth are the host's, not the kind's",
    }


def add_argument(parser: argparse.ArgumentParser) -> None:
    """The `--emulate` option of a benchmark script."""
    parser.add_argument(
        "--emulate",
        choices=sorted(CAPS),
        help="play this lower host kind: every system capped alike (benchmarks/emulation.py)",
    )
