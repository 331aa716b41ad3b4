"""The Redis limit store and key store against a real redis-server."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
from gw_helpers import build_fake_app
from gw_redis import RedisServer

from modelyard.gateway.config import GatewayConfig, Quota
from modelyard.gateway.gateway import Gateway, build_gateway
from modelyard.gateway.keys import RedisKeyStore, new_record
from modelyard.gateway.ratelimit import Charge, Limit, MemoryStore, StoreUnavailable
from modelyard.gateway.redis_store import RedisStore, make_client
from modelyard.observability.metrics import RATE_LIMIT_STORE_ERRORS

pytestmark = pytest.mark.integration


@pytest.fixture
async def stores(redis_server: RedisServer) -> AsyncIterator[tuple[RedisStore, RedisStore]]:
    """Two stores with separate clients: two replicas' views of one Redis."""
    a = RedisStore(make_client(redis_server.url, 2.0), timeout_s=2.0)
    b = RedisStore(make_client(redis_server.url, 2.0), timeout_s=2.0)
    yield a, b
    await a.close()
    await b.close()


def _tenant() -> str:
    return "t-" + uuid.uuid4().hex[:8]


async def test_rpm_exact_across_two_clients(stores: tuple[RedisStore, RedisStore]) -> None:
    tenant, quota = _tenant(), Quota(rpm=7)
    results = [await stores[i % 2].acquire(tenant, quota, Charge()) for i in range(12)]
    assert [r.allowed for r in results] == [True] * 7 + [False] * 5
    assert [r.remaining for r in results[:7]] == [6, 5, 4, 3, 2, 1, 0]
    assert results[-1].refused == Limit.RPM
    assert 1 <= results[-1].retry_after_s <= 60 / 7


async def test_concurrent_acquires_are_atomic(stores: tuple[RedisStore, RedisStore]) -> None:
    tenant, quota = _tenant(), Quota(rpm=25)
    calls = [stores[i % 2].acquire(tenant, quota, Charge()) for i in range(60)]
    results = await asyncio.gather(*calls)
    assert sum(r.allowed for r in results) == 25


async def test_tpm_and_concurrency_match_memory_store(
    stores: tuple[RedisStore, RedisStore],
) -> None:
    """Same operations on the Redis store and the reference memory store give the same answers."""
    tenant, quota = _tenant(), Quota(tpm=100, ipm=10, max_concurrent=2)
    memory = MemoryStore()
    script = [("acquire", 60), ("acquire", 60), ("settle", 45), ("acquire", 60), ("acquire", 1)]
    script += [("settle", -30), ("release", 0), ("acquire", 5), ("acquire", 5)]
    script += [("release", 0), ("release", 0), ("items", 4), ("items", 25), ("items", 1)]
    script += [("acquire", 1)]  # tokens only: an ipm bucket in debt does not refuse it
    for op, amount in script:
        if op in ("acquire", "items"):
            charge = Charge(tokens=amount) if op == "acquire" else Charge(items=amount)
            got = await stores[0].acquire(tenant, quota, charge)
            want = await memory.acquire(tenant, quota, charge)
            assert (got.allowed, got.refused) == (want.allowed, want.refused), (op, amount)
            assert abs(got.remaining - want.remaining) <= 1
        else:
            release = op == "release"
            await stores[1].settle(tenant, quota, amount, release)
            await memory.settle(tenant, quota, amount, release)


async def test_redis_key_store(redis_server: RedisServer) -> None:
    store = RedisKeyStore(redis_server.url, prefix=f"test:{uuid.uuid4().hex}:")
    key, record = new_record("acme", rpm=3, admin=True)
    store.add(record)
    found = store.find(key)
    assert found is not None
    assert found.rpm == 3
    assert found.admin
    assert store.has_keys()
    assert store.revoke(record.key_id)
    assert store.find(key) is None
    assert not store.revoke(record.key_id)
    raw_values = [store.client.get(k) for k in store.client.scan_iter(match=store.prefix + "*")]
    assert all(key.encode() not in (v or b"") for v in raw_values)
    store.client.close()


async def _app_client(url: str, policy: str) -> tuple[httpx.AsyncClient, Gateway]:
    config = GatewayConfig.from_dict(
        {
            "auth": "off",
            "redis_url": url,
            "redis_timeout_s": 0.2,
            "rate_limit": {"store": "redis", "on_store_error": policy, "default": {"rpm": 100}},
        }
    )
    gateway = build_gateway(config)
    app = build_fake_app(config, gateway=gateway)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x")
    return client, gateway


@pytest.mark.parametrize(("policy", "status"), [("open", 200), ("closed", 503)])
async def test_redis_stopped_mid_test(private_redis: RedisServer, policy: str, status: int) -> None:
    client, gateway = await _app_client(private_redis.url, policy)
    body = {"model": "m", "messages": []}
    try:
        ok = await client.post("/v1/chat/completions", json=body)
        assert ok.status_code == 200
        assert ok.headers["x-ratelimit-remaining"] == "99"
        private_redis.stop()
        before = RATE_LIMIT_STORE_ERRORS.labels(policy)._value.get()
        started = time.monotonic()
        response = await client.post("/v1/chat/completions", json=body)
        elapsed = time.monotonic() - started
        assert response.status_code == status
        assert elapsed < 1.0  # short timeouts: a dead Redis never hangs a request
        assert RATE_LIMIT_STORE_ERRORS.labels(policy)._value.get() > before
        if status == 503:
            assert response.headers["retry-after"] == "1"
            assert response.json()["error"]["message"] == "rate limiter unavailable"
        else:
            assert "x-ratelimit-limit" not in response.headers
        with pytest.raises(StoreUnavailable):
            await gateway.limits.acquire("t", Quota(rpm=1), Charge())
    finally:
        await client.aclose()
        await gateway.close()


def test_keys_cli_with_redis_backend_from_config(
    redis_server: RedisServer, tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`modelyard keys --config FILE` with `keys.backend: redis`: create, list, revoke."""
    from modelyard.cli import build_parser
    from modelyard.gateway import cli

    config = tmp_path / "modelyard.yaml"
    config.write_text(f"gateway:\n  redis_url: {redis_server.url}\n  keys: {{backend: redis}}\n")

    def run(*argv: str) -> int:
        args = build_parser().parse_args(["keys", "--config", str(config), *argv])
        return cli.run(args)

    assert run("create", "--tenant", "cli-redis", "--rpm", "9", "--json") == 0
    created = json.loads(capsys.readouterr().out)
    store = RedisKeyStore(redis_server.url)
    try:
        record = store.find(created["key"])
        assert record is not None
        assert (record.tenant, record.rpm) == ("cli-redis", 9)
        assert run("list") == 0
        assert created["key_id"] in capsys.readouterr().out
        assert run("revoke", created["key_id"]) == 0
        assert store.find(created["key"]) is None
        assert run("create", "--tenant", "x", "--rpm", "0") == 2  # validated
    finally:
        store.client.close()
