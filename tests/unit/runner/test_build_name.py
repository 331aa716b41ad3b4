"""The kernel build's folder name: the same sources in another checkout build into a folder of
their own (torch's build files name the sources by path, so a shared folder would make two
checkouts rebuild each other's kernels), and the same checkout keeps its name."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from modelyard.runner import kernel_build

pytestmark = pytest.mark.unit


def _copy_sources(root: Path) -> tuple[tuple[Path, ...], tuple[Path, ...]]:
    csrc = root / "csrc"
    csrc.mkdir(parents=True)
    for f in (*kernel_build.SOURCES, *kernel_build.HEADERS):
        shutil.copy(f, csrc / f.name)
    return tuple(sorted(csrc.glob("*.cpp"))), tuple(sorted(csrc.glob("*.h")))


def test_another_checkout_gets_its_own_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    here = kernel_build.built_name("avx2")
    assert kernel_build.built_name("avx2") == here  # stable for one checkout
    sources, headers = _copy_sources(tmp_path / "other")
    monkeypatch.setattr(kernel_build, "SOURCES", sources)
    monkeypatch.setattr(kernel_build, "HEADERS", headers)
    other = kernel_build.built_name("avx2")
    assert other != here
    assert other.rsplit("_", 1)[0] == here.rsplit("_", 1)[0]  # same kind prefix
