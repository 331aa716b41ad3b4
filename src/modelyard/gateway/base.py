"""Contracts between the gateway middleware and the route handlers.

The auth middleware puts a `Principal` into the ASGI scope under PRINCIPAL_SCOPE_KEY (anonymous
when auth is off). Route handlers fill the `RequestUsage` found under USAGE_SCOPE_KEY with the
real token counts when a request ends; the rate-limit middleware charges tokens-per-minute with
them after the response. Handlers resolve the model through a `ModelRouter` before leasing it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

PRINCIPAL_SCOPE_KEY = "modelyard.principal"
USAGE_SCOPE_KEY = "modelyard.usage"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling, after authentication."""

    tenant: str  # tenant id; "anonymous" when auth is off
    key_id: str | None = None  # API key id (never the key) or JWT subject, for logs and metrics
    priority: int = 0  # scheduler priority class for this tenant's LLM requests (higher first)
    allowed_models: frozenset[str] | None = None  # None: every model
    is_admin: bool = False  # may call admin endpoints

    def may_use(self, model: str) -> bool:
        return self.allowed_models is None or model in self.allowed_models


ANONYMOUS = Principal(tenant="anonymous")


@dataclass(slots=True)
class RequestUsage:
    """Filled by route handlers; read by the rate limiter and the access log after the response."""

    model: str | None = None  # the model id that served the request
    prompt_tokens: int = 0
    completion_tokens: int = 0
    estimated_tokens: int = 0  # what the limiter pre-charged (prompt estimate + max_tokens)


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """Where a request for `requested` goes: the first target, then fallbacks in order."""

    requested: str  # the name the client sent (a model id, name or alias)
    targets: list[str] = field(default_factory=list)  # model ids: primary first, then fallbacks
    reason: str = "direct"  # direct | alias | canary | tenant-override | fallback

    @property
    def header(self) -> str:
        """Value of the x-modelyard-route response header."""
        return f"{self.requested}->{self.targets[0] if self.targets else '?'};{self.reason}"


class ModelRouter(Protocol):
    def route(self, requested: str, principal: Principal) -> RouteDecision: ...

    def report_failure(self, model_id: str) -> None:
        """A target was overloaded or failing; the router may rank it last for a while."""
        ...


class IdentityRouter:
    """No routing configured: the requested name goes to the manager as it is."""

    def route(self, requested: str, principal: Principal) -> RouteDecision:
        return RouteDecision(requested=requested, targets=[requested], reason="direct")

    def report_failure(self, model_id: str) -> None:
        """Nothing to rank: the identity router has one target."""
