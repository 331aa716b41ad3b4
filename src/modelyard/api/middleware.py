"""The HTTP edge policies, pure ASGI (BaseHTTPMiddleware would break streaming and disconnects),
assembled in one function, outermost first:

1. RequestIdMiddleware: accept a sane `X-Request-ID` or make one; echo it on the response;
2. gateway slot: authentication (Principal and the request's Ticket into the scope; gateway/);
3. BodyLimitMiddleware: 413 in the protocol's envelope for bodies over server.max_body_bytes.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from modelyard.api.errors import APIError, error_body_for_path
from modelyard.config import ModelyardConfig
from modelyard.gateway.gateway import Gateway
from modelyard.gateway.middleware import build_gateway_middleware
from modelyard.observability.http import observability_middleware

REQUEST_ID_SCOPE_KEY = "modelyard.request_id"
_REQUEST_ID_OK = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def build_middleware_stack(config: ModelyardConfig, gateway: Gateway) -> list[Middleware]:
    """The middleware list for FastAPI(middleware=...), outermost first."""
    stack = [Middleware(RequestIdMiddleware)]
    stack.extend(observability_middleware())  # access log + HTTP metrics (observability/)
    # gateway slot: authentication; quotas, routing and usage are the request path's
    stack.extend(build_gateway_middleware(gateway.config, gateway=gateway))
    stack.append(Middleware(BodyLimitMiddleware, max_body_bytes=config.server.max_body_bytes))
    return stack


class RequestIdMiddleware:
    """Puts the request id in scope[REQUEST_ID_SCOPE_KEY] and the `x-request-id` header."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = _header(scope, b"x-request-id")
        if request_id is None or not _REQUEST_ID_OK.match(request_id):
            request_id = uuid.uuid4().hex
        scope[REQUEST_ID_SCOPE_KEY] = request_id
        raw_id = request_id.encode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (k, v) for k, v in message.get("headers", []) if k.lower() != b"x-request-id"
                ]
                headers.append((b"x-request-id", raw_id))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_id)


class BodyLimitMiddleware:
    """Rejects bodies over max_body_bytes with 413: at once by Content-Length, otherwise by
    buffering the chunked body up to the limit and replaying it to the app."""

    def __init__(self, app: ASGIApp, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _header(scope, b"content-length")
        if length is not None:
            if not length.isdigit() or int(length) > self.max_body_bytes:
                await self._reject(scope, send)
                return
            await self.app(scope, receive, send)
            return
        buffered: list[Message] = []
        size = 0
        while True:
            message = await receive()
            buffered.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.max_body_bytes:
                await self._reject(scope, send)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            if buffered:
                return buffered.pop(0)
            return await receive()

        await self.app(scope, replay, send)

    async def _reject(self, scope: Scope, send: Send) -> None:
        error = APIError(
            413, f"request body larger than {self.max_body_bytes} bytes", code="body_too_large"
        )
        await send_json(send, 413, error_body_for_path(scope.get("path", ""), error))


async def send_json(send: Send, status: int, body: Any) -> None:
    payload = json.dumps(body).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return None
