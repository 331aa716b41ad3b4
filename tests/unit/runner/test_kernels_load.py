"""`kernels.load(config)`: the runner's config loads the process's one library; later configs
may differ in the callers' own switches, not in what chose the library."""

from __future__ import annotations

import dataclasses

import pytest

from modelyard.runner import kernels
from modelyard.runner.kernel_config import KernelConfig, KernelState

pytestmark = pytest.mark.unit


def test_one_library_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    loads: list[KernelConfig] = []

    def fake_load(config: KernelConfig) -> KernelState:
        loads.append(config)
        return KernelState(kind=config.isa, source="built")

    monkeypatch.setattr(kernels, "_STATE", [])
    monkeypatch.setattr(kernels, "load_kernels", fake_load)
    config = KernelConfig(isa="avx2", host="avx2")
    assert not kernels.loaded()
    assert kernels.load(config)
    assert kernels.loaded()
    assert kernels.load(dataclasses.replace(config, weights="int8", prefill_sdpa=True))
    assert loads == [config]  # loaded once
    for other in ({"isa": "generic"}, {"native_kernels": False}, {"kernel_dir": "/elsewhere"}):
        with pytest.raises(ValueError, match="another kernel configuration"):
            kernels.load(dataclasses.replace(config, **other))  # type: ignore[arg-type]


def test_switched_off_is_not_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "_STATE", [])
    off = KernelConfig(isa="avx2", host="avx2", native_kernels=False)
    assert kernels.state(off) == KernelState(kind="none", source="off")
    assert not kernels.load(off)
    assert not kernels.loaded()
