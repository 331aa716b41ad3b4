"""HTTP metrics as pure ASGI middleware.

`MetricsMiddleware` counts every HTTP request in `HTTP_REQUESTS{route, method, status, tenant}`
and observes `HTTP_REQUEST_DURATION{route, method}` (time until the response body ended).

- `route` is the route *template* (`/v2/models/{model_name}/infer`), read from `scope["route"]`
  which Starlette's router sets while dispatching; requests no route matched are labelled
  `UNMATCHED_ROUTE` so random paths cannot blow up label cardinality.
- `tenant` comes from the `Principal` the auth middleware puts under `PRINCIPAL_SCOPE_KEY`
  (`"anonymous"` when there is none, e.g. auth off or rejected before auth ran).
- `status` is the status of `http.response.start`; a request whose app raised before starting
  a response is counted as 500. A client that disconnects before the response started is
  counted with status `499` (nginx's "client closed request").
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from modelyard.gateway.base import PRINCIPAL_SCOPE_KEY
from modelyard.observability.metrics import HTTP_REQUEST_DURATION, HTTP_REQUESTS

UNMATCHED_ROUTE = "<unmatched>"
CLIENT_CLOSED_STATUS = 499


def route_template(scope: Scope) -> str:
    """The matched route's path template, or UNMATCHED_ROUTE."""
    route: Any = scope.get("route")
    path = getattr(route, "path", None)
    if isinstance(path, str) and path:
        return path
    return UNMATCHED_ROUTE


def tenant_of(scope: Scope) -> str:
    """The tenant of the request's Principal, "anonymous" when auth put none in the scope."""
    principal: Any = scope.get(PRINCIPAL_SCOPE_KEY)
    tenant = getattr(principal, "tenant", None)
    return tenant if isinstance(tenant, str) and tenant else "anonymous"


class MetricsMiddleware:
    """Counts and times HTTP requests (see the module docstring for the labels)."""

    def __init__(self, app: ASGIApp, *, exclude_paths: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.exclude_paths = exclude_paths  # raw paths not measured (e.g. {"/metrics"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in self.exclude_paths:
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status: int | None = None

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        except BaseException as exc:
            if status is None:
                status = CLIENT_CLOSED_STATUS if _is_cancellation(exc) else 500
            raise
        finally:
            self._record(scope, status, time.perf_counter() - start)

    @staticmethod
    def _record(scope: Scope, status: int | None, duration: float) -> None:
        route = route_template(scope)
        method = str(scope.get("method", "GET"))
        code = str(status if status is not None else CLIENT_CLOSED_STATUS)
        HTTP_REQUESTS.labels(route=route, method=method, status=code, tenant=tenant_of(scope)).inc()
        HTTP_REQUEST_DURATION.labels(route=route, method=method).observe(duration)


def _is_cancellation(exc: BaseException) -> bool:
    return isinstance(exc, asyncio.CancelledError)
