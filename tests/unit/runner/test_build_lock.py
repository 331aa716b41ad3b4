"""The kernel build lock: a `lock` file left by a killed torch build no longer hangs a build."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from modelyard.runner.build_lock import exclusive_build

pytestmark = pytest.mark.unit


def test_a_stale_torch_lock_is_removed(tmp_path: Path) -> None:
    build = tmp_path / "modelyard_kernels_x"
    build.mkdir()
    (build / "lock").touch()
    with exclusive_build(build):
        assert not (build / "lock").exists()


def test_the_flock_is_held_inside_and_released_after(tmp_path: Path) -> None:
    build = tmp_path / "modelyard_kernels_y"
    build.mkdir()
    probe = (
        "import fcntl, sys\n"
        "f = open(sys.argv[1], 'a')\n"
        "try:\n    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
        "except OSError:\n    sys.exit(3)\n"
    )
    flock = str(build.with_name(build.name + ".flock"))
    with exclusive_build(build):
        held = subprocess.run([sys.executable, "-c", probe, flock], check=False)
        assert held.returncode == 3
    free = subprocess.run([sys.executable, "-c", probe, flock], check=False)
    assert free.returncode == 0
