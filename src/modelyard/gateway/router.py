"""Routing: the model name a client sends -> the model ids to lease, in order.

Decision order for `route(requested, principal)`:
1. name lookup: a route's name or one of its aliases (reason `alias` for an alias); a name no
   route knows goes through unchanged (reason `direct`);
2. weighted canary: one draw from the router's RNG (seedable) for every request of a route with
   a canary, whoever sends it, so the canary's share is a sample of all the route's traffic; a
   canary target drawn with its share of probability is primary (reason `canary`);
3. tenant override: when no canary was drawn and the route maps the caller's tenant to a model,
   that model is primary (reason `tenant-override`); else the stable target;
4. the target list: primary, then the stable target (when primary differs), then the fallbacks;
5. health: targets reported failing within `failure_cooldown_s` move to the end of the list;
   if that changes the primary the reason becomes `fallback`.
Metrics: ROUTE_DECISIONS{requested, target, reason}; names outside the table count as
requested="*", target="*" (clients choose them: no unbounded label sets).
The request path (gateway/request_path.py) leases `targets[0]` and falls back in order, calling
`report_failure(model_id)` when a target is overloaded or failing so that the next decisions
skip it for a while.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

from modelyard.gateway.base import IdentityRouter, ModelRouter, Principal, RouteDecision
from modelyard.gateway.config import GatewayConfig, ModelRoute, RoutesConfig
from modelyard.observability.metrics import ROUTE_DECISIONS


class WeightedRouter:
    """The `ModelRouter` for a `RoutesConfig`; see the module docstring for the decision order."""

    def __init__(
        self,
        config: RoutesConfig,
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._rng = rng or random.Random(config.seed)
        self._clock = clock
        self._by_name: dict[str, tuple[ModelRoute, bool]] = {}
        for route in config.models:
            self._by_name[route.name] = (route, False)
            for alias in route.aliases:
                self._by_name[alias] = (route, True)
        self._failed_until: dict[str, float] = {}
        self._counters: dict[tuple[str, str, str], Any] = {}  # labelled ROUTE_DECISIONS

    def report_failure(self, model_id: str) -> None:
        """`model_id` is overloaded or failing: rank it last for `failure_cooldown_s`."""
        self._failed_until[model_id] = self._clock() + self.config.failure_cooldown_s

    def report_success(self, model_id: str) -> None:
        self._failed_until.pop(model_id, None)

    def resolve(self, name: str) -> str | None:
        found = self._by_name.get(name)
        return found[0].name if found is not None else None

    def route_names(self) -> list[str]:
        return [route.name for route in self.config.models]

    def _draw_canary(self, route: ModelRoute) -> str | None:
        if not route.canary:
            return None
        draw = self._rng.random()
        for model, share in route.canary:
            if draw < share:
                return model
            draw -= share
        return None

    def _pick(self, route: ModelRoute, tenant: str) -> tuple[str, str | None]:
        canary = self._draw_canary(route)  # drawn first, for every caller
        if canary is not None:
            return canary, "canary"
        override = route.tenants.get(tenant)
        if override is not None:
            return override, "tenant-override"
        return route.target, None

    def _healthy_first(self, targets: list[str]) -> list[str]:
        if not self._failed_until:
            return targets
        now = self._clock()
        failing = {t for t in targets if self._failed_until.get(t, 0.0) > now}
        return [t for t in targets if t not in failing] + [t for t in targets if t in failing]

    def route(self, requested: str, principal: Principal) -> RouteDecision:
        found = self._by_name.get(requested)
        if found is None:
            targets, reason = self._healthy_first([requested]), "direct"
        else:
            route, via_alias = found
            primary, why = self._pick(route, principal.tenant)
            reason = why or ("alias" if via_alias else "direct")
            ordered = [primary, route.target, *route.fallbacks]
            targets = self._healthy_first(list(dict.fromkeys(ordered)))
            if targets[0] != primary:
                reason = "fallback"
        # names outside the table are client-chosen: one series for all of them, not one each
        labels = (requested, targets[0], reason) if found is not None else ("*", "*", reason)
        counter = self._counters.get(labels)
        if counter is None:
            if len(self._counters) > 10_000:  # bounded: clients choose `requested`
                self._counters.clear()
            counter = self._counters[labels] = ROUTE_DECISIONS.labels(*labels)
        counter.inc()
        return RouteDecision(requested=requested, targets=targets, reason=reason)


def build_router(config: GatewayConfig, *, rng: random.Random | None = None) -> ModelRouter:
    """The router the app puts on `app.state.router` (identity when no routes are configured)."""
    if not config.routes.models:
        return IdentityRouter()
    return WeightedRouter(config.routes, rng=rng)
