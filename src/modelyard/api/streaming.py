"""Server-sent events: framing, the terminal `[DONE]`, and the streaming response.

Every event is one `data: <json>\n\n` frame, flushed as soon as it is yielded (no buffering
anywhere: StreamingResponse sends each chunk, `X-Accel-Buffering: no` asks proxies to do the same).
An error after the first byte cannot change the status any more: it is sent as an error event
`data: {"error": {...}}` followed by `data: [DONE]`, never as a silent end of stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import msgspec
from starlette.responses import StreamingResponse

from modelyard.api.errors import APIError

SSE_DONE = b"data: [DONE]\n\n"

_encode = msgspec.json.Encoder().encode  # compact, UTF-8 as is; ~10x faster than json.dumps

SSE_HEADERS = {
    "Cache-Control": "no-cache",
    "Connection": "keep-alive",
    "X-Accel-Buffering": "no",
}


def sse_event(payload: Mapping[str, Any]) -> bytes:
    """One SSE frame carrying a compact JSON object."""
    return b"data: " + _encode(payload) + b"\n\n"


def sse_error(error: APIError) -> bytes:
    """The error event sent when a stream fails after its first byte."""
    return sse_event(error.body())


def sse_response(
    events: AsyncIterator[bytes], headers: Mapping[str, str] | None = None
) -> StreamingResponse:
    """A text/event-stream response over already framed events."""
    all_headers = dict(SSE_HEADERS)
    all_headers.update(headers or {})
    return StreamingResponse(events, media_type="text/event-stream", headers=all_headers)


def parse_sse(body: str) -> list[str]:
    """The `data:` payloads of an SSE body, in order (used by tests and the bench client)."""
    return [line[len("data: ") :] for line in body.splitlines() if line.startswith("data: ")]
