"""Fixtures: a real redis-server on a free loopback port (`--save "" --appendonly no`), killed at
teardown. `redis_server` is shared by the session; `private_redis` is one a test may stop.
tests/e2e/gateway/conftest.py reuses these. The gateway test helpers (gw_helpers) live in
tests/unit/gateway and are put on sys.path here.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "unit" / "gateway"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gw_redis import RedisServer, start_redis


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = start_redis()
    yield server
    server.stop()


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    server = start_redis()
    yield server
    server.stop()
