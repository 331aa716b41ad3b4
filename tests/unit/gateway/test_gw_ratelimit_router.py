"""The in-memory limit store (fake clock) and the router's decisions."""

from __future__ import annotations

import math
import random

import pytest

from modelyard.gateway.base import Principal
from modelyard.gateway.config import GatewayConfig, Quota
from modelyard.gateway.ratelimit import Charge, Limit, MemoryStore
from modelyard.gateway.router import WeightedRouter, build_router
from modelyard.observability.metrics import ROUTE_DECISIONS

pytestmark = pytest.mark.unit

NONE = Charge()


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_rpm_allows_exactly_the_burst_then_refills() -> None:
    clock = Clock()
    store = MemoryStore(clock)
    quota = Quota(rpm=5)
    results = [await store.acquire("t", quota, NONE) for _ in range(7)]
    assert [r.allowed for r in results] == [True] * 5 + [False] * 2
    assert [r.remaining for r in results[:5]] == [4, 3, 2, 1, 0]
    refused = results[5]
    assert refused.refused == Limit.RPM
    headers = dict(refused.headers())
    assert headers["x-ratelimit-limit"] == "5"
    assert headers["retry-after"] == "12"  # one request per 60/5 s
    clock.now += 11.9
    assert not (await store.acquire("t", quota, NONE)).allowed
    clock.now += 0.2
    assert (await store.acquire("t", quota, NONE)).allowed
    assert (await store.acquire("other", quota, NONE)).allowed  # tenants are separate


async def test_tpm_precharges_estimate_and_settles_real_count() -> None:
    clock = Clock()
    store = MemoryStore(clock)
    quota = Quota(tpm=100)
    first = await store.acquire("t", quota, Charge(tokens=60))
    assert first.allowed
    assert first.remaining == 40
    refused = await store.acquire("t", quota, Charge(tokens=60))  # 40 left < 60
    assert not refused.allowed
    assert refused.refused == Limit.TPM
    assert math.isclose(refused.retry_after_s, 20 / (100 / 60))
    await store.settle("t", quota, token_delta=60 - 15, release=False)  # real use was 15
    second = await store.acquire("t", quota, Charge(tokens=60))
    assert second.allowed
    assert second.remaining == 100 - 15 - 60
    await store.settle("t", quota, token_delta=60 - 200, release=False)  # used more than estimated
    assert not (await store.acquire("t", quota, Charge(tokens=1))).allowed  # bucket below zero


async def test_huge_estimate_is_capped_at_capacity() -> None:
    store = MemoryStore(Clock())
    decision = await store.acquire("t", Quota(tpm=50), Charge(tokens=10_000))
    assert decision.allowed
    assert decision.remaining == 0


async def test_ipm_needs_the_items_and_debits_all_of_them() -> None:
    clock = Clock()
    store = MemoryStore(clock)
    quota = Quota(ipm=10)
    first = await store.acquire("t", quota, Charge(items=4))
    assert (first.allowed, first.limit, first.remaining) == (True, 10, 6)
    assert (await store.acquire("t", quota, Charge(items=4))).remaining == 2
    refused = await store.acquire("t", quota, Charge(items=4))
    assert refused.refused == Limit.IPM
    assert dict(refused.headers())["retry-after"] == "12"  # 2 missing at 10 per 60 s
    clock.now += 60
    big = await store.acquire("t", quota, Charge(items=25))  # more than the quota: from a full
    assert big.allowed  # bucket only, and the whole batch is debited
    assert big.remaining == -15
    clock.now += 60  # 10 back: still 5 short of a single item's need
    assert not (await store.acquire("t", quota, Charge(items=1))).allowed
    assert (await store.acquire("t", Quota(ipm=10), Charge(tokens=99))).allowed  # no items


async def test_concurrency_slots_and_release() -> None:
    store = MemoryStore(Clock())
    quota = Quota(max_concurrent=2)
    assert (await store.acquire("t", quota, NONE)).allowed
    assert (await store.acquire("t", quota, NONE)).allowed
    refused = await store.acquire("t", quota, NONE)
    assert refused.refused == Limit.CONCURRENCY
    await store.settle("t", quota, 0, release=True)
    assert (await store.acquire("t", quota, NONE)).allowed


async def test_refusal_debits_nothing() -> None:
    store = MemoryStore(Clock())
    quota = Quota(rpm=3, tpm=100)
    assert (await store.acquire("t", quota, Charge(tokens=90))).allowed
    for _ in range(5):  # refused by tpm: the rpm bucket must not drain
        assert (await store.acquire("t", quota, Charge(tokens=50))).refused == Limit.TPM
    assert (await store.acquire("t", quota, Charge(tokens=5))).allowed
    assert (await store.acquire("t", quota, Charge(tokens=5))).allowed
    assert (await store.acquire("t", quota, NONE)).refused == Limit.RPM


