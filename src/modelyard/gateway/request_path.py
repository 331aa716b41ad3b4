"""The one request path of every route that runs a model.

The model routes (/v1/chat/completions, /v1/completions, /v1/responses, /v1/embeddings,
/basic_generate, /generate, /generate_stream, /predict, /v2/models/{name}[/versions/{v}]/infer)
describe their request as a `Demand` and call `RequestPath.open_llm` or `RequestPath.predict`;
no route resolves, authorizes or leases a model itself. In order:

1. **authenticate** (at the edge, for every path but the open ones: gateway/middleware.py):
   credentials -> `Identity` (principal + quota) -> 401 without valid ones. It puts a `Ticket`
   in the scope: the request's state along the path. Auth off: the anonymous principal, which
   may use every model and holds every scope.
2. **tenant**: `principal.tenant`; quotas, routing overrides and usage all hang on it.
3. **authorize**: the requested name must mean a model (a route, or a catalog id: every id,
   name and alias of it) that an entry of the principal's allow-list means
   (gateway/model_names.py) -> else 403 `model_not_allowed`, counted as a `model` rejection.
4. **route**: `router.route(requested, principal)` -> targets in order (the canary draw for
   every caller, then the tenant override, then the stable target and the fallbacks).
5. **admit**: one atomic call to the limit store: 1 request (rpm), 1 concurrency slot, and the
   token estimate (tpm, generation) or the inputs (ipm, other models) -> 429 with Retry-After
   and X-RateLimit-*; a store that does not answer fails open, or closed with 503.
6. **lease**: each target in order: its kind must be one the route serves (else 400, no
   fallback); `start(lease)` runs on the provider's `Lease` (its `llm` or `predictor`). A
   model that fails to load, is unavailable or unknown, or whose engine is overloaded or dead,
   sends the request to the next target (reported to the router); the last error answers.
7. **record usage**: `x-modelyard-route: requested->served;policy` on the response (policy
   `fallback` when a later target served); per tenant and serving model the requests, tokens
   (generation), inputs and bytes (other models): /admin/usage and the tenant_* metrics.
8. **release**: `Served.aclose()` returns the lease; the ticket then refunds the token estimate
   minus the real count and frees the concurrency slot, once (the middleware closes the ticket
   too, whatever happened).

Routes that run no model pay one request and one slot at the door: `admit_request`, an app-wide
dependency that steps aside for endpoints marked `@runs_model`. Model control, /admin/* and
/metrics depend on `require_admin`.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
from collections.abc import Awaitable, Callable, Iterable
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from starlette.requests import Request

from modelyard.engine.client.protocol import EngineDeadError, EngineOverloadedError
from modelyard.gateway.base import PRINCIPAL_SCOPE_KEY, ModelRouter, Principal, RouteDecision
from modelyard.gateway.config import RateLimitConfig
from modelyard.gateway.errors import GatewayError, forbidden
from modelyard.gateway.model_names import ModelNames
from modelyard.gateway.ticket import TICKET_SCOPE_KEY, Ticket
from modelyard.manager.base import (
    Lease,
    ModelLoadError,
    ModelNotFoundError,
    ModelProvider,
    ModelUnavailableError,
)
from modelyard.model_spec import ModelKind

log = logging.getLogger("modelyard.gateway")

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

#: Errors that send a request to the next target: nothing has been sent to the client yet.
FALLBACK_ERRORS = (
    ModelLoadError,
    ModelUnavailableError,
    ModelNotFoundError,
    EngineOverloadedError,
    EngineDeadError,
)
_MODEL_ROUTE_MARK = "__modelyard_runs_model__"
LLM_KINDS = frozenset(k for k in ModelKind if k.is_llm)
PREDICTOR_KINDS = frozenset(k for k in ModelKind if not k.is_llm)


class Work(enum.Enum):
    """What a model route asks for: what it is charged with and which lease it gets."""

    GENERATION = "generation"  # an LLM: tokens (tpm), lease.llm
    INFERENCE = "inference"  # another model: inputs (ipm), lease.predictor


@dataclass(frozen=True, slots=True)
class Demand:
    """One model request as the path sees it."""

    work: Work
    kinds: frozenset[ModelKind]  # kinds that can serve it; another kind is a 400
    serves: str  # what the route serves, for that 400 ("embedding models")
    tokens: int = 0  # generation: prompt estimate + max new tokens (tpm pre-charge)
    items: int = 0  # inference: inputs in the request (ipm; a batch of 64 is 64)
    input_bytes: int = 0  # request body bytes (usage)

    @classmethod
    def generation(
        cls, rate: RateLimitConfig, *, body_bytes: int, max_tokens: int | None, sequences: int
    ) -> Demand:
        """A generation of `sequences` completions (prompts x n) of up to `max_tokens` each
        (None: `rate.default_max_tokens`); its tpm estimate is the body bytes over
        `rate.chars_per_token` plus the new tokens it may make."""
        new_tokens = (max_tokens or rate.default_max_tokens) * max(1, sequences)
        tokens = math.ceil(body_bytes / rate.chars_per_token) + new_tokens
        return cls(Work.GENERATION, LLM_KINDS, "text-generation models", tokens, 0, body_bytes)

    @classmethod
    def inference(
        cls,
        *,
        items: int,
        input_bytes: int,
        kinds: Iterable[ModelKind] = PREDICTOR_KINDS,
        serves: str = "non-LLM models (LLMs: use the /v1 generation routes)",
    ) -> Demand:
        return cls(Work.INFERENCE, frozenset(kinds), serves, 0, items, input_bytes)


@dataclass(eq=False)
class Served(Generic[T]):
    """A model request that a target accepted; `aclose()` it exactly when it ends."""

    value: T  # what `start(lease)` returned (engine streams, predictions)
    lease: Lease  # the model that serves it
    ticket: Ticket  # the request's quota and usage state
    deadline: float  # loop.time() by which the whole request must be done
    _stack: AsyncExitStack  # holds the provider's lease
    _closed: bool = False

    @property
    def model_id(self) -> str:
        return self.lease.model_id

    @property
    def decision(self) -> RouteDecision:
        decision = self.ticket.route
        if decision is None:  # pragma: no cover - set before a Served exists
            raise RuntimeError("served without a route decision")
        return decision

    def record_tokens(self, prompt: int, completion: int) -> None:
        """Generation: the real token counts (settled against the estimate at release)."""
        self.ticket.usage.prompt_tokens += prompt
        self.ticket.usage.completion_tokens += completion

    async def aclose(self) -> None:
        """Release the lease, record usage, settle quotas (once)."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._stack.aclose()
        finally:
            await self.ticket.close()


