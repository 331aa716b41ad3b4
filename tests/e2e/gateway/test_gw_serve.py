"""The gateway inside the real `modelyard serve` (config file `gateway:` section, no model loaded):
auth and envelopes, allow-lists, shared Redis rpm limit, admin usage, the exposure check."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from gw_redis import RedisServer, free_port
from gw_servers import wait_healthy

from modelyard.gateway.keys import SqliteKeyStore, new_record

pytestmark = pytest.mark.e2e


class Serve:
    def __init__(self, url: str, keys: dict[str, str]) -> None:
        self.url, self.keys = url, keys

    def headers(self, name: str) -> dict[str, str]:
        return {"authorization": f"Bearer {self.keys[name]}"}


@pytest.fixture(scope="module")
def serve(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    tmp = tmp_path_factory.mktemp("gw_serve")
    store = SqliteKeyStore(tmp / "keys.db")
    keys = {}
    for name, tenant, admin in (
        ("acme", "acme", False),
        ("admin", "ops", True),
        ("free", "free", False),
    ):
        key, record = new_record(tenant, admin=admin)
        store.add(record)
        keys[name] = key
    gateway = {
        "redis_url": redis_server.url,
        "keys": {"sqlite_path": str(tmp / "keys.db"), "cache_ttl_s": 0},
        "tenants": {"acme": {"models": ["chat"], "rpm": 3}},
        "rate_limit": {"store": "redis"},
    }
    config = tmp / "modelyard.yaml"
    config.write_text(yaml.safe_dump({"gateway": gateway}))
    port = free_port()
    command = [sys.executable, "-m", "modelyard.cli", "serve", "--config", str(config)]
    command += ["--no-preload", "--port", str(port), "--log-level", "warning"]
    process = subprocess.Popen(command, cwd=tmp, stdout=subprocess.DEVNULL)
    try:
        wait_healthy(process, f"http://127.0.0.1:{port}")
        yield Serve(f"http://127.0.0.1:{port}", keys)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def test_serve_enforces_gateway(serve: Serve) -> None:
    chat = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    url = f"{serve.url}/v1/chat/completions"
    assert httpx.get(f"{serve.url}/health").status_code == 200
    missing = httpx.post(url, json=chat)
    assert missing.status_code == 401
    assert missing.json()["error"]["type"] == "authentication_error"
    kserve = httpx.post(f"{serve.url}/v2/models/chat/infer", json={"inputs": []})
    assert kserve.status_code == 401
    assert isinstance(kserve.json()["error"], str)
    denied = httpx.post(url, json={**chat, "model": "other"}, headers=serve.headers("acme"))
    assert denied.status_code == 403
    # allowed by the gateway; the catalog has no "chat", so the server answers (404), and the
    # request counts against the tenant's rpm of 3
    passed = [httpx.post(url, json=chat, headers=serve.headers("acme")) for _ in range(3)]
    assert all(r.status_code not in (401, 403, 429) for r in passed)
    assert [r.headers["x-ratelimit-remaining"] for r in passed] == ["2", "1", "0"]
    limited = httpx.post(url, json=chat, headers=serve.headers("acme"))
    assert limited.status_code == 429
    assert int(limited.headers["retry-after"]) >= 1
    usage = httpx.get(f"{serve.url}/admin/usage", headers=serve.headers("admin"))
    assert usage.status_code == 200
    acme = usage.json()["tenants"]["acme"]
    assert acme["requests"] == 3
    assert acme["rejections"] == {"model": 1, "rpm": 1}
    assert httpx.get(f"{serve.url}/admin/usage", headers=serve.headers("free")).status_code == 403


def test_serve_refuses_public_bind_without_auth(tmp_path: Path) -> None:
    config = tmp_path / "open.yaml"
    config.write_text(
        yaml.safe_dump({"gateway": {"keys": {"sqlite_path": str(tmp_path / "k.db")}}})
    )
    command = [sys.executable, "-m", "modelyard.cli", "serve", "--config", str(config)]
    command += ["--host", "0.0.0.0", "--port", str(free_port()), "--no-preload"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2
    assert "without authentication" in result.stderr
