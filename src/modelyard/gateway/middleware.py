"""The gateway's edge: one pure ASGI middleware that authenticates every request.

Per HTTP request:
1. paths in `open_paths` (or under an entry ending in `*`, a prefix) get the anonymous
   principal and no quota; any other path authenticates (401; 403 for an unknown JWT tenant;
   503 when the key store or the JWKS cannot answer). With auth off, a Principal already in
   the scope (set by a trusted outer layer) is kept.
2. the `Principal` goes into `scope[PRINCIPAL_SCOPE_KEY]`, a `RequestUsage` into
   `scope[USAGE_SCOPE_KEY]` and a `Ticket` (identity, quota, usage) into
   `scope[TICKET_SCOPE_KEY]`; the request path (gateway/request_path.py) authorizes, routes,
   admits and records on it. Nothing here reads the body: the model a request asks for is the
   route's business.
3. the response start gets the ticket's headers (X-RateLimit-*, x-modelyard-route);
4. when the app returns, the ticket is closed (usage recorded, quota settled) if the path did not
   close it already.
WebSockets authenticate the same way; a refusal closes with 1008.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from modelyard.gateway.auth import Identity
from modelyard.gateway.base import ANONYMOUS, PRINCIPAL_SCOPE_KEY, USAGE_SCOPE_KEY, RequestUsage
from modelyard.gateway.config import GatewayConfig, Quota
from modelyard.gateway.errors import GatewayError, send_error
from modelyard.gateway.gateway import Gateway, build_gateway
from modelyard.gateway.ticket import TICKET_SCOPE_KEY, Ticket

log = logging.getLogger("modelyard.gateway")

GATEWAY_KEY = "modelyard.gateway"  # the Gateway itself (the admin routes read its usage)


class AuthMiddleware:
    """Authenticates, puts principal, usage and ticket in the scope, adds the ticket's headers."""

    def __init__(self, app: ASGIApp, *, gateway: Gateway) -> None:
        self.app = app
        self.gateway = gateway
        paths = gateway.config.open_paths
        self.open_paths = frozenset(p for p in paths if not p.endswith("*"))
        self.open_prefixes = tuple(p[:-1] for p in paths if p.endswith("*"))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, self._closing_on_shutdown(send))
            return
        if scope["type"] == "websocket" and not self._is_open(scope["path"]):
            await self._websocket(scope, receive, send)
            return
        if scope["type"] != "http":
            scope.setdefault(PRINCIPAL_SCOPE_KEY, ANONYMOUS)
            await self.app(scope, receive, send)
            return
        scope[GATEWAY_KEY] = self.gateway
        try:
            identity = await self._identity(scope)
        except GatewayError as error:
            await send_error(scope, send, error)
            return
        scope[PRINCIPAL_SCOPE_KEY] = identity.principal
        usage = scope.get(USAGE_SCOPE_KEY)
        if not isinstance(usage, RequestUsage):
            usage = scope[USAGE_SCOPE_KEY] = RequestUsage()
        open_path = self._is_open(scope["path"])
        ticket = Ticket(self.gateway, identity, usage, open_path=open_path)
        scope[TICKET_SCOPE_KEY] = ticket

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = _with_headers(message, ticket.response_headers())
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            await ticket.close()

    def _is_open(self, path: str) -> bool:
        """In open_paths, or under one of its prefixes (entries ending in "*")."""
        return path in self.open_paths or path.startswith(self.open_prefixes)

    async def _identity(self, scope: Scope) -> Identity:
        if self._is_open(scope["path"]):
            return Identity(scope.setdefault(PRINCIPAL_SCOPE_KEY, ANONYMOUS), Quota())
        identity = await self.gateway.authenticator.authenticate(dict(scope["headers"]))
        outer = scope.get(PRINCIPAL_SCOPE_KEY)
        if not self.gateway.authenticator.enabled and outer is not None:
            return Identity(outer, identity.quota)  # set by a trusted outer layer
        return identity

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """WebSockets authenticate like HTTP; a refusal closes with 1008 (policy violation)."""
        try:
            identity = await self.gateway.authenticator.authenticate(dict(scope["headers"]))
        except GatewayError:
            await send({"type": "websocket.close", "code": 1008})
            return
        scope[PRINCIPAL_SCOPE_KEY] = identity.principal
        await self.app(scope, receive, send)

    def _closing_on_shutdown(self, send: Send) -> Send:
        async def wrapped(message: Message) -> None:
            if message["type"] == "lifespan.shutdown.complete":
                await self.gateway.close()
            await send(message)

        return wrapped


def _with_headers(message: Message, extra: list[tuple[str, str]]) -> Message:
    """The response start with `extra` headers replacing any of the same names."""
    if not extra:
        return message
    names = {name.encode() for name, _ in extra}
    headers = [(k, v) for k, v in message.get("headers", []) if k.lower() not in names]
    headers += [(k.encode(), v.encode("latin-1")) for k, v in extra]
    return {**message, "headers": headers}


def build_gateway_middleware(
    config: GatewayConfig, *, gateway: Gateway | None = None, **components: Any
) -> list[Middleware]:
    """The gateway's middleware for `build_middleware_stack`'s gateway slot.

    Pass a prebuilt `gateway` to share it (with the request path, with tests); otherwise
    `components` go to `build_gateway` (key_store, limits, jwt, usage).
    """
    gw = gateway or build_gateway(config, **components)
    return [Middleware(AuthMiddleware, gateway=gw)]
