from __future__ import annotations

import json
import logging

import httpx
import pytest
from fastapi import FastAPI, Request

from modelyard.engine.messages import SchedulerStats
from modelyard.gateway.base import USAGE_SCOPE_KEY, RequestUsage
from modelyard.observability.collectors import register_engine_stats_source
from modelyard.observability.logging import (
    ACCESS_LOGGER,
    AccessLogMiddleware,
    JsonFormatter,
    TextFormatter,
)
from modelyard.observability.request_id import REQUEST_ID_SCOPE_KEY, RequestIdMiddleware
from modelyard.observability.routes import router

pytestmark = pytest.mark.unit


def make_app(log_bodies: bool = False) -> RequestIdMiddleware:
    app = FastAPI()
    app.include_router(router)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, str]:
        await request.body()
        request.scope[USAGE_SCOPE_KEY] = RequestUsage(model="tiny-llm")
        return {"rid": request.scope[REQUEST_ID_SCOPE_KEY]}

    return RequestIdMiddleware(AccessLogMiddleware(app, log_bodies=log_bodies))


async def test_access_log_carries_the_request_id(caplog: pytest.LogCaptureFixture) -> None:
    transport = httpx.ASGITransport(app=make_app())
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        r = await client.post(
            "/v1/chat/completions", json={"prompt": "secret"}, headers={"X-Request-ID": "abc-1"}
        )
        r2 = await client.post("/v1/chat/completions", json={})
    assert r.headers["x-request-id"] == "abc-1"
    assert r.json()["rid"] == "abc-1"
    generated = r2.headers["x-request-id"]
    assert len(generated) == 32
    assert r2.json()["rid"] == generated
    records = [rec for rec in caplog.records if rec.name == ACCESS_LOGGER]
    assert len(records) == 2
    line = json.loads(JsonFormatter().format(records[0]))
    assert line["request_id"] == "abc-1"
    assert line["status"] == 200
    assert line["model"] == "tiny-llm"
    assert line["tenant"] == "anonymous"
    assert line["route"] == "/v1/chat/completions"
    assert line["latency_ms"] >= 0
    assert "secret" not in json.dumps(line)
    assert "request_id=abc-1" in TextFormatter().format(records[0])


async def test_bodies_logged_only_when_switched_on(caplog: pytest.LogCaptureFixture) -> None:
    transport = httpx.ASGITransport(app=make_app(log_bodies=True))
    caplog.set_level(logging.INFO, logger=ACCESS_LOGGER)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        await client.post("/v1/chat/completions", json={"prompt": "visible"})
    rec = next(rec for rec in caplog.records if rec.name == ACCESS_LOGGER)
    assert "visible" in json.loads(JsonFormatter().format(rec))["body"]


async def test_server_request_id_in_scope_wins() -> None:
    inner = make_app()

    async def with_rid(scope, receive, send):  # type: ignore[no-untyped-def]
        scope[REQUEST_ID_SCOPE_KEY] = "from-server"
        await inner(scope, receive, send)

    transport = httpx.ASGITransport(app=with_rid)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        r = await client.post("/v1/chat/completions", json={}, headers={"X-Request-ID": "h"})
    assert r.json()["rid"] == "from-server"
    assert r.headers["x-request-id"] == "from-server"


async def test_metrics_route_renders_prometheus_text_with_engine_gauges() -> None:
    unregister = register_engine_stats_source(
        lambda: {"route-test-model": SchedulerStats(num_waiting=4)}
    )
    try:
        transport = httpx.ASGITransport(app=make_app())
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            r = await client.get("/metrics")
    finally:
        unregister()
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/plain")
    assert 'modelyard:num_requests_waiting{model="route-test-model"} 4.0' in r.text
    assert "# TYPE modelyard:time_to_first_token_seconds histogram" in r.text


def test_configure_logging_installs_one_handler(capsys: pytest.CaptureFixture[str]) -> None:
    from modelyard.observability.logging import configure_logging

    root = logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    try:
        configure_logging(json=True)
        configure_logging(json=True)  # idempotent: replaces its own handler
        ours = [h for h in root.handlers if h.get_name() == "modelyard"]
        assert len(ours) == 1
        assert isinstance(ours[0].formatter, JsonFormatter)
        logging.getLogger("modelyard.test").info("hi", extra={"fields": {"request_id": "r-9"}})
        line = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
        assert line["msg"] == "hi"
        assert line["request_id"] == "r-9"
        configure_logging(json=False)
        ours = [h for h in root.handlers if h.get_name() == "modelyard"]
        assert isinstance(ours[0].formatter, TextFormatter)
    finally:
        for h in [h for h in root.handlers if h.get_name() == "modelyard"]:
            root.removeHandler(h)
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
