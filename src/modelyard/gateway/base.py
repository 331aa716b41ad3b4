"""Contracts between the gateway and the route handlers.

The auth middleware puts a `Principal` into the ASGI scope under PRINCIPAL_SCOPE_KEY (the
anonymous one, which may do everything, when auth is off or the path is open). The request path
(gateway/request_path.py) fills the `RequestUsage` found under USAGE_SCOPE_KEY (the access log
reads it) and settles quotas with it. Handlers never resolve or lease a model themselves.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import quote

from modelyard.gateway.config import ADMIN_SCOPE, INFER_SCOPE

PRINCIPAL_SCOPE_KEY = "modelyard.principal"
USAGE_SCOPE_KEY = "modelyard.usage"

ALL_SCOPES = frozenset({INFER_SCOPE, ADMIN_SCOPE})


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling, after authentication."""

    tenant: str  # tenant id; "anonymous" when auth is off
    key_id: str | None = None  # API key id (never the key) or JWT subject, for logs and metrics
    priority: int = 0  # scheduler priority class for this tenant's LLM requests (higher first)
    # names of the models and routes it may use (any of their names: gateway/model_names.py);
    # None: every model
    allowed_models: frozenset[str] | None = None
    scopes: frozenset[str] = frozenset({INFER_SCOPE})  # infer; admin for model control

    @property
    def is_admin(self) -> bool:
        return ADMIN_SCOPE in self.scopes


ANONYMOUS = Principal(tenant="anonymous", scopes=ALL_SCOPES)  # auth off, or an open path


@dataclass(slots=True)
class RequestUsage:
    """What one request used; filled by the request path, read by quotas and the access log."""

    model: str | None = None  # the model id that served the request
    prompt_tokens: int = 0  # generation: real prompt tokens
    completion_tokens: int = 0  # generation: real completion tokens
    items: int = 0  # other models: inputs served (a batch of 64 texts is 64)
    input_bytes: int = 0  # request body bytes
    estimated_tokens: int = 0  # what the limiter pre-charged (prompt estimate + max_tokens)


@dataclass(frozen=True, slots=True)
class RouteDecision:
    """Where a request for `requested` goes: the first target, then fallbacks in order."""

    requested: str  # the name the client sent (a model id, name or alias)
    targets: list[str] = field(default_factory=list)  # model ids: primary first, then fallbacks
    reason: str = "direct"  # direct | alias | canary | tenant-override | fallback
    served: str | None = None  # the target that served (set by the request path); None: none

    @property
    def header(self) -> str:
        """Value of the x-modelyard-route response header: `requested->served;policy`, the
        requested name percent-encoded (a client's name may hold any character; a header
        only visible ASCII)."""
        requested = quote(self.requested, safe="-._~:/@+!*'()")
        return f"{requested}->{self.served or '-'};{self.reason}"


class ModelRouter(Protocol):
    def route(self, requested: str, principal: Principal) -> RouteDecision: ...

    def report_failure(self, model_id: str) -> None:
        """A target was overloaded or failing; the router may rank it last for a while."""
        ...

    def resolve(self, name: str) -> str | None:
        """The route a route name or alias belongs to (its public name); None: not a route."""
        ...

    def route_names(self) -> list[str]:
        """The public names of the routes (for model listings)."""
        ...


class IdentityRouter:
    """No routing configured: the requested name goes to the manager as it is."""

    def route(self, requested: str, principal: Principal) -> RouteDecision:
        return RouteDecision(requested=requested, targets=[requested], reason="direct")

    def report_failure(self, model_id: str) -> None:
        """Nothing to rank: the identity router has one target."""

    def resolve(self, name: str) -> str | None:
        return None

    def route_names(self) -> list[str]:
        return []
