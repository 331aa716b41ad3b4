"""Choosing the kernels' library: the best prebuilt kind this CPU runs, never one above it, a
lower one when a library fails; no library at all is an error, logged, and kind "none". (No
compiler here: `torch.ops.load_library` is replaced by a recorder.)"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from modelyard.runner import kernel_build
from modelyard.runner.kernel_build import KernelsUnavailable, load_kernels, load_prebuilt
from modelyard.runner.kernel_config import KINDS, KernelConfig, KernelState

pytestmark = pytest.mark.unit


@pytest.fixture
def loaded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The library files `torch.ops.load_library` was asked for; a file holding "bad" fails."""
    calls: list[str] = []

    def load_library(path: str) -> None:
        calls.append(Path(path).name)
        if Path(path).read_text() == "bad":
            raise OSError(f"{path}: invalid ELF header")

    monkeypatch.setattr(kernel_build.torch.ops, "load_library", load_library)
    return calls


def _folder(tmp_path: Path, **kinds: str) -> Path:
    for kind, text in kinds.items():
        kind = kind.replace("_", "-")
        (tmp_path / f"{kernel_build.prebuilt_name(kind)}.so").write_text(text)
    return tmp_path


def test_names_differ_by_kind_and_ignore_this_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    names = {kind: kernel_build.prebuilt_name(kind) for kind in KINDS}
    assert len(set(names.values())) == len(KINDS)
    for kind, name in names.items():
        assert name.startswith(f"modelyard_kernels_{kind}_")
        assert "-march=native" not in kernel_build.kind_flags(kind, portable=True)
    monkeypatch.setattr(kernel_build, "cpu_flags", lambda: frozenset({"avx2", "fma"}))
    assert {kind: kernel_build.prebuilt_name(kind) for kind in KINDS} == names


def test_the_best_kind_at_or_below_the_cpus_is_loaded(tmp_path: Path, loaded: list[str]) -> None:
    folder = _folder(tmp_path, amx="", avx512_bf16="", avx2="")
    assert load_prebuilt(folder, "avx512-bf16") == "avx512-bf16"
    assert loaded == [f"{kernel_build.prebuilt_name('avx512-bf16')}.so"]  # amx never opened
    assert load_prebuilt(folder, "avx512") == "avx2"  # no avx512 library: the next one down


def test_a_library_that_fails_gives_way_to_the_next(tmp_path: Path, loaded: list[str]) -> None:
    folder = _folder(tmp_path, avx2="bad", generic="")
    assert load_prebuilt(folder, "avx2") == "generic"
    assert len(loaded) == 2


def test_no_library_is_an_error_naming_the_folder(tmp_path: Path, loaded: list[str]) -> None:
    stale = tmp_path / "modelyard_kernels_avx2_000000000000.so"  # other sources' build
    stale.write_text("")
    with pytest.raises(KernelsUnavailable, match=str(tmp_path)) as info:
        load_prebuilt(tmp_path, "avx2")
    assert stale.name in str(info.value)
    assert loaded == []


def test_load_kernels_reports_and_logs(
    tmp_path: Path, loaded: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    config = KernelConfig(isa="avx2", host="avx2", prebuilt_dir=str(tmp_path))
    with caplog.at_level(logging.INFO, logger="modelyard.runner.kernel_build"):
        missing = load_kernels(config)
    assert (missing.kind, missing.source) == ("none", "prebuilt")
    assert str(tmp_path) in str(missing.error)
    assert [r.levelname for r in caplog.records] == ["ERROR"]
    _folder(tmp_path, avx2="")
    assert load_kernels(config) == KernelState(kind="avx2", source="prebuilt")
    off = load_kernels(dataclasses.replace(config, native_kernels=False))
    assert off == KernelState(kind="none", source="off")


def test_the_settings_come_from_the_environment() -> None:
    config = KernelConfig.from_env(
        {"MODELYARD_PREBUILT_KERNELS": "/opt/k", "MODELYARD_KERNEL_DIR": "/tmp/k"}
    )
    assert (config.prebuilt_dir, config.kernel_dir) == ("/opt/k", "/tmp/k")
    assert KernelConfig.from_env({}).prebuilt_dir == ""
