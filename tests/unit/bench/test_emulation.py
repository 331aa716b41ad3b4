"""benchmarks/emulation.py: a lower host kind played on a higher host, every system alike."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from modelyard.runner.kernel_config import KINDS, host_kind

pytestmark = pytest.mark.unit

BENCH = Path(__file__).parents[3] / "benchmarks"
sys.path.insert(0, str(BENCH))
import emulation  # noqa: E402

PROBE = (
    "import json, torch.cpu as c; print(json.dumps([c._is_amx_tile_supported(), "
    "c._is_avx512_supported(), c._is_avx512_bf16_supported()]))"
)


def torch_cpu_reports(kind: str | None) -> list[bool]:
    """What torch.cpu says in a peer's python started the way the benchmarks start it."""
    env = {k: v for k, v in os.environ.items() if k != emulation.VARIABLE}
    if kind:
        env |= {emulation.VARIABLE: kind, "PYTHONPATH": str(emulation.SITE)}
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    reports: list[bool] = json.loads(out.stdout)
    return reports


def test_peers_see_the_played_kind() -> None:
    own = torch_cpu_reports(None)
    assert torch_cpu_reports("avx512-bf16") == [False, own[1], own[2]]
    assert torch_cpu_reports("avx2") == [False, False, False]


def test_results_and_json_name_the_played_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(emulation.VARIABLE, raising=False)
    assert emulation.results_subdir() == ""
    assert emulation.describe() is None
    assert emulation.peer_extra() == {}
    monkeypatch.setenv(emulation.VARIABLE, "avx2")
    assert emulation.results_subdir() == f"avx2/emulated-on-{host_kind()}"
    described = emulation.describe()
    assert described is not None
    assert described["caps"] == {
        "ONEDNN_MAX_CPU_ISA": "AVX2",
        "ATEN_CPU_CAPABILITY": "avx2",
        "MKL_ENABLE_INSTRUCTIONS": "AVX2",
        "MODELYARD_ISA": "avx2",
    }
    assert emulation.peer_extra() == {"PYTHONPATH": str(emulation.SITE)}


def test_refuses_a_kind_not_below_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(emulation.VARIABLE, raising=False)
    with pytest.raises(SystemExit, match="not 'amx'"):
        emulation.emulate("amx")
    not_below = [k for k in emulation.CAPS if KINDS.index(k) <= KINDS.index(host_kind())]  # type: ignore[arg-type]
    for kind in not_below:
        with pytest.raises(SystemExit, match="not above it"):
            emulation.emulate(kind)


@pytest.mark.parametrize(
    ("kind", "want"),
    [
        (None, {"float32": 100.0, "bfloat16": 400.0}),  # this host's own: bf16 measured
        ("avx512-bf16", {"float32": 100.0, "bfloat16": 100.0}),  # the higher of the two
        ("avx2", {"float32": 100.0, "bfloat16": 100.0}),  # torch's bf16 scalar: float32's
    ],
)
def test_ceiling_rate_per_played_kind(
    monkeypatch: pytest.MonkeyPatch, kind: str | None, want: dict[str, float]
) -> None:
    import common

    rates = {"float32": 100.0, "bfloat16": 400.0 if kind is None else 50.0}
    asked: list[str] = []

    def fake_rate(dtype_name: str) -> float:
        asked.append(dtype_name)
        return rates[dtype_name]

    monkeypatch.setattr(common, "matmul_gflops", fake_rate)
    monkeypatch.setattr(common, "host_kind", lambda: "amx")
    if kind is None:
        monkeypatch.delenv(emulation.VARIABLE, raising=False)
    else:
        monkeypatch.setenv(emulation.VARIABLE, kind)
    assert {d: common.ceiling_gflops(d) for d in want} == want
    if kind == "avx2":
        assert "bfloat16" not in asked  # minutes of scalar matmul, never measured
