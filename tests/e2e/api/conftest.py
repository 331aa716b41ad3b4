"""The hardening server (gateway on, fault drills; hardening_server.py), shared by the isolation,
bad-input and fuzzing tests of this folder."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hardening_server import HardeningServer, start, stop


@pytest.fixture(scope="session")
def hardening(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HardeningServer]:
    server = start(tmp_path_factory.mktemp("hardening"))
    try:
        yield server
    finally:
        stop(server)
