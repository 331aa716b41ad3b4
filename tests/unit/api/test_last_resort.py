"""No exception leaves the ASGI app, on any route: every route of the real app (on fakes), its
dependency or handler raising, answers an enveloped 500 in its protocol's envelope (KServe's
under /v2, OpenAI's elsewhere: the OpenAI API, the textbook and admin routes) with the request
id; so does a middleware raising, wherever it sits in the stack. A stream that fails after its
response started ends unfinished, without the exception escaping either. The client transport
lets app exceptions through, so an escaping one fails the test."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute, iter_route_contexts
from starlette.middleware import Middleware
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from fakes.llm import FakeLLM
from fakes.models import FakeProvider
from modelyard.api.app import build_app
from modelyard.config import ModelyardConfig
from modelyard.gateway.request_path import admit_request

pytestmark = pytest.mark.unit

MESSAGE = "boom: an error nobody foresaw"


def fresh_app() -> FastAPI:
    return build_app(FakeProvider({"m": FakeLLM(name="m")}), ModelyardConfig())


def route_ids() -> list[tuple[str, str, bool]]:
    """(method, path template, runs FastAPI's dependencies) of every route the app serves."""
    found = []
    for context in iter_route_contexts(fresh_app().routes):
        is_api = isinstance(context.original_route, APIRoute)
        methods = sorted((context.methods or {"GET"}) - {"HEAD"})
        found.extend((method, str(context.path), is_api) for method in methods)
    return found


ROUTES = route_ids()


def client(app: Any) -> httpx.AsyncClient:
    """A client through which an exception escaping the app raises (the server would drop the
    connection)."""
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=True)
    return httpx.AsyncClient(transport=transport, base_url="http://test")


async def raise_unforeseen() -> None:
    raise RuntimeError(MESSAGE)


async def raising_app(scope: Scope, receive: Receive, send: Send) -> None:
    raise RuntimeError(MESSAGE)


def make_every_route_raise(app: FastAPI) -> None:
    """FastAPI routes: their first dependency raises; the others (the docs): their handler."""
    app.dependency_overrides[admit_request] = raise_unforeseen
    for context in iter_route_contexts(app.routes):
        if not isinstance(context.original_route, APIRoute):
            context.original_route.app = raising_app  # type: ignore[attr-defined]


def assert_enveloped_500(response: httpx.Response, path: str, *, with_id: bool = True) -> None:
    assert response.status_code == 500, response.text
    assert response.headers["content-type"] == "application/json"
    if with_id:
        assert re.fullmatch(r"[0-9a-f]{32}", response.headers["x-request-id"])
    error = response.json()["error"]
    if path == "/v2" or path.startswith("/v2/"):  # KServe v2: {"error": "<message>"}
        assert isinstance(error, str)
        assert MESSAGE in error
        return
    assert set(error) == {"message", "type", "param", "code"}  # OpenAI's, textbook's too
    assert MESSAGE in error["message"]
    assert error["type"] == "internal_server_error"


def test_every_route_is_covered() -> None:
    paths = {path for _, path, _ in ROUTES}
    assert {"/v1/load_lora_adapter", "/v2/models/{name}/infer", "/generate", "/docs"} <= paths
    assert {"/metrics", "/admin/usage", "/v1/unload_lora_adapter", "/ui/api/summary"} <= paths


@pytest.mark.parametrize(
    ("method", "path", "is_api"), ROUTES, ids=[f"{m} {p}" for m, p, _ in ROUTES]
)
async def test_a_raising_route_answers_an_enveloped_500(
    method: str, path: str, is_api: bool
) -> None:
    app = fresh_app()
    make_every_route_raise(app)
    url = re.sub(r"\{[^}]+\}", "x", path)
    body = {"json": {}} if method in ("POST", "PUT", "PATCH") else {}
    async with client(app) as c:
        response = await c.request(method, url, **body)  # type: ignore[arg-type]
    assert_enveloped_500(response, path)


class RaisingMiddleware:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            raise RuntimeError(MESSAGE)
        await self.app(scope, receive, send)


MIDDLEWARE = len(fresh_app().user_middleware)


@pytest.mark.parametrize("position", range(1, MIDDLEWARE + 1))
async def test_a_raising_middleware_answers_an_enveloped_500(position: int) -> None:
    """A middleware that raises, put after each of the app's own (the last resort stays first)."""
    app = fresh_app()
    app.user_middleware.insert(position, Middleware(RaisingMiddleware))
    async with client(app) as c:
        for path in ("/v1/models", "/v2/models/m", "/health"):
            # the request id is given by the next middleware: none before it
            assert_enveloped_500(await c.get(path), path, with_id=position > 1)


async def test_a_stream_failing_after_its_start_ends_without_the_exception_escaping() -> None:
    """Driven as the server drives it: the app returns with the response unfinished (the server
    then closes the connection, so the client knows the body is incomplete)."""
    app = fresh_app()

    async def chunks() -> AsyncIterator[bytes]:
        yield b"data: first\n\n"
        raise RuntimeError(MESSAGE)

    @app.get("/v1/failing-stream")
    async def failing_stream() -> StreamingResponse:
        return StreamingResponse(chunks(), media_type="text/event-stream")

    sent: list[Message] = []
    requests = [{"type": "http.request", "body": b"", "more_body": False}]

    async def receive() -> Message:
        if requests:
            return requests.pop()
        await asyncio.Event().wait()  # the client stays connected
        raise AssertionError("unreachable")

    async def send(message: Message) -> None:
        sent.append(message)

    await app(http_scope("GET", "/v1/failing-stream"), receive, send)  # returns: no raise
    assert sent[0]["type"] == "http.response.start"
    assert sent[0]["status"] == 200
    bodies = [m for m in sent if m["type"] == "http.response.body"]
    assert b"".join(m.get("body", b"") for m in bodies) == b"data: first\n\n"
    assert all(m.get("more_body") for m in bodies)  # never marked complete


def http_scope(method: str, path: str) -> Scope:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"test")],
        "client": ("127.0.0.1", 1234),
        "server": ("test", 80),
    }
