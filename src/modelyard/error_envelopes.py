"""Error bodies in the envelope of the protocol a path belongs to, built in one place for the
route handlers (api/errors.py) and for the pure-ASGI middleware that answers before any route
runs (body limit, gateway):

- KServe v2 / Open Inference Protocol, paths under `/v2`: `{"error": "<message>"}`;
- everything else (OpenAI API, textbook routes): `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from starlette.types import Send


def is_kserve_path(path: str) -> bool:
    return path == "/v2" or path.startswith("/v2/")


def error_body(
    path: str,
    message: str,
    *,
    type: str,
    param: str | None = None,
    code: str | int | None = None,
) -> dict[str, Any]:
    """The error body for a request to `path` (OpenAI `type`, `param`, `code` where it has them)."""
    if is_kserve_path(path):
        return {"error": message}
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


async def send_error_body(
    send: Send, status: int, body: dict[str, Any], headers: Iterable[tuple[str, str]] = ()
) -> None:
    """Write a whole JSON error response on a raw ASGI `send` (for middleware)."""
    payload = json.dumps(body).encode()
    raw_headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        *((name.encode("latin-1"), value.encode("latin-1")) for name, value in headers),
    ]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": payload})
