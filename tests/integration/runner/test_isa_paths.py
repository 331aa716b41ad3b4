"""The kernels' lower instruction-set paths on this host: MODELYARD_ISA forces the kernels an
AVX-512 BF16 host and an AVX2-only host would build, and oneDNN, ATen and MKL are capped to
match (kernel_config.LIBRARY_CAPS), so an AMX host runs the kernel tests and the real
model's acceptance checks on each of those paths. A kind this host lacks is skipped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from modelyard.runner.kernel_config import KINDS, LIBRARY_CAPS, host_kind

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
KERNEL_TESTS = [
    "tests/unit/runner/test_linear.py",
    "tests/unit/runner/test_fused_ops.py",
    "tests/unit/runner/test_decode_loop.py",
    "tests/unit/runner/test_attention.py",
    "tests/unit/runner/test_int8.py",
    "tests/unit/runner/test_bf16_widen.py",
    "tests/unit/runner/test_gguf_weights.py",
    "tests/unit/runner/test_sampler.py",
]
ACCEPTANCE = "tests/integration/engine/test_acceptance_smollm2.py"
# the real model's acceptance on each path: float32 token for token where float32 has its own
# kernels (AVX2), the bf16 smoke where the bf16 GEMM and attention are the kind's own (AVX2: bf16
# weights widened to float32; AVX-512 BF16: vdpbf16ps)
TESTS = {
    "avx2": [
        *KERNEL_TESTS,
        f"{ACCEPTANCE}::test_batch_of_32_mixed_lengths",
        f"{ACCEPTANCE}::test_bfloat16_batch_smoke",
    ],
    "avx512-bf16": [*KERNEL_TESTS, f"{ACCEPTANCE}::test_bfloat16_batch_smoke"],
}
PROBE = (
    "import json, torch; from modelyard.runner import kernels; "
    "from modelyard.engine.config import kernels_from_environment; "
    "config = kernels_from_environment(); "
    "print(json.dumps({'isa': config.isa, 'loaded': kernels.load(config), "
    "'amx': kernels.amx_ready(), 'bf16_gemm': kernels.bf16_gemm_path(config.bf16_gemm), "
    "'capability': torch.backends.cpu.get_cpu_capability()}))"
)


def run_pytest(
    tests: list[str], env: dict[str, str], *, timeout: int
) -> subprocess.CompletedProcess[str]:
    """pytest on `tests` in a child with `env` (stopping at the first failure)."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def forced_env(kind: str) -> dict[str, str]:
    return {**os.environ, "MODELYARD_ISA": kind, **LIBRARY_CAPS[kind]}


@pytest.mark.timeout(2400)  # a kernel build for the forced kind where setup has not made it
@pytest.mark.parametrize("kind", sorted(LIBRARY_CAPS))
def test_kernels_pass_their_tests_on_a_forced_lower_path(kind: str) -> None:
    if KINDS.index(host_kind()) >= KINDS.index(kind):  # type: ignore[arg-type]
        pytest.skip(f"this host's own kind is {host_kind()}: nothing lower to force")
    env = forced_env(kind)
    probe = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=900
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    state = json.loads(probe.stdout.strip().splitlines()[-1])
    assert state["isa"] == kind
    assert state["loaded"]
    assert not state["amx"]  # compiled out below the amx kind
    if kind == "avx2":
        assert state["capability"] == "AVX2"
        assert state["bf16_gemm"] is None
    else:  # oneDNN without AMX sums in the AVX-512 BF16 kernel's order: it must run
        assert state["bf16_gemm"] == "avx512"
    tests = run_pytest(TESTS[kind], env, timeout=2300)
    assert tests.returncode == 0, tests.stdout[-4000:]


@pytest.mark.timeout(1200)  # a kernel build for the bare architecture where none is cached
def test_the_bare_architecture_build_passes_the_gemm_tests() -> None:
    """MODELYARD_ISA=generic (no AVX2) builds every kernel from its portable branches; the
    weight-only GEMMs (int8, GGUF blocks, bf16 widened), whose loops differ most per kind, pass
    their tests on that build. The libraries keep their own dispatch: the tests compare with
    tolerances, not bits, where a library is the reference."""
    env = {**os.environ, "MODELYARD_ISA": "generic"}
    probe = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=900
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    state = json.loads(probe.stdout.strip().splitlines()[-1])
    assert (state["isa"], state["loaded"], state["amx"]) == ("generic", True, False)
    tests = [
        "tests/unit/runner/test_int8.py",
        "tests/unit/runner/test_gguf_weights.py",
        "tests/unit/runner/test_bf16_widen.py",
    ]
    run = run_pytest(tests, env, timeout=1100)
    assert run.returncode == 0, run.stdout[-4000:]
    assert " passed" in run.stdout


@pytest.mark.timeout(900)
def test_amx_host_also_passes_with_the_plain_kv_layout() -> None:
    """On AMX hosts a bf16 KV cache takes the tile layout by default (runner.kv_layout);
    MODELYARD_KV_TILES=0 keeps the plain one, which AVX-512 BF16 hosts run: the attention tests
    and the real model's bf16 acceptance pass with it here too."""
    if host_kind() != "amx":
        pytest.skip(f"this host's kind is {host_kind()}: its caches are plain anyway")
    env = {**os.environ, "MODELYARD_KV_TILES": "0"}
    tests = [
        "tests/unit/runner/test_attention.py",
        f"{ACCEPTANCE}::test_bfloat16_batch_smoke",
        "tests/integration/runner/test_smollm2.py",
    ]
    run = run_pytest(tests, env, timeout=850)
    assert run.returncode == 0, run.stdout[-4000:]
    assert " passed" in run.stdout
