"""Stored responses of POST /v1/responses (`store: true`), in memory, per tenant.

A stored response keeps its body (what GET /v1/responses/{id} returns) and the conversation
that produced it (its input items, those of the responses before it included), so a request
naming it as `previous_response_id` continues with `items + output`. Each entry lives
`ttl_s` seconds; a tenant keeps at most `max_per_tenant` (the oldest goes first). Another
tenant's id reads as unknown, the same as an expired one.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class StoredResponse:
    body: dict[str, Any]  # the response object as returned
    items: list[dict[str, Any]]  # the input items of the whole conversation, in order
    expires: float  # clock() after which it is gone

    def conversation(self) -> list[dict[str, Any]]:
        """The items a follow-up request starts from: the input, then this response's output."""
        return [*self.items, *self.body["output"]]


class ResponseStore:
    """Responses by tenant and id, each for `ttl_s` seconds, at most `max_per_tenant` each."""

    def __init__(
        self,
        ttl_s: float,
        max_per_tenant: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s = ttl_s
        self.max_per_tenant = max_per_tenant
        self._clock = clock
        self._by_tenant: dict[str, OrderedDict[str, StoredResponse]] = {}

    def put(self, tenant: str, body: dict[str, Any], items: list[dict[str, Any]]) -> None:
        entries = self._by_tenant.setdefault(tenant, OrderedDict())
        self._expire(entries)
        entries[body["id"]] = StoredResponse(body, items, self._clock() + self.ttl_s)
        while len(entries) > self.max_per_tenant:
            entries.popitem(last=False)

    def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        """The tenant's response, or None (unknown, expired or another tenant's)."""
        entries = self._by_tenant.get(tenant)
        if entries is None:
            return None
        self._expire(entries)
        return entries.get(response_id)

    def _expire(self, entries: OrderedDict[str, StoredResponse]) -> None:
        now = self._clock()
        while entries:
            oldest = next(iter(entries.values()))
            if oldest.expires > now:
                return
            entries.popitem(last=False)
