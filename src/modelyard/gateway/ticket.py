"""`Ticket`: one HTTP request's state along the request path (gateway/request_path.py).

The gateway middleware makes one per request and puts it in the scope under TICKET_SCOPE_KEY:
who is calling and under which quota (`identity`), what the request used (`usage`, which the
access log reads too). The path fills in the routing decision, and `admit` charges the quota
once; `close` records usage and settles the quota once. At the start of the response the
middleware adds `response_headers()`: X-RateLimit-* from the quota answer and
x-modelyard-route from the routing decision.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from modelyard.gateway.auth import Identity
from modelyard.gateway.base import RequestUsage, RouteDecision
from modelyard.gateway.errors import GatewayError, unavailable
from modelyard.gateway.gateway import Gateway
from modelyard.gateway.ratelimit import Charge, LimitDecision, StoreUnavailable, token_cost
from modelyard.observability.metrics import RATE_LIMIT_STORE_ERRORS

log = logging.getLogger("modelyard.gateway")

TICKET_SCOPE_KEY = "modelyard.ticket"
ROUTE_HEADER = "x-modelyard-route"


@dataclass(eq=False)
class Ticket:
    """One request: identity, charge, routing decision and usage."""

    gateway: Gateway  # limit store, usage tracker, fail policy
    identity: Identity  # principal + quota
    usage: RequestUsage  # what the request used (also under USAGE_SCOPE_KEY)
    route: RouteDecision | None = None  # set by the request path (x-modelyard-route)
    limits: LimitDecision | None = None  # the store's answer (X-RateLimit-*)
    charge: Charge | None = None  # what the store debited; None: nothing to settle
    open_path: bool = False  # a path in gateway.open_paths: nothing is charged or counted
    admitted: bool = False  # admit() ran and let the request in
    closed: bool = False  # close() ran

    @property
    def tenant(self) -> str:
        return self.identity.principal.tenant

    def response_headers(self) -> list[tuple[str, str]]:
        headers = self.limits.headers() if self.limits is not None else []
        if self.route is not None:
            headers.append((ROUTE_HEADER, self.route.header))
        return headers

    async def admit(self, *, tokens: int = 0, items: int = 0) -> None:
        """Charge one request, one slot and `tokens` / `items` (once); GatewayError 429 / 503."""
        if self.admitted or self.open_path:
            self.admitted = True
            return
        quota = self.identity.quota
        if not quota.unlimited:
            charge = Charge(tokens=tokens, items=items)
            policy = self.gateway.config.rate_limit.on_store_error
            try:
                decision = await self.gateway.limits.acquire(self.tenant, quota, charge)
            except StoreUnavailable as exc:
                RATE_LIMIT_STORE_ERRORS.labels(policy).inc()
                if policy == "closed":
                    log.error("rate-limit store unavailable, failing closed (503): %s", exc)
                    raise unavailable("rate limiter unavailable") from exc
                log.warning("rate-limit store unavailable, failing open: %s", exc)
            else:
                self.limits = decision
                if not decision.allowed:
                    self.gateway.usage.record_rejection(self.tenant, decision.refused.label)
                    limit = decision.refused.label
                    raise GatewayError(
                        429,
                        f"{limit} limit of {decision.limit} reached for tenant",
                        "rate_limit_exceeded",
                        "rate_limit_error",
                        tuple(decision.headers()),
                    )
                self.charge = charge
        self.admitted = True
        self.gateway.usage.record_request(self.tenant)

    async def close(self) -> None:
        """Record what a model served and settle the charge (token refund, slot); once."""
        if self.closed:
            return
        self.closed = True
        if self.route is not None and self.route.served is not None:
            self.gateway.usage.record_served(self.tenant, self.route.reason, self.usage)
        charge, quota = self.charge, self.identity.quota
        if charge is None:
            return
        delta = 0
        if charge.tokens:
            actual = self.usage.prompt_tokens + self.usage.completion_tokens
            delta = token_cost(quota, charge.tokens) - actual
        try:
            await self.gateway.limits.settle(self.tenant, quota, delta, release=True)
        except StoreUnavailable as exc:
            RATE_LIMIT_STORE_ERRORS.labels(self.gateway.config.rate_limit.on_store_error).inc()
            log.warning("rate-limit store unavailable while settling usage: %s", exc)
