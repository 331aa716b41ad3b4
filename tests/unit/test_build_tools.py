"""ninja for torch's extension builder: the config layer puts the `ninja` package's folder on
the PATH of the processes that may build the runner's kernels (modelyard.build_tools), the
engine worker's included (transport.spawn, engine.worker_entry); the runner never writes PATH."""

from __future__ import annotations

import os
import shutil

import pytest

from modelyard.build_tools import ninja_dirs, path_with_ninja
from modelyard.engine import worker_entry
from modelyard.transport.spawn import child_environment

pytestmark = pytest.mark.unit

ninja = pytest.importorskip("ninja")


def test_ninja_folder_added_only_where_ninja_is_not_found() -> None:
    assert ninja_dirs("/nonexistent") == [str(ninja.BIN_DIR)]
    assert ninja_dirs(str(ninja.BIN_DIR)) == []
    path = path_with_ninja({"PATH": "/nonexistent"})
    assert path.split(os.pathsep) == [str(ninja.BIN_DIR), "/nonexistent"]
    assert shutil.which("ninja", path=path)


def test_the_engine_worker_gets_ninja_on_its_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    dirs = worker_entry.worker_path()
    assert dirs == [str(ninja.BIN_DIR)]
    env = child_environment(worker_entry.WORKER_ENVIRONMENT, dirs)
    assert env["PATH"].split(os.pathsep) == [str(ninja.BIN_DIR), "/nonexistent"]
    assert env["OMP_WAIT_POLICY"] == "PASSIVE"
    assert os.environ["PATH"] == "/nonexistent"  # the API process's own PATH is untouched
    assert child_environment({}, [])["PATH"] == "/nonexistent"