class RequestPath:
    """Steps 3-8 of the module docstring over one provider and router (one per app)."""

    def __init__(self, provider: ModelProvider, router: ModelRouter, *, timeout_s: float) -> None:
        self.provider = provider
        self.router = router
        self.timeout_s = timeout_s  # lease + start must finish within it (server timeout)
        self.names = ModelNames(router, provider.spec)  # what a name means (allow-lists)

    async def open_llm(
        self,
        request: Request,
        requested: str,
        demand: Demand,
        start: Callable[[Lease], Awaitable[T]],
    ) -> Served[T]:
        """A generation: `start` submits the prompts (to `lease.llm`) and reads their first
        outputs."""
        return await self._open(request, requested, demand, start)

    async def predict(
        self,
        request: Request,
        requested: str,
        demand: Demand,
        run: Callable[[Lease], Awaitable[T]],
    ) -> tuple[T, Lease]:
        """An inference, start to end: `run(lease)`'s result (from `lease.predictor`) and the
        lease that served it."""
        served = await self._open(request, requested, demand, run)
        served.ticket.usage.items = demand.items
        await served.aclose()
        return served.value, served.lease

    async def _open(
        self,
        request: Request,
        requested: str,
        demand: Demand,
        start: Callable[[Lease], Awaitable[T]],
    ) -> Served[T]:
        ticket = ticket_of(request)
        principal = ticket.identity.principal
        self.authorize(ticket, requested)
        decision = self.router.route(requested, principal)
        if not decision.targets:
            raise ModelNotFoundError(f"model {requested!r} not found")
        ticket.route = decision
        ticket.usage.estimated_tokens = demand.tokens
        ticket.usage.input_bytes = demand.input_bytes
        await ticket.admit(tokens=demand.tokens, items=demand.items)
        deadline = asyncio.get_running_loop().time() + self.timeout_s
        async with asyncio.timeout_at(deadline):
            return await self._lease_first(ticket, decision, demand, start, deadline)

    async def metadata(self, model_id: str) -> dict[str, Any]:
        """A tensor model's metadata, loading it if needed (authorize the caller first)."""
        async with self.provider.lease(model_id) as lease:
            return dict(lease.metadata)

    def authorize(self, ticket: Ticket, requested: str) -> None:
        """403 unless the name means a model the allow-list names (step 3)."""
        principal = ticket.identity.principal
        if self.names.allows(principal, requested):
            return
        ticket.gateway.usage.record_rejection(principal.tenant, "model")
        raise forbidden(
            f"model {requested!r} is not allowed for this key", "model_not_allowed", "model"
        )

    async def _lease_first(
        self,
        ticket: Ticket,
        decision: RouteDecision,
        demand: Demand,
        start: Callable[[Lease], Awaitable[T]],
        deadline: float,
    ) -> Served[T]:
        last_error: BaseException | None = None
        for target in decision.targets:
            spec = self.names.spec(target)
            if spec is not None and spec.kind not in demand.kinds:
                raise GatewayError(
                    400,
                    f"{spec.id} is a {spec.kind} model; this route serves {demand.serves}",
                    "wrong_model_kind",
                    "invalid_request_error",
                    param="model",
                )
            stack = AsyncExitStack()
            try:
                lease = await stack.enter_async_context(self.provider.lease(target))
                value = await start(lease)
            except FALLBACK_ERRORS as exc:
                await stack.aclose()
                last_error = exc
                if not isinstance(exc, ModelNotFoundError):  # client-chosen names: not kept
                    self.router.report_failure(target)
                    log.info("target %s of %r failed (%s)", target, decision.requested, exc)
                continue
            except BaseException:
                await stack.aclose()
                raise
            reason = decision.reason if target == decision.targets[0] else "fallback"
            ticket.route = replace(decision, served=lease.model_id, reason=reason)
            ticket.usage.model = lease.model_id
            return Served(value, lease, ticket, deadline, stack)
        if last_error is None:  # pragma: no cover - targets is not empty
            raise ModelNotFoundError(f"model {decision.requested!r} not found")
        raise last_error


