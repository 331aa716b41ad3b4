"""Helpers of the e2e gateway tests: `GatewayServers` (uvicorn processes serving the gateway
test app, gw_helpers.app_from_env) and their YAML config, process start and health wait."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from gw_helpers import AUDIENCE, ISSUER, RsaSigner
from gw_redis import free_port

UNIT_DIR = Path(__file__).resolve().parents[2] / "unit" / "gateway"
TESTS_DIR = Path(__file__).resolve().parents[2]


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


def start_server(config_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    dirs = (str(UNIT_DIR), str(TESTS_DIR), os.environ.get("PYTHONPATH"))  # TESTS_DIR: fakes
    path = os.pathsep.join(p for p in dirs if p)
    env = {**os.environ, "GW_TEST_CONFIG": str(config_path), "PYTHONPATH": path}
    command = [sys.executable, "-m", "uvicorn", "--factory", "gw_helpers:app_from_env"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    process = subprocess.Popen(command, env=env, cwd=str(UNIT_DIR))
    return process, f"http://127.0.0.1:{port}"


def wait_healthy(process: subprocess.Popen[bytes], url: str) -> None:
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
