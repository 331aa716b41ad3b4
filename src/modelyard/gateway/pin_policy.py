"""Pinned prefixes and the prefix cache between tenants: what one tenant may do.

The prefix routes (api/routes/prefixes.py) and the generation routes (api/generation.py) ask
`PinPolicy.of(ticket)` for the caller's policy, made from `gateway.pins` and the tenant's own
`pins` overrides (gateway/config.py):

1. **share**: one tenant's pins together hold at most `share` of a model's pin budget (KV
   blocks, counted as the engine counts them); a pin past it is refused with 507
   `pin_share_exceeded` even when the budget has room, so one tenant cannot keep a model's
   cache to itself. The anonymous principal (auth off: the only tenant) has the whole budget.
2. **TTL**: a pin may ask for at most `max_ttl_s`; a longer `ttl_s` is a 400 naming the limit
   (as OpenAI and vLLM answer an out-of-range parameter: nothing is silently shortened). A pin
   that asks for no TTL gets the default (1 h), or `max_ttl_s` when that is shorter.
3. **salt**: the prefix-cache salt of the tenant's requests and pins is made of the request's
   `cache_salt` (vLLM's field) and, with `salt_by_tenant`, the tenant's id. Requests share
   cached or pinned KV only with those of the same salt: a salted tenant shares nothing with
   other tenants. The two parts are encoded apart, so no `cache_salt` a client sends can
   equal another tenant's salt.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from modelyard.gateway.base import ANONYMOUS
from modelyard.gateway.config import PinsConfig
from modelyard.gateway.errors import GatewayError
from modelyard.gateway.ticket import Ticket


@dataclass(frozen=True, slots=True)
class PinPolicy:
    """One tenant's pin and prefix-cache policy (see the module docstring)."""

    tenant: str  # the tenant's id
    config: PinsConfig  # gateway.pins with the tenant's overrides
    whole_budget: bool = False  # the anonymous principal (auth off): no share applies

    @classmethod
    def of(cls, ticket: Ticket) -> PinPolicy:
        principal = ticket.identity.principal
        return cls(
            tenant=principal.tenant,
            config=ticket.gateway.config.pins_of(principal.tenant),
            whole_budget=principal == ANONYMOUS,
        )

    def share_blocks(self, budget_blocks: int) -> int | None:
        """Most blocks this tenant's pins may hold on a model with this budget (None: all)."""
        if self.whole_budget:
            return None
        return math.floor(budget_blocks * self.config.share)

    def ttl_s(self, requested: float | None, *, default: float) -> float:
        """The TTL of a pin that asks for `requested` (None: `default`, at most the limit);
        400 past the tenant's `max_ttl_s`."""
        limit = self.config.max_ttl_s
        if requested is None:
            return min(default, limit)
        if requested > limit:
            raise GatewayError(
                400,
                f"ttl_s must be at most {limit:g} seconds (max_ttl_s for this tenant), "
                f"not {requested:g}",
                "ttl_too_long",
                "invalid_request_error",
                param="ttl_s",
            )
        return requested

    def cache_salt(self, requested: str | None) -> str | None:
        """The salt of the tenant's prefix-cache hashes for a request with this `cache_salt`
        (None: unsalted, shared with every request that starts alike)."""
        parts: list[list[str]] = []
        if self.config.salt_by_tenant:
            parts.append(["tenant", self.tenant])
        if requested is not None:
            parts.append(["salt", requested])
        return json.dumps(parts, separators=(",", ":")) if parts else None
