"""Limits every request meets at the HTTP edge, before anything parses or runs it.

- `JsonGuardMiddleware` (pure ASGI, outside the gateway, which reads bodies too). A request body
  that a handler will parse as JSON (any POST/PUT/PATCH body but a form upload) must
  1. be UTF-8 (RFC 8259);
  2. nest arrays and objects at most `server.max_json_depth` deep, and hold at most
     `server.max_json_elements` of them and their separated values together;
  3. hold no lone UTF-16 surrogate escape (`"\\ud800"` without its low half): such a string
     cannot be encoded, so no tokenizer, model or response could carry it;
  4. hold no NaN or Infinity (Python's parser accepts them; JSON does not).
  The checks read the raw bytes in linear time (regular expressions without backtracking,
  `bytes.translate`, numpy), so no parser recurses into a hostile body; a failure is a 400 in
  the route's envelope. A body over `server.max_body_bytes` passes unread (BodyLimitMiddleware
  answers 413). Of a KServe binary request only the JSON header is checked.
- `check_generation_limits`: the completions one request asks for (n x its prompts) and their
  tokens (x max_tokens, or the context length when unset) stay within `server.max_n` and
  `server.max_n_tokens`.
"""

from __future__ import annotations

import re

import anyio
import numpy as np
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from modelyard.api.errors import APIError
from modelyard.config import ServerConfig
from modelyard.engine.sampling_params import SamplingParams

#: Bodies larger than this are checked in a worker thread, off the event loop.
_INLINE_CHECK_BYTES = 256 * 1024
#: A JSON string, complete or running to the end of the body (possessive: never backtracks).
_STRING = re.compile(rb'"(?:[^"\\]++|\\.)*+(?:"|\\?\Z)', re.DOTALL)
#: An escape of a UTF-16 surrogate with the backslashes before it (only the first of a run).
_SURROGATE_ESCAPE = re.compile(rb"(?<!\\)(\\++)u([dD][89a-fA-F][0-9a-fA-F]{2})")
_STRUCTURE = b"[]{},"
_NOT_STRUCTURE = bytes(b for b in range(256) if b not in _STRUCTURE)
_FORMS = (b"multipart/form-data", b"application/x-www-form-urlencoded")


def json_body_problem(body: bytes, max_depth: int, max_elements: int) -> str | None:
    """Why `body` may not be parsed as JSON here (None: it may). Linear time, no recursion."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"request body is not valid UTF-8 (byte {exc.start})"
    if b"\\u" in body:
        lone = _lone_surrogate(body)
        if lone is not None:
            return (
                f"request body holds a lone UTF-16 surrogate escape (\\u{lone}): strings must "
                "be valid Unicode"
            )
    skeleton: bytes | None = None  # the body with every string emptied (made when needed)
    if b"NaN" in body or b"Infinity" in body:
        skeleton = _STRING.sub(b'""', body)
        if b"NaN" in skeleton or b"Infinity" in skeleton:
            return "request body holds NaN or Infinity, which JSON does not allow"
    containers = body.count(b"[") + body.count(b"{")  # an upper bound (strings included)
    if containers <= max_depth and containers + body.count(b",") <= max_elements:
        return None
    if skeleton is None:
        skeleton = _STRING.sub(b'""', body)
    structure = np.frombuffer(skeleton.translate(None, _NOT_STRUCTURE), np.uint8)
    opens = (structure == ord("[")) | (structure == ord("{"))
    closes = (structure == ord("]")) | (structure == ord("}"))
    depth = int(np.cumsum(opens.astype(np.int64) - closes).max()) if structure.size else 0
    if depth > max_depth:
        return (
            f"request body nests {depth} levels deep; at most {max_depth} (server.max_json_depth)"
        )
    elements = int(structure.size - closes.sum())  # arrays, objects and commas between values
    if elements > max_elements:
        return (
            f"request body holds {elements} JSON values; at most {max_elements} "
            "(server.max_json_elements)"
        )
    return None


def _lone_surrogate(body: bytes) -> str | None:
    """The first surrogate escape without its pair (high then low, adjacent), if any."""
    pending: tuple[int, str] | None = None  # (end of an unpaired high escape, its hex)
    for match in _SURROGATE_ESCAPE.finditer(body):
        if len(match.group(1)) % 2 == 0:
            continue  # an escaped backslash followed by the text "u..."
        start, unit = match.end(1) - 1, match.group(2).decode()
        is_high = int(unit, 16) < 0xDC00
        if pending is not None and (is_high or start != pending[0]):
            return pending[1]
        if not is_high and pending is None:
            return unit
        pending = (match.end(), unit) if is_high else None
    return pending[1] if pending is not None else None


def check_generation_limits(
    num_prompts: int, params: SamplingParams, max_model_len: int, server: ServerConfig
) -> None:
    """APIError 400 when one request asks for too many completions or tokens."""
    completions = num_prompts * params.n
    if completions > server.max_n:
        raise APIError(
            400,
            f"{completions} completions asked (n={params.n} x {num_prompts} prompts); at most "
            f"{server.max_n} per request (server.max_n)",
            param="n",
            code="too_many_completions",
        )
    per_completion = params.max_tokens or max_model_len
    if completions * per_completion > server.max_n_tokens:
        each = "max_tokens" if params.max_tokens else "max_tokens unset: the context length"
        raise APIError(
            400,
            f"{completions} completions x {per_completion} tokens ({each}) exceed the "
            f"{server.max_n_tokens} tokens one request may generate (server.max_n_tokens)",
            param="max_tokens" if params.max_tokens else "n",
            code="too_many_tokens",
        )


class JsonGuardMiddleware:
    """Refuses JSON bodies no parser should see (see the module docstring) with 400."""

    def __init__(self, app: ASGIApp, *, server: ServerConfig) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not _parsed_as_json(scope) or _declared_too_large(scope, self.server.max_body_bytes):
            await self.app(scope, receive, send)
            return
        messages, body = await _read_body(receive, self.server.max_body_bytes)
        problem = None
        if body is not None:
            problem = await self._problem(_json_part(scope, body))
        if problem is not None:
            error = APIError(400, problem, code="invalid_body")
            response = JSONResponse(error.body(scope["path"]), status_code=400)
            await response(scope, receive, send)
            return

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _problem(self, body: bytes) -> str | None:
        args = (body, self.server.max_json_depth, self.server.max_json_elements)
        if len(body) <= _INLINE_CHECK_BYTES:
            return json_body_problem(*args)
        return await anyio.to_thread.run_sync(json_body_problem, *args)


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value)
    return None


def _parsed_as_json(scope: Scope) -> bool:
    if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
        return False
    content_type = (_header(scope, b"content-type") or b"").lower()
    return not content_type.startswith(_FORMS)


def _declared_too_large(scope: Scope, limit: int) -> bool:
    length = _header(scope, b"content-length")
    return length is not None and (not length.isdigit() or int(length) > limit)


async def _read_body(receive: Receive, limit: int) -> tuple[list[Message], bytes | None]:
    """(the messages read, to replay; the whole body, or None when it grew past `limit`)."""
    messages: list[Message] = []
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages, None
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > limit:
            return messages, None
        if not message.get("more_body", False):
            return messages, b"".join(chunks)


def _json_part(scope: Scope, body: bytes) -> bytes:
    """The part of the body that is JSON: all of it, or the header of a KServe binary body."""
    header = _header(scope, b"inference-header-content-length")
    if header is None:
        return body
    return body[: int(header)] if header.isdigit() else b""
