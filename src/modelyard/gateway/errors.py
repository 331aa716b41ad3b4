"""Gateway rejections written straight to ASGI `send`, in the envelope of the request's protocol
(`modelyard.error_envelopes`)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from starlette.types import Scope, Send

from modelyard.error_envelopes import error_body as envelope
from modelyard.error_envelopes import send_error_body


@dataclass(eq=False)
class GatewayError(Exception):
    """A request the gateway refuses (mutable: exceptions get tracebacks assigned)."""

    status: int  # HTTP status: 401, 403, 429, 503
    message: str  # human-readable reason
    code: str  # machine-readable code (OpenAI `code`)
    err_type: str  # OpenAI `type`
    headers: tuple[tuple[str, str], ...] = ()  # extra response headers (Retry-After, ...)
    param: str | None = None  # the request field to blame (OpenAI `param`)


def unauthorized(message: str) -> GatewayError:
    return GatewayError(
        401, message, "invalid_api_key", "authentication_error", (("www-authenticate", "Bearer"),)
    )


def forbidden(
    message: str, code: str = "permission_denied", param: str | None = None
) -> GatewayError:
    return GatewayError(403, message, code, "permission_error", param=param)


def unavailable(message: str) -> GatewayError:
    return GatewayError(503, message, "unavailable", "server_error", (("retry-after", "1"),))


def error_body(path: str, error: GatewayError) -> bytes:
    body = envelope(path, error.message, type=error.err_type, param=error.param, code=error.code)
    return json.dumps(body).encode()


async def send_error(
    scope: Scope, send: Send, error: GatewayError, extra: Iterable[tuple[str, str]] = ()
) -> None:
    """Write the whole error response."""
    path = scope.get("path", "")
    body = envelope(path, error.message, type=error.err_type, param=error.param, code=error.code)
    await send_error_body(send, error.status, body, (*error.headers, *extra))
