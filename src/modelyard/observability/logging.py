"""Structured logs: JSON lines for machines, readable text on a terminal, and an access log.

`configure_logging(json=None)` sets up the root logger once: JSON lines when stderr is not a
TTY (containers, files, CI), aligned text when it is; `json=True/False` forces either.
Structured fields travel in `extra={"fields": {...}}` and become top-level JSON keys.

`AccessLogMiddleware` (pure ASGI) writes one line per HTTP request on the `modelyard.access`
logger with: request id (observability/request_id.py), method, path, route, status, tenant,
model, latency in ms.
Prompt text is never logged unless `log_bodies=True` (then the first `max_body_bytes` bytes of
the request body are).
"""

from __future__ import annotations

import json as jsonlib
import logging
import sys
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from modelyard.gateway.base import USAGE_SCOPE_KEY
from modelyard.observability.http import route_template, tenant_of
from modelyard.observability.request_id import request_id_of

ACCESS_LOGGER = "modelyard.access"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, then the record's structured fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return jsonlib.dumps(entry, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """`HH:MM:SS level logger msg key=value ...` for people reading a terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s %(message)s", "%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict) and fields:
            line += " " + " ".join(f"{k}={v}" for k, v in fields.items() if v is not None)
        return line


def configure_logging(json: bool | None = None, level: int | str = logging.INFO) -> None:
    """Install one stderr handler on the root logger (replacing handlers we installed before).

    json=None picks JSON when stderr is not a TTY, text when it is.
    """
    use_json = (not sys.stderr.isatty()) if json is None else json
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if use_json else TextFormatter())
    handler.set_name("modelyard")
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == "modelyard"]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)


class AccessLogMiddleware:
    """One structured log line per HTTP request (see the module docstring)."""

    def __init__(
        self, app: ASGIApp, *, log_bodies: bool = False, max_body_bytes: int = 2048
    ) -> None:
        self.app = app
        self.log_bodies = log_bodies  # log the start of request bodies (prompts!): off by default
        self.max_body_bytes = max_body_bytes  # how much of a body to log when log_bodies
        self.logger = logging.getLogger(ACCESS_LOGGER)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500
        body = bytearray()

        async def receive_wrapper() -> Message:
            message = await receive()
            if message["type"] == "http.request" and len(body) < self.max_body_bytes:
                body.extend(message.get("body", b"")[: self.max_body_bytes - len(body)])
            return message

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive_wrapper if self.log_bodies else receive, send_wrapper)
        finally:
            fields = self._fields(scope, status, time.perf_counter() - start)
            if self.log_bodies:
                fields["body"] = body.decode("utf-8", errors="replace")
            self.logger.info(
                "%s %s %d", scope.get("method"), scope.get("path"), status, extra={"fields": fields}
            )

    @staticmethod
    def _fields(scope: Scope, status: int, duration: float) -> dict[str, Any]:
        usage: Any = scope.get(USAGE_SCOPE_KEY)
        return {
            "request_id": request_id_of(scope),
            "method": scope.get("method"),
            "path": scope.get("path"),
            "route": route_template(scope),
            "status": status,
            "tenant": tenant_of(scope),
            "model": getattr(usage, "model", None),
            "latency_ms": round(duration * 1000.0, 3),
        }