ROUTES = {
    "routes": {
        "seed": 1234,
        "models": {
            "chat": {
                "target": "chat-v1",
                "aliases": ["gpt-4o-mini"],
                "canary": {"chat-v2": 0.1},
                "fallbacks": ["chat-small"],
                "tenants": {"acme": "chat-acme"},
            }
        },
    }
}


def _router(**kw: object) -> WeightedRouter:
    router = build_router(GatewayConfig.from_dict(ROUTES), **kw)  # type: ignore[arg-type]
    assert isinstance(router, WeightedRouter)
    return router


def test_canary_split_within_binomial_bound() -> None:
    router = _router()
    before = ROUTE_DECISIONS.labels("chat", "chat-v2", "canary")._value.get()
    n, p = 2000, 0.1
    decisions = [router.route("chat", Principal(tenant="t")) for _ in range(n)]
    canary = sum(d.targets[0] == "chat-v2" for d in decisions)
    sigma = math.sqrt(n * p * (1 - p))
    assert abs(canary - n * p) <= 4 * sigma  # ~13.4: [146, 254]
    assert all(d.reason == "canary" for d in decisions if d.targets[0] == "chat-v2")
    assert all(d.targets == ["chat-v1", "chat-small"] for d in decisions if d.reason == "direct")
    assert all(
        d.targets == ["chat-v2", "chat-v1", "chat-small"] for d in decisions if d.reason == "canary"
    )
    assert ROUTE_DECISIONS.labels("chat", "chat-v2", "canary")._value.get() - before == canary
    again = _router()  # same seed: same draws
    assert [again.route("chat", Principal(tenant="t")).targets[0] for _ in range(n)] == [
        d.targets[0] for d in decisions
    ]


class Draws(random.Random):
    """Returns the given draws in turn and counts them."""

    def __init__(self, *values: float) -> None:
        super().__init__(0)
        self.values, self.count = list(values), 0

    def random(self) -> float:
        self.count += 1
        return self.values.pop(0)


def test_canary_is_drawn_before_the_tenant_override_and_alias_resolves() -> None:
    draws = Draws(0.5, 0.05, 0.05)
    router = _router(rng=draws)
    decision = router.route("gpt-4o-mini", Principal(tenant="acme"))
    assert decision.targets == ["chat-acme", "chat-v1", "chat-small"]
    assert decision.reason == "tenant-override"
    assert draws.count == 1  # drawn for the overridden tenant too: the sample is all traffic
    assert decision.header == "gpt-4o-mini->-;tenant-override"  # nothing served yet
    canary_for_acme = router.route("chat", Principal(tenant="acme"))
    assert (canary_for_acme.targets[0], canary_for_acme.reason) == ("chat-v2", "canary")
    aliased = router.route("gpt-4o-mini", Principal(tenant="other"))
    assert aliased.targets[0] == "chat-v2"
    assert aliased.reason == "canary"
    assert router.resolve("gpt-4o-mini") == "chat"
    assert router.resolve("chat-v1") is None
    assert router.route_names() == ["chat"]
    unrouted = ROUTE_DECISIONS.labels("*", "*", "direct")
    before = unrouted._value.get()
    assert router.route("unknown-model", Principal(tenant="t")).targets == ["unknown-model"]
    assert unrouted._value.get() - before == 1  # client-chosen names share one series


class NoCanary(random.Random):
    def random(self) -> float:
        return 0.99


def test_failing_target_moves_last_then_recovers() -> None:
    clock = Clock()
    routes = GatewayConfig.from_dict(ROUTES).routes
    router = WeightedRouter(routes, rng=NoCanary(), clock=clock)
    assert router.route("chat", Principal(tenant="t")).targets == ["chat-v1", "chat-small"]
    router.report_failure("chat-v1")
    decision = router.route("chat", Principal(tenant="t"))
    assert decision.targets == ["chat-small", "chat-v1"]
    assert decision.reason == "fallback"
    clock.now += 31  # cooldown over
    assert router.route("chat", Principal(tenant="t")).targets[0] == "chat-v1"


def test_no_routes_gives_identity_router() -> None:
    router = build_router(GatewayConfig())
    decision = router.route("m", Principal(tenant="t"))
    assert decision.targets == ["m"]
    assert decision.reason == "direct"
