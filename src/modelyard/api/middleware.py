"""The HTTP edge policies, pure ASGI (BaseHTTPMiddleware would break streaming and disconnects),
assembled in one function, outermost first:

0. LastResortMiddleware: no exception leaves the app (see its docstring);
1. RequestIdMiddleware: accept a sane `X-Request-ID` or make one; echo it on the response;
2. AccessLogMiddleware, MetricsMiddleware: one log line and the HTTP metrics per request (they
   see gateway rejections too);
3. the gateway: authentication (Principal and the request's Ticket into the scope; gateway/);
4. BodyLimitMiddleware: 413 in the protocol's envelope for bodies over server.max_body_bytes;
5. JsonGuardMiddleware (api/limits.py): 400 for a JSON body too deep, too large in values, not
   UTF-8, holding NaN or a lone surrogate, before any handler parses it.
"""

from __future__ import annotations

import logging

from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from modelyard.api.errors import APIError, api_error_from_exception
from modelyard.api.limits import JsonGuardMiddleware
from modelyard.config import ModelyardConfig
from modelyard.error_envelopes import send_error_body
from modelyard.gateway.gateway import Gateway
from modelyard.gateway.middleware import build_gateway_middleware
from modelyard.observability.http import MetricsMiddleware
from modelyard.observability.logging import AccessLogMiddleware
from modelyard.observability.request_id import (
    REQUEST_ID_HEADER,
    RequestIdMiddleware,
    request_id_of,
)

log = logging.getLogger(__name__)


def build_middleware_stack(config: ModelyardConfig, gateway: Gateway) -> list[Middleware]:
    """The middleware list for FastAPI(middleware=...), outermost first."""
    stack = [
        Middleware(LastResortMiddleware),
        Middleware(RequestIdMiddleware),
        Middleware(AccessLogMiddleware),
        Middleware(MetricsMiddleware),
    ]
    # authentication; quotas, routing and usage are the request path's (gateway/request_path.py)
    stack.extend(build_gateway_middleware(gateway.config, gateway=gateway))
    stack.append(Middleware(BodyLimitMiddleware, max_body_bytes=config.server.max_body_bytes))
    stack.append(Middleware(JsonGuardMiddleware, server=config.server))
    return stack


class LastResortMiddleware:
    """The outermost policy: an exception that escapes everything inside it (a route, a
    dependency, a middleware) never leaves the app, where the server would log it and drop the
    connection, failing the client's next request on it too. Before the response has started,
    it becomes the response: `api_error_from_exception`'s status (500 for the unforeseen, which
    it logs) in the envelope of the path's protocol, with the request id. After, the response
    is left unfinished, which the server answers by closing the connection: the client then
    knows the body it has is incomplete. Cancellation is not an error: it goes on out."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            if started:
                log.warning("%s failed after its response started", scope.get("path"), exc_info=exc)
                return
            await _answer(scope, send, exc)


async def _answer(scope: Scope, send: Send, exc: Exception) -> None:
    """The error response for `exc` (LastResortMiddleware)."""
    path = str(scope.get("path", ""))
    error = api_error_from_exception(exc, path)
    headers = error.headers()
    rid = request_id_of(scope)
    if rid is not None:
        headers[REQUEST_ID_HEADER.decode()] = rid
    try:
        await send_error_body(send, error.status, error.body(path), headers.items())
    except Exception:  # the connection is gone: nobody is left to answer
        log.debug("could not send the error response of %s", path, exc_info=True)


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
        await send_error_body(send, 413, error.body(scope.get("path", "")))


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return None
