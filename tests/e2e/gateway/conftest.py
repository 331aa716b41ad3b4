"""E2E gateway fixtures: the real redis-server fixtures of tests/integration/gateway, and
`GatewayServers`: uvicorn processes serving the gateway test app (gw_helpers.app_from_env)
with one YAML config: shared Redis limits, a SQLite key file, a JWKS file made here."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[3]
UNIT_DIR = ROOT / "tests" / "unit" / "gateway"
sys.path.insert(0, str(UNIT_DIR))
sys.path.insert(0, str(ROOT / "tests" / "integration" / "gateway"))

from gw_helpers import AUDIENCE, ISSUER, RsaSigner, write_jwks  # noqa: E402
from gw_redis import RedisServer, free_port, start_redis  # noqa: E402


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = start_redis()
    yield server
    server.stop()


@dataclass
class GatewayServers:
    urls: list[str]  # base URLs of the server processes
    db: Path  # the SQLite key file
    config_path: Path  # the YAML config (gateway: section)
    signer: RsaSigner  # signs JWTs the servers accept (kid in the JWKS)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        """`modelyard keys --db DB ARGS...` in a subprocess."""
        command = [sys.executable, "-m", "modelyard.cli", "keys", "--db", str(self.db), *args]
        return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def gateway_yaml(redis_url: str, db: Path, jwks: Path) -> dict[str, object]:
    return {
        "gateway": {
            "redis_url": redis_url,
            "keys": {"sqlite_path": str(db), "cache_ttl_s": 0},
            "jwt": {"jwks_file": str(jwks), "audience": AUDIENCE, "issuer": ISSUER},
            "tenants": {"acme": {"models": ["chat"], "priority": 2}, "jwt-only": {}},
            "rate_limit": {"store": "redis", "on_store_error": "closed"},
            "routes": {"models": {"chat": {"target": "chat-v1", "aliases": ["gpt-4o-mini"]}}},
        }
    }


def _start(config_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "GW_TEST_CONFIG": str(config_path), "PYTHONPATH": str(UNIT_DIR)}
    command = [sys.executable, "-m", "uvicorn", "--factory", "gw_helpers:app_from_env"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    process = subprocess.Popen(command, env=env, cwd=str(UNIT_DIR))
    return process, f"http://127.0.0.1:{port}"


def _wait_healthy(process: subprocess.Popen[bytes], url: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"gateway test server exited with {process.returncode}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError("gateway test server did not become healthy")


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
    started = [_start(config_path) for _ in range(2)]
    try:
        for process, url in started:
            _wait_healthy(process, url)
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
