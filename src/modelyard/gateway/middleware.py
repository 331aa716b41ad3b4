"""The gateway as two pure ASGI middlewares: auth, then quota. Assembled by one function.

Per HTTP request (paths in `open_paths`, or under one of its entries that ends in `*`, skip
both and get the anonymous principal):
1. `AuthMiddleware`: for a POST with a JSON body up to `max_body_bytes`, read the body once
   (replayed unchanged to the app) to learn the model name and `max_tokens`; authenticate
   (401); check the model against the principal's allow-list (403; 413 when a larger body hides
   the model from a tenant with an allow-list); put the `Principal` in
   `scope[PRINCIPAL_SCOPE_KEY]` and a `GatewayRequest` in `scope[GATEWAY_REQUEST_KEY]`. With
   auth off, a Principal already in the scope (set by a trusted outer layer) is kept.
2. `QuotaMiddleware`: create (or reuse) `scope[USAGE_SCOPE_KEY]` with the token estimate;
   ask the limit store (429 with Retry-After and X-RateLimit-*; store down: fail open, or
   503 when closed); run the app, adding the X-RateLimit-* headers to its response; when the
   response ends, settle the real token count (estimate refunded or topped up) and free the
   concurrency slot.
"""

from __future__ import annotations

import json
import logging
import math
import re
from dataclasses import dataclass
from typing import Any

from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from modelyard.gateway.base import ANONYMOUS, PRINCIPAL_SCOPE_KEY, USAGE_SCOPE_KEY, RequestUsage
from modelyard.gateway.config import GatewayConfig, Quota
from modelyard.gateway.errors import GatewayError, forbidden, send_error, unavailable
from modelyard.gateway.gateway import Gateway, build_gateway
from modelyard.gateway.ratelimit import LimitDecision, StoreUnavailable, token_cost
from modelyard.observability.metrics import RATE_LIMIT_STORE_ERRORS

log = logging.getLogger("modelyard.gateway")

GATEWAY_REQUEST_KEY = "modelyard.gateway.request"  # GatewayRequest, set by AuthMiddleware
GATEWAY_KEY = "modelyard.gateway"  # the Gateway itself (the admin routes read its usage)
_V2_MODEL_PATH = re.compile(r"^/v2/models/([^/]+)")


@dataclass(frozen=True, slots=True)
class GatewayRequest:
    """What the auth middleware learned, for the quota middleware."""

    quota: Quota  # the caller's limits
    model: str | None  # requested model name (JSON `model` or /v2/models/{name}); None: unknown
    estimated_tokens: int  # prompt estimate (body bytes / chars per token) + max_tokens


