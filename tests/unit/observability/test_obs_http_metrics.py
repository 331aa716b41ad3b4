from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi import FastAPI, HTTPException
from obs_helpers import sample
from starlette.types import ASGIApp, Receive, Scope, Send

from modelyard.gateway.base import PRINCIPAL_SCOPE_KEY, Principal
from modelyard.observability.http import UNMATCHED_ROUTE, MetricsMiddleware

pytestmark = pytest.mark.unit

REQ = "modelyard:http_requests_total"
DUR = "modelyard:http_request_duration_seconds"


class FakeAuth:
    """Puts a Principal whose tenant is the X-Tenant header into the scope, like the gateway."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = dict(scope.get("headers", []))
        if b"x-tenant" in headers:
            scope[PRINCIPAL_SCOPE_KEY] = Principal(tenant=headers[b"x-tenant"].decode())
        await self.app(scope, receive, send)


def make_app() -> ASGIApp:
    app = FastAPI()

    @app.get("/items/{item_id}")
    async def item(item_id: int) -> dict[str, int]:
        if item_id == 13:
            raise HTTPException(status_code=418, detail="unlucky")
        return {"id": item_id}

    @app.post("/slow")
    async def slow() -> dict[str, str]:
        await asyncio.sleep(0.06)
        return {"ok": "yes"}

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("bug")

    return MetricsMiddleware(FakeAuth(app))


async def test_counters_exact_under_scripted_traffic() -> None:
    route = "/items/{item_id}"
    keys = [
        (route, "GET", "200", "acme"),
        (route, "GET", "200", "anonymous"),
        (route, "GET", "418", "acme"),
        (UNMATCHED_ROUTE, "GET", "404", "acme"),
        ("/slow", "POST", "200", "beta"),
        ("/boom", "GET", "500", "anonymous"),
    ]
    names = ("route", "method", "status", "tenant")
    before = {k: sample(REQ, **dict(zip(names, k, strict=True))) for k in keys}
    dur_before = sample(DUR + "_count", route=route, method="GET")

    transport = httpx.ASGITransport(app=make_app(), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        acme = {"x-tenant": "acme"}
        for i in range(5):
            assert (await client.get(f"/items/{i}", headers=acme)).status_code == 200
        for i in range(3):
            assert (await client.get(f"/items/{i}")).status_code == 200
        assert (await client.get("/items/13", headers=acme)).status_code == 418
        assert (await client.get("/items/13", headers=acme)).status_code == 418
        for path in ("/nope", "/nope/deeper", "/x"):
            assert (await client.get(path, headers=acme)).status_code == 404
        await client.post("/slow", headers={"x-tenant": "beta"})
        assert (await client.get("/boom")).status_code == 500

    expected = [5, 3, 2, 3, 1, 1]
    for key, n in zip(keys, expected, strict=True):
        after = sample(REQ, **dict(zip(names, key, strict=True)))
        assert after - before[key] == n, key
    assert sample(DUR + "_count", route=route, method="GET") - dur_before == 10


async def test_duration_lands_in_the_right_bucket() -> None:
    le_05 = sample(DUR + "_bucket", route="/slow", method="POST", le="0.05")
    le_01 = sample(DUR + "_bucket", route="/slow", method="POST", le="0.1")
    transport = httpx.ASGITransport(app=make_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        await client.post("/slow")
    # 60 ms of sleep: above the 0.05 bucket bound, within 0.1 (cumulative buckets).
    assert sample(DUR + "_bucket", route="/slow", method="POST", le="0.05") == le_05
    assert sample(DUR + "_bucket", route="/slow", method="POST", le="0.1") == le_01 + 1


async def test_excluded_paths_are_not_counted() -> None:
    app = FastAPI()

    @app.get("/metrics")
    async def metrics() -> str:
        return "x"

    before = sample(REQ, route="/metrics", method="GET", status="200", tenant="anonymous")
    wrapped = MetricsMiddleware(app, exclude_paths=frozenset({"/metrics"}))
    transport = httpx.ASGITransport(app=wrapped)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        await client.get("/metrics")
    assert sample(REQ, route="/metrics", method="GET", status="200", tenant="anonymous") == before
