"""The request id: one per HTTP request, in the scope, the access log and the response header.

`RequestIdMiddleware` (outermost in the server's stack) keeps an id a trusted outer layer already
put under `REQUEST_ID_SCOPE_KEY`, else accepts a sane `X-Request-ID` header (1-128 characters of
`[A-Za-z0-9._:-]`), else makes one (32 hex digits); it stores the id in the scope and sets the
`x-request-id` response header to it (replacing one the app set). Everything else reads it with
`request_id_of(scope)`.
"""

from __future__ import annotations

import re
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

REQUEST_ID_SCOPE_KEY = "modelyard.request_id"
REQUEST_ID_HEADER = b"x-request-id"
_SANE = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def request_id_of(scope: Scope) -> str | None:
    """The id RequestIdMiddleware assigned (None outside it)."""
    rid: object = scope.get(REQUEST_ID_SCOPE_KEY)
    return rid if isinstance(rid, str) and rid else None


def _from_header(scope: Scope) -> str | None:
    for name, value in scope.get("headers", []):
        if name.lower() == REQUEST_ID_HEADER:
            text = bytes(value).decode("latin-1")
            return text if _SANE.match(text) else None
    return None


class RequestIdMiddleware:
    """Assigns the request id and echoes it (see the module docstring)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = request_id_of(scope) or _from_header(scope) or uuid.uuid4().hex
        scope[REQUEST_ID_SCOPE_KEY] = rid
        raw_id = rid.encode("latin-1")

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (k, v) for k, v in message.get("headers", []) if k.lower() != REQUEST_ID_HEADER
                ]
                headers.append((REQUEST_ID_HEADER, raw_id))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_id)
