"""The gateway over real HTTP: two uvicorn processes, one real Redis, keys made by the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from gw_helpers import RsaSigner
from gw_servers import GatewayServers

from modelyard.gateway.keys import SqliteKeyStore, new_record

pytestmark = pytest.mark.e2e

CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


def _cli_create_many(
    servers: GatewayServers, specs: dict[str, list[str]]
) -> dict[str, dict[str, str]]:
    """Run `modelyard keys create --json ...` for each spec in parallel: name -> {key_id, key}."""
    processes = {
        name: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "modelyard.cli",
                "keys",
                "--db",
                str(servers.db),
                "create",
                "--json",
                *args,
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for name, args in specs.items()
    }
    out = {}
    for name, process in processes.items():
        stdout, _ = process.communicate(timeout=60)
        assert process.returncode == 0
        out[name] = json.loads(stdout)
    return out


@pytest.fixture(scope="module")
def cli_keys(gateway_servers: GatewayServers) -> dict[str, dict[str, str]]:
    return _cli_create_many(
        gateway_servers,
        {
            "acme": ["--tenant", "acme", "--priority", "4"],
            "limited": ["--tenant", "lim", "--rpm", "5"],
            "admin": ["--tenant", "ops", "--admin"],
            "doomed": ["--tenant", "acme", "--models", "chat", "--ipm", "7"],
        },
    )


def _bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def _key(servers: GatewayServers, tenant: str, **settings: Any) -> dict[str, str]:
    """A key written straight into the servers' key file (the CLI path is tested separately)."""
    key, record = new_record(tenant, **settings)
    SqliteKeyStore(servers.db).add(record)
    return _bearer(key)


def _chat(url: str, headers: dict[str, str], model: str = "chat", **body: Any) -> httpx.Response:
    return httpx.post(
        f"{url}/v1/chat/completions", json={"model": model, **CHAT, **body}, headers=headers
    )


def _error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return dict(error)


def test_cli_key_create_use_revoke(
    gateway_servers: GatewayServers, cli_keys: dict[str, dict[str, str]]
) -> None:
    url = gateway_servers.urls[0]
    doomed = cli_keys["doomed"]
    assert doomed["key"].startswith("my-")
    assert doomed["key"] not in gateway_servers.db.read_bytes().decode("latin-1")
    ok = _chat(url, {"x-api-key": doomed["key"]})
    assert ok.status_code == 200
    assert ok.json()["tenant"] == "acme"
    assert ok.headers["x-modelyard-route"] == "chat->chat-v1;direct"
    _error(_chat(url, _bearer(doomed["key"]), model="other"), 403)  # --models chat
    revoked = gateway_servers.cli("revoke", doomed["key_id"])
    assert revoked.returncode == 0, revoked.stderr
    for server in gateway_servers.urls:  # both replicas refuse it at once
        _error(_chat(server, _bearer(doomed["key"])), 401)
    listing = gateway_servers.cli("list")
    line = next(row for row in listing.stdout.splitlines() if row.startswith(doomed["key_id"]))
    assert "revoked" in line
    assert "models=chat" in line
    assert "ipm=7" in line
    assert doomed["key"] not in listing.stdout


def test_every_401_and_403(
    gateway_servers: GatewayServers, cli_keys: dict[str, dict[str, str]]
) -> None:
    url = gateway_servers.urls[1]
    signer = gateway_servers.signer
    cases_401 = {
        "missing": {},
        "unknown key": _bearer("my-" + "A" * 43),
        "not bearer": {"authorization": "Token abc"},
        "garbage jwt": _bearer("a.b.c"),
        "expired": _bearer(signer.token("acme", exp=1000)),
        "wrong audience": _bearer(signer.token("acme", aud="other")),
        "wrong issuer": _bearer(signer.token("acme", iss="https://evil")),
        "wrong signature": _bearer(RsaSigner(signer.kid).token("acme")),
        "unknown kid": _bearer(RsaSigner("nobody").token("acme")),
    }
    for name, headers in cases_401.items():
        response = _chat(url, headers)
        assert response.status_code == 401, name
        assert response.json()["error"]["type"] == "authentication_error", name
    _error(_chat(url, _bearer(signer.token("stranger"))), 403)  # unknown tenant
    _error(_chat(url, _bearer(signer.token("acme")), model="embedder"), 403)  # tenant list
    _error(_chat(url, _bearer(cli_keys["acme"]["key"]), model="embedder"), 403)
    kserve = httpx.post(
        f"{url}/v2/models/embedder/infer", json={}, headers=_bearer(cli_keys["acme"]["key"])
    )
    assert kserve.status_code == 403
    assert isinstance(kserve.json()["error"], str)
    assert httpx.post(f"{url}/v2/models/embedder/infer", json={}).json()["error"]
    assert httpx.get(f"{url}/health").status_code == 200  # open path
    jwt_ok = _chat(url, _bearer(signer.token("acme")))
    assert jwt_ok.status_code == 200
    assert jwt_ok.json()["tenant"] == "acme"
    # an allow-list naming a route allows its aliases too
    aliased = _chat(url, _bearer(signer.token("acme")), model="gpt-4o-mini")
    assert aliased.status_code == 200, aliased.text
    assert aliased.json()["model"] == "chat-v1"
    assert aliased.headers["x-modelyard-route"] == "gpt-4o-mini->chat-v1;alias"


