"""One `modelyard serve` process for the manager's e2e tests (session scope)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from manager_server import start_server


@pytest.fixture(scope="session")
def server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root: Path = tmp_path_factory.mktemp("manager-e2e")
    process, url = start_server(root)
    try:
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except Exception:
            process.kill()
            process.wait(timeout=5)
