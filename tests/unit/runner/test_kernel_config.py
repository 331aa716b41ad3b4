"""The runner's kernel switches and host kinds (runner.kernel_config)."""

from __future__ import annotations

import pytest

from modelyard.runner import kernel_config as kc
from modelyard.runner.kernel_config import KernelConfig, host_kind

pytestmark = pytest.mark.unit

SAPPHIRE_RAPIDS = frozenset(
    [
        "fma",
        "avx2",
        "avx512f",
        "avx512bw",
        "avx512vl",
        "avx512_bf16",
        "amx_tile",
        "amx_bf16",
        "amx_int8",
    ]
)
ZEN4 = frozenset(["fma", "avx2", "avx512f", "avx512bw", "avx512vl", "avx512_bf16"])


def test_host_kinds_from_cpu_flags() -> None:
    assert host_kind(SAPPHIRE_RAPIDS) == "amx"
    assert host_kind(ZEN4) == "avx512-bf16"
    assert host_kind(frozenset(["fma", "avx2", "avx512f", "avx512bw", "avx512vl"])) == "avx512"
    assert host_kind(frozenset({"fma", "avx2"})) == "avx2"
    assert host_kind(frozenset({"sse4_2"})) == "generic"


def test_isa_is_capped_never_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kc, "host_kind", lambda: "avx512-bf16")
    assert KernelConfig.from_env({}).isa == "avx512-bf16"
    capped = KernelConfig.from_env({"MODELYARD_ISA": "avx2"})
    assert capped.isa == "avx2"
    assert capped.host == "avx512-bf16"
    assert capped.has("avx2")
    assert not capped.has("avx512")
    assert KernelConfig.from_env({"MODELYARD_ISA": "amx"}).isa == "avx512-bf16"


def test_switches_and_bad_values() -> None:
    config = KernelConfig.from_env(
        {
            "MODELYARD_NATIVE_KERNELS": "0",
            "MODELYARD_DECODE_TEAM": "0",
            "MODELYARD_DECODE_LOOP": "0",
            "MODELYARD_PREFILL_SDPA": "1",
            "MODELYARD_BF16_GEMM": "onednn",
        }
    )
    assert not config.native_kernels
    assert not config.decode_team
    assert not config.decode_loop
    assert KernelConfig.from_env({}).decode_loop
    assert config.prefill_sdpa
    assert config.packed_linear
    assert config.bf16_gemm == "onednn"
    with pytest.raises(ValueError, match="MODELYARD_ISA"):
        KernelConfig.from_env({"MODELYARD_ISA": "sse9"})
    with pytest.raises(ValueError, match="MODELYARD_BF16_GEMM"):
        KernelConfig.from_env({"MODELYARD_BF16_GEMM": "fastest"})
    with pytest.raises(ValueError, match="MODELYARD_PREFILL_SDPA"):
        KernelConfig.from_env({"MODELYARD_PREFILL_SDPA": "yes"})
