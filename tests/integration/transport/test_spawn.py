"""transport.spawn: a worker started in a fresh interpreter gets its own environment; the API
process's environment stays as it was."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from modelyard.transport.spawn import start_process

pytestmark = pytest.mark.integration


def write_environment(path: Path, names: list[str]) -> None:
    """The child: write the named variables, exit with status 3."""
    path.write_text("\n".join(f"{n}={os.environ.get(n)}" for n in names))
    sys.exit(3)


async def test_environment_reaches_the_child_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPAWN_TEST_USER", "user")
    out = tmp_path / "env.txt"
    env = {"SPAWN_TEST_CHILD": "child", "SPAWN_TEST_USER": "ignored"}
    process = await start_process(
        write_environment, (out, ["SPAWN_TEST_CHILD", "SPAWN_TEST_USER"]), env=env
    )
    await asyncio.to_thread(process.join, 60)
    assert process.exitcode == 3
    assert not process.is_alive()
    # the child got the variable; a value the user set wins; the parent is untouched
    assert out.read_text().splitlines() == ["SPAWN_TEST_CHILD=child", "SPAWN_TEST_USER=user"]
    assert "SPAWN_TEST_CHILD" not in os.environ


async def test_path_folders_go_in_front_of_the_childs_path(tmp_path: Path) -> None:
    """`path=` (ninja's folder for the engine worker's first-use kernel build) is put before
    the PATH the child inherits; the parent's PATH stays as it was."""
    out = tmp_path / "env.txt"
    before = os.environ["PATH"]
    process = await start_process(write_environment, (out, ["PATH"]), path=[str(tmp_path)])
    await asyncio.to_thread(process.join, 60)
    assert process.exitcode == 3
    assert out.read_text() == f"PATH={tmp_path}{os.pathsep}{before}"
    assert os.environ["PATH"] == before
