"""E2E gateway fixtures: the real redis-server of tests/integration/gateway (gw_redis), and
`gateway_servers`: two uvicorn processes serving the gateway test app with one YAML config:
shared Redis limits, a SQLite key file, a JWKS file made here."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "unit" / "gateway"))
sys.path.insert(0, str(ROOT / "tests" / "integration" / "gateway"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gw_helpers import RsaSigner, write_jwks  # noqa: E402
from gw_redis import RedisServer, start_redis  # noqa: E402
from gw_servers import GatewayServers, gateway_yaml, start_server, wait_healthy  # noqa: E402


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = start_redis()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def gateway_servers(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayServers]:
    """Two server processes sharing one Redis and one key file."""
    tmp = tmp_path_factory.mktemp("gw_e2e")
    signer = RsaSigner("e2e-1")
    jwks = write_jwks(tmp / "jwks.json", signer)
    db = tmp / "keys.db"
    config_path = tmp / "modelyard.yaml"
    config_path.write_text(yaml.safe_dump(gateway_yaml(redis_server.url, db, jwks)))
    started = [start_server(config_path) for _ in range(2)]
    try:
        for process, url in started:
            wait_healthy(process, url)
        yield GatewayServers([url for _, url in started], db, config_path, signer)
    finally:
        for process, _ in started:
            process.terminate()
        for process, _ in started:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
