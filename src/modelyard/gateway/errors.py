"""Gateway rejections written straight to ASGI `send`, in the envelope of the request's protocol.

Paths under /v2 (KServe v2) get `{"error": "..."}`; everything else gets the OpenAI error object
`{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from starlette.types import Scope, Send


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
    if path.startswith("/v2/") or path == "/v2":
        return json.dumps({"error": error.message}).encode()
    payload = {
        "error": {
            "message": error.message,
            "type": error.err_type,
            "param": error.param,
            "code": error.code,
        }
    }
    return json.dumps(payload).encode()


async def send_error(
    scope: Scope, send: Send, error: GatewayError, extra: Iterable[tuple[str, str]] = ()
) -> None:
    """Write the whole error response."""
    body = error_body(scope.get("path", ""), error)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in (*error.headers, *extra)]
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