def _replaying(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay


TOO_LARGE = object()  # a JSON body over max_body_bytes: not read, the model is unknown


async def _peek_json(scope: Scope, receive: Receive, limit: int) -> tuple[Any, int, Receive]:
    """(parsed JSON, None or TOO_LARGE; body bytes; a receive that replays what was read)."""
    headers = dict(scope["headers"])
    content_type = headers.get(b"content-type", b"").decode("latin-1").lower()
    declared = headers.get(b"content-length", b"0")
    size = int(declared) if declared.isdigit() else 0
    if scope["method"] != "POST" or "json" not in content_type:
        return None, size, receive
    if size > limit:
        return TOO_LARGE, size, receive
    messages: list[Message] = []
    chunks: list[bytes] = []
    size = 0  # counted from the bytes received from here on
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > limit:
            return TOO_LARGE, size, _replaying(messages, receive)
        if not message.get("more_body", False):
            break
    try:
        parsed = json.loads(b"".join(chunks)) if size else None
    except ValueError:
        parsed = None  # the handler answers malformed JSON in its own envelope
    return parsed, size, _replaying(messages, receive)


class AuthMiddleware:
    """Authenticates, checks the model allow-list, and marks the request for the quota step."""

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
        is_open = self._is_open(str(scope.get("path", "")))
        if scope["type"] == "websocket" and not is_open:
            await self._websocket(scope, receive, send)
            return
        if scope["type"] != "http" or is_open:
            scope.setdefault(PRINCIPAL_SCOPE_KEY, ANONYMOUS)
            await self.app(scope, receive, send)
            return
        scope[GATEWAY_KEY] = self.gateway
        body, size, receive = await _peek_json(scope, receive, self.gateway.config.max_body_bytes)
        try:
            identity = await self.gateway.authenticator.authenticate(dict(scope["headers"]))
            model = self._model_name(scope, body)
            restricted = identity.principal.allowed_models is not None
            if model is None and body is TOO_LARGE and restricted:
                raise GatewayError(
                    413,
                    "body too large to check the model",
                    "body_too_large",
                    "invalid_request_error",
                )
            if model is not None and not identity.principal.may_use(model):
                self.gateway.usage.record_rejection(identity.principal.tenant, "model")
                raise forbidden(f"tenant may not use model {model!r}", code="model_not_allowed")
        except GatewayError as error:
            await send_error(scope, send, error)
            return
        principal = identity.principal
        if not self.gateway.authenticator.enabled:  # keep what a trusted outer layer set
            principal = scope.get(PRINCIPAL_SCOPE_KEY) or principal
        scope[PRINCIPAL_SCOPE_KEY] = principal
        estimate = self._estimate(body, size)
        scope[GATEWAY_REQUEST_KEY] = GatewayRequest(identity.quota, model, estimate)
        await self.app(scope, receive, send)

    def _is_open(self, path: str) -> bool:
        """In open_paths, or under one of its prefixes (entries ending in "*")."""
        return path in self.open_paths or path.startswith(self.open_prefixes)

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

    @staticmethod
    def _model_name(scope: Scope, body: Any) -> str | None:
        if isinstance(body, dict) and isinstance(body.get("model"), str):
            return str(body["model"])
        match = _V2_MODEL_PATH.match(scope["path"])
        return match.group(1) if match else None

    def _estimate(self, body: Any, size: int) -> int:
        config = self.gateway.config.rate_limit
        prompt = math.ceil(size / config.chars_per_token)
        if not isinstance(body, dict):
            return prompt
        completion = body.get("max_completion_tokens", body.get("max_tokens"))
        if not isinstance(completion, int) or completion < 0:
            generates = "messages" in body or "prompt" in body
            completion = config.default_max_tokens if generates else 0
        return prompt + completion


class QuotaMiddleware:
    """Enforces rpm / tpm / concurrency for the principal's tenant and settles real usage."""

    def __init__(self, app: ASGIApp, *, gateway: Gateway) -> None:
        self.app = app
        self.gateway = gateway

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request: GatewayRequest | None = scope.get(GATEWAY_REQUEST_KEY)
        if scope["type"] != "http" or request is None:
            await self.app(scope, receive, send)
            return
        tenant = scope[PRINCIPAL_SCOPE_KEY].tenant
        usage = scope.get(USAGE_SCOPE_KEY)
        if not isinstance(usage, RequestUsage):
            usage = scope[USAGE_SCOPE_KEY] = RequestUsage(model=request.model)
        usage.estimated_tokens = request.estimated_tokens
        admitted, decision = await self._admit(scope, send, tenant, request)
        if not admitted:
            return
        self.gateway.usage.record_request(tenant)
        settle = _Settlement(self.gateway, tenant, request, usage, charged=decision is not None)
        extra = [(k.encode(), v.encode()) for k, v in decision.headers()] if decision else []

        async def send_wrapper(message: Message) -> None:
            if message["type"] == "http.response.start" and extra:
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            final_body = message["type"] == "http.response.body" and not message.get("more_body")
            if final_body and (usage.prompt_tokens or usage.completion_tokens):
                await settle.run()  # before the client sees the end: the next request is exact
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            await settle.run()

    async def _admit(
        self, scope: Scope, send: Send, tenant: str, request: GatewayRequest
    ) -> tuple[bool, LimitDecision | None]:
        """(admitted, the store's decision: None when no limits apply or the store failed open).

        Not admitted: the error response has been sent.
        """
        if request.quota.unlimited:
            return True, None
        policy = self.gateway.config.rate_limit.on_store_error
        try:
            decision = await self.gateway.limits.acquire(
                tenant, request.quota, request.estimated_tokens
            )
        except StoreUnavailable as exc:
            RATE_LIMIT_STORE_ERRORS.labels(policy).inc()
            if policy == "open":
                log.warning("rate-limit store unavailable, failing open: %s", exc)
                return True, None
            log.error("rate-limit store unavailable, failing closed (503): %s", exc)
            await send_error(scope, send, unavailable("rate limiter unavailable"))
            return False, None
        if not decision.allowed:
            self.gateway.usage.record_rejection(tenant, decision.refused.label)
            message = f"{decision.refused.label} limit of {decision.limit} reached for tenant"
            error = GatewayError(429, message, "rate_limit_exceeded", "rate_limit_error")
            await send_error(scope, send, error, decision.headers())
            return False, decision
        return True, decision


class _Settlement:
    """Settles one request exactly once: usage totals, token refund/charge, concurrency slot."""

    def __init__(
        self,
        gateway: Gateway,
        tenant: str,
        request: GatewayRequest,
        usage: RequestUsage,
        *,
        charged: bool,
    ) -> None:
        self.gateway, self.tenant, self.request, self.usage = gateway, tenant, request, usage
        self.charged = charged
        self.done = False

    async def run(self) -> None:
        if self.done:
            return
        self.done = True
        usage = self.usage
        self.gateway.usage.record_tokens(self.tenant, usage.prompt_tokens, usage.completion_tokens)
        if not self.charged:
            return
        actual = usage.prompt_tokens + usage.completion_tokens
        quota = self.request.quota
        delta = token_cost(quota, usage.estimated_tokens) - actual
        try:
            await self.gateway.limits.settle(self.tenant, quota, delta, release=True)
        except StoreUnavailable as exc:
            RATE_LIMIT_STORE_ERRORS.labels(self.gateway.config.rate_limit.on_store_error).inc()
            log.warning("rate-limit store unavailable while settling usage: %s", exc)


def build_gateway_middleware(
    config: GatewayConfig, *, gateway: Gateway | None = None, **components: Any
) -> list[Middleware]:
    """The gateway's middlewares, outermost first, for `build_middleware_stack`'s gateway slot.

    Pass a prebuilt `gateway` to share it (e.g. with tests); otherwise `components` go to
    `build_gateway` (key_store, limits, jwt, usage).
    """
    gw = gateway or build_gateway(config, **components)
    return [Middleware(AuthMiddleware, gateway=gw), Middleware(QuotaMiddleware, gateway=gw)]