def test_priority_reaches_handler(
    gateway_servers: GatewayServers, cli_keys: dict[str, dict[str, str]]
) -> None:
    assert _chat(gateway_servers.urls[0], _bearer(cli_keys["acme"]["key"])).json()["priority"] == 4
    jwt = _bearer(gateway_servers.signer.token("acme"))
    assert _chat(gateway_servers.urls[0], jwt).json()["priority"] == 2  # the tenant's class


def test_rpm_exact_count(
    gateway_servers: GatewayServers, cli_keys: dict[str, dict[str, str]]
) -> None:
    headers = _bearer(cli_keys["limited"]["key"])
    responses = [_chat(gateway_servers.urls[0], headers) for _ in range(7)]
    assert [r.status_code for r in responses] == [200] * 5 + [429] * 2
    assert [r.headers["x-ratelimit-remaining"] for r in responses[:5]] == ["4", "3", "2", "1", "0"]
    refused = responses[-1]
    assert _error(refused, 429)["code"] == "rate_limit_exceeded"
    assert refused.headers["x-ratelimit-limit"] == "5"
    assert 1 <= int(refused.headers["retry-after"]) <= 12
    assert int(refused.headers["x-ratelimit-reset"]) >= 1


def test_two_servers_share_one_limit(gateway_servers: GatewayServers) -> None:
    headers = _key(gateway_servers, "shared", rpm=8)
    codes = [_chat(gateway_servers.urls[i % 2], headers).status_code for i in range(14)]
    assert codes.count(200) == 8  # one limit across both replicas, not 2 x 8
    assert codes[:8] == [200] * 8
    burst = _key(gateway_servers, "shared-c", rpm=10)
    with httpx.Client() as client, ThreadPoolExecutor(8) as pool:  # bursts at both replicas
        futures = [
            pool.submit(
                client.post,
                f"{gateway_servers.urls[i % 2]}/v1/chat/completions",
                json={"model": "chat", **CHAT},
                headers=burst,
            )
            for i in range(24)
        ]
        statuses = [f.result().status_code for f in futures]
    assert statuses.count(200) == 10
    assert statuses.count(429) == 14


def test_tpm_exact_count_with_refunds(gateway_servers: GatewayServers) -> None:
    body = {"max_tokens": 1000, "x_prompt_tokens": 50, "x_completion_tokens": 450}
    sent = {"model": "chat", **CHAT, **body}
    size = len(json.dumps(sent, separators=(",", ":")).encode())  # httpx sends compact JSON
    estimate, actual = -(-size // 4) + 1000, 500
    # each request needs `estimate` free and then really costs `actual`: 9 pass; at the 10th the
    # bucket lacks actual - 10 = 490 tokens, ~6 s of refill at tpm/60 per second
    tpm = estimate + 8 * actual + 10
    headers = _key(gateway_servers, "tok", tpm=tpm)
    responses = [_chat(gateway_servers.urls[i % 2], headers, **body) for i in range(14)]
    assert responses[0].json()["estimated_tokens"] == estimate
    assert [r.status_code for r in responses] == [200] * 9 + [429] * 5
    assert responses[-1].headers["x-ratelimit-limit"] == str(tpm)


def test_admin_usage(gateway_servers: GatewayServers, cli_keys: dict[str, dict[str, str]]) -> None:
    url = gateway_servers.urls[0]
    headers = _key(gateway_servers, "usage-t", rpm=2)
    for _ in range(3):
        _chat(url, headers, x_prompt_tokens=7, x_completion_tokens=3)
    report = httpx.get(f"{url}/admin/usage", headers=_bearer(cli_keys["admin"]["key"]))
    assert report.status_code == 200
    tenant = report.json()["tenants"]["usage-t"]
    assert tenant == {
        "requests": 2,
        "prompt_tokens": 14,
        "completion_tokens": 6,
        "rejections": {"rpm": 1},
        "models": {
            "chat-v1": {
                "requests": 2,
                "prompt_tokens": 14,
                "completion_tokens": 6,
                "items": 0,
                "input_bytes": tenant["models"]["chat-v1"]["input_bytes"],
                "policies": {"direct": 2},
            }
        },
    }
    assert tenant["models"]["chat-v1"]["input_bytes"] > 100
    not_admin = _key(gateway_servers, "usage-t")
    assert httpx.get(f"{url}/admin/usage", headers=not_admin).status_code == 403
    assert httpx.get(f"{url}/admin/usage").status_code == 401