def ticket_of(request: Request) -> Ticket:
    """The request's ticket (set by the gateway middleware for every HTTP request)."""
    ticket = request.scope.get(TICKET_SCOPE_KEY)
    if not isinstance(ticket, Ticket):
        raise RuntimeError("no gateway ticket: build the app with the gateway middleware")
    return ticket


def provider_of(request: Request) -> ModelProvider:
    """The app's model provider (every route reaches models through it, typed)."""
    provider: ModelProvider = request.app.state.provider
    return provider


def principal_of(request: Request) -> Principal:
    principal = request.scope.get(PRINCIPAL_SCOPE_KEY)
    if not isinstance(principal, Principal):
        raise RuntimeError("no principal: build the app with the gateway middleware")
    return principal


def declared_bytes(request: Request) -> int:
    """The request body's declared size, for usage (0 when chunked)."""
    declared = request.headers.get("content-length", "")
    return int(declared) if declared.isdigit() else 0


def runs_model(endpoint: F) -> F:
    """Marks a route endpoint that runs a model: it admits through the request path."""
    setattr(endpoint, _MODEL_ROUTE_MARK, True)
    return endpoint


async def admit_request(request: Request) -> None:
    """App-wide dependency: one request and one concurrency slot for routes running no model."""
    route = request.scope.get("route")
    if getattr(getattr(route, "endpoint", None), _MODEL_ROUTE_MARK, False):
        return  # the request path admits it, after authorizing and routing
    ticket = request.scope.get(TICKET_SCOPE_KEY)
    if isinstance(ticket, Ticket):
        await ticket.admit()


async def require_admin(request: Request) -> None:
    """Dependency of model control, /admin/* and /metrics: 403 without the admin scope."""
    if not principal_of(request).is_admin:
        raise forbidden("this needs an admin credential", "admin_required")
