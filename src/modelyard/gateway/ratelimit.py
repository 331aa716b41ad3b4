"""Per-tenant quotas: token buckets for rpm, tpm and ipm, a counter for concurrent requests.

Algorithm (identical in the memory store and the Redis Lua script):
- each limit L per minute is a bucket of capacity L refilled continuously at L/60 per second
  (a burst of L is allowed, then L per minute);
- `acquire(tenant, quota, charge)` checks, in this order, rpm (cost 1), tpm (cost = the token
  estimate of a generation, capped at the tpm capacity so a huge request can still pass once
  the bucket is full), ipm (the request's inputs: it needs min(items, capacity) in the bucket
  and debits all of them, so a batch larger than the quota passes only from a full bucket and
  leaves it below zero) and concurrency (in flight < max); tpm and ipm only for a request that
  charges them; only when all pass are all debited, atomically;
- `settle(tenant, quota, token_delta, release_slot)` runs when the request ends: it refunds the
  token estimate minus the real count (a negative delta charges extra; the bucket may go below
  zero and later requests wait) and frees the concurrency slot. Inputs are exact: no refund.
Stores raise `StoreUnavailable` when their backend cannot answer; the request path applies the
configured fail-open / fail-closed policy.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

from modelyard.gateway.config import Quota


class Limit(IntEnum):
    """Which limit refused a request (values are the Lua script's codes)."""

    NONE = 0
    RPM = 1
    TPM = 2
    CONCURRENCY = 3
    IPM = 4

    @property
    def label(self) -> str:
        return {1: "rpm", 2: "tpm", 3: "concurrency", 4: "ipm"}.get(self.value, "none")


class StoreUnavailable(Exception):
    """The limit store could not answer (e.g. Redis down or too slow)."""


@dataclass(frozen=True, slots=True)
class Charge:
    """What one request costs besides its request and its concurrency slot."""

    tokens: int = 0  # generation: prompt estimate + max new tokens (tpm; settled later)
    items: int = 0  # other models: inputs in the request (ipm; exact)


@dataclass(frozen=True, slots=True)
class LimitState:
    """Raw bucket levels after an acquire, as both stores return them."""

    refused: Limit  # Limit.NONE when admitted
    rpm_tokens: float  # rpm bucket level after the call (0..rpm)
    tpm_tokens: float  # tpm bucket level after the call (may be < 0 after over-use)
    ipm_tokens: float  # ipm bucket level after the call (may be < 0 after a large batch)
    in_flight: int  # concurrent requests after the call


@dataclass(frozen=True, slots=True)
class LimitDecision:
    """What the request path needs to answer or annotate a request."""

    allowed: bool  # admitted
    refused: Limit  # which limit refused it (NONE when admitted)
    limit: int  # the reported limit (the refusing one, else rpm, else tpm / ipm)
    remaining: int  # what is left of it
    reset_s: float  # seconds until that bucket is full again
    retry_after_s: float  # seconds until a retry can pass (0 when admitted)

    def headers(self) -> list[tuple[str, str]]:
        out = [
            ("x-ratelimit-limit", str(self.limit)),
            ("x-ratelimit-remaining", str(max(0, self.remaining))),
            ("x-ratelimit-reset", str(math.ceil(self.reset_s))),
        ]
        if not self.allowed:
            out.append(("retry-after", str(max(1, math.ceil(self.retry_after_s)))))
        return out


def token_cost(quota: Quota, estimate: int) -> int:
    """The tpm debit for an estimate: capped at the capacity, so it can always pass eventually."""
    return min(max(0, estimate), quota.tpm) if quota.tpm else 0


def item_need(quota: Quota, items: int) -> int:
    """What the ipm bucket must hold to admit `items` (the debit is all of them)."""
    return min(max(0, items), quota.ipm) if quota.ipm else 0


def decide(quota: Quota, charge: Charge, state: LimitState) -> LimitDecision:
    """Turn raw bucket levels into the headers' numbers."""
    refused = state.refused
    if refused == Limit.CONCURRENCY:
        limit = quota.max_concurrent or 0
        return LimitDecision(False, refused, limit, 0, 1.0, 1.0)
    buckets = {
        Limit.RPM: (quota.rpm, state.rpm_tokens, 1),
        Limit.TPM: (quota.tpm, state.tpm_tokens, token_cost(quota, charge.tokens)),
        Limit.IPM: (quota.ipm, state.ipm_tokens, item_need(quota, charge.items)),
    }
    if refused != Limit.NONE:
        shown = refused
    elif quota.rpm:
        shown = Limit.RPM
    elif quota.tpm and charge.tokens:
        shown = Limit.TPM
    elif quota.ipm and charge.items:
        shown = Limit.IPM
    else:
        return LimitDecision(True, refused, 0, 0, 0.0, 0.0)
    capacity, level, need = buckets[shown]
    if not capacity:  # a refusal by a limit that is not set cannot happen
        return LimitDecision(refused == Limit.NONE, refused, 0, 0, 0.0, 0.0)
    rate = capacity / 60.0
    retry = max(0.0, (need - level) / rate) if refused != Limit.NONE else 0.0
    return LimitDecision(
        allowed=refused == Limit.NONE,
        refused=refused,
        limit=capacity,
        remaining=math.floor(level),
        reset_s=max(0.0, (capacity - level) / rate),
        retry_after_s=retry,
    )


class RateLimitStore(Protocol):
    async def acquire(self, tenant: str, quota: Quota, charge: Charge) -> LimitDecision:
        """Admit or refuse one request; raises StoreUnavailable."""
        ...

    async def settle(self, tenant: str, quota: Quota, token_delta: int, release: bool) -> None:
        """Refund (delta > 0) or charge (< 0) tokens; free the concurrency slot if `release`."""
        ...

    async def close(self) -> None: ...


@dataclass(slots=True)
class _Bucket:
    tokens: float  # level at `stamp`
    stamp: float  # clock time of the last update


class MemoryStore:
    """Buckets in this process (one replica). Not shared: N replicas mean N times the limit."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[tuple[str, str], _Bucket] = {}
        self._in_flight: dict[str, int] = {}

    def _level(self, key: tuple[str, str], capacity: int | None, now: float) -> float:
        if not capacity:
            return 0.0
        bucket = self._buckets.get(key)
        if bucket is None:
            return float(capacity)
        return min(float(capacity), bucket.tokens + max(0.0, now - bucket.stamp) * capacity / 60)

    def _store(self, key: tuple[str, str], tokens: float, now: float) -> None:
        self._buckets[key] = _Bucket(tokens, now)

    async def acquire(self, tenant: str, quota: Quota, charge: Charge) -> LimitDecision:
        now = self._clock()
        cost, need = token_cost(quota, charge.tokens), item_need(quota, charge.items)
        rpm = self._level((tenant, "rpm"), quota.rpm, now)
        tpm = self._level((tenant, "tpm"), quota.tpm, now)
        ipm = self._level((tenant, "ipm"), quota.ipm, now)
        in_flight = self._in_flight.get(tenant, 0)
        refused = Limit.NONE
        if quota.rpm and rpm < 1:
            refused = Limit.RPM
        elif quota.tpm and charge.tokens > 0 and tpm < cost:
            refused = Limit.TPM
        elif quota.ipm and charge.items > 0 and ipm < need:
            refused = Limit.IPM
        elif quota.max_concurrent and in_flight >= quota.max_concurrent:
            refused = Limit.CONCURRENCY
        if refused == Limit.NONE:
            if quota.rpm:
                rpm -= 1
                self._store((tenant, "rpm"), rpm, now)
            if quota.tpm:
                tpm -= cost
                self._store((tenant, "tpm"), tpm, now)
            if quota.ipm:
                ipm -= max(0, charge.items)
                self._store((tenant, "ipm"), ipm, now)
            if quota.max_concurrent:
                in_flight += 1
                self._in_flight[tenant] = in_flight
        return decide(quota, charge, LimitState(refused, rpm, tpm, ipm, in_flight))

    async def settle(self, tenant: str, quota: Quota, token_delta: int, release: bool) -> None:
        now = self._clock()
        if quota.tpm and token_delta:
            level = self._level((tenant, "tpm"), quota.tpm, now)
            self._store((tenant, "tpm"), min(float(quota.tpm), level + token_delta), now)
        if release and quota.max_concurrent:
            self._in_flight[tenant] = max(0, self._in_flight.get(tenant, 0) - 1)

    async def close(self) -> None:
        return None
