"""The prefix-affinity policy (scale/affinity.py): keys, preference, load guard, bounds."""

from __future__ import annotations

import pytest

from modelyard.scale.affinity import (
    KeyUse,
    PrefixAffinity,
    RoutingKeys,
    adapter_key,
    prefix_keys,
    session_key,
)

pytestmark = pytest.mark.unit


def keys(tokens: list[int], session: str | None = None, block: int = 4) -> RoutingKeys:
    return RoutingKeys(prefix_keys(tokens, block, 64), session_key(session) if session else None)


def test_prefix_keys_are_block_aligned_chains() -> None:
    a = prefix_keys(list(range(10)), 4, 64)
    assert len(a) == 2  # two full blocks; the partial one is not hashed
    b = prefix_keys([*range(8), 99, 98, 97, 96], 4, 64)
    assert b[:2] == a  # same leading blocks -> same keys
    c = prefix_keys([1, *range(1, 8)], 4, 64)
    assert c[0] != a[0]
    assert c[1] != a[1]
    assert len(prefix_keys(list(range(1000)), 4, 8)) == 8  # bounded by max_blocks


def test_shared_prefix_goes_to_the_replica_that_served_it() -> None:
    table = PrefixAffinity(max_queue_gap=4)
    system = list(range(100, 140))
    assert table.choose(keys([*system, 1, 2, 3, 4]), {"r1": 0, "r2": 0}) is None  # cold: fall back
    table.record(keys([*system, 1, 2, 3, 4]), "r2")
    assert table.choose(keys([*system, 7, 8, 9, 10, 11]), {"r1": 0, "r2": 1}) == "r2"
    other = list(range(500, 540))
    assert table.choose(keys(other), {"r1": 0, "r2": 0}) == "r1"  # new prefix: least cached


def test_new_prefixes_spread_over_the_least_cached_replicas() -> None:
    table = PrefixAffinity(max_queue_gap=2)
    replicas = {"r1": 0, "r2": 0, "r3": 0}
    systems = [[100 * i + j for j in range(16)] for i in range(6)]  # 4 blocks each
    owners = []
    for system in systems:
        chosen = table.choose(keys(system), replicas) or min(
            replicas, key=lambda r: (table.owned(r), r)
        )  # a tie: the caller's power of two picks any of them
        table.record(keys(system), chosen)
        owners.append(chosen)
    assert sorted(owners) == ["r1", "r1", "r2", "r2", "r3", "r3"]  # two prefixes each
    assert [table.owned(r) for r in replicas] == [8, 8, 8]


def test_new_prefix_rule_respects_load_and_needs_a_full_block() -> None:
    table = PrefixAffinity(max_queue_gap=2)
    table.record(keys(list(range(16))), "cached")
    fresh = list(range(900, 916))
    assert table.choose(keys(fresh), {"cached": 0, "empty": 2}) == "empty"
    assert table.choose(keys(fresh), {"cached": 0, "empty": 3}) is None  # too busy: fall back
    assert table.choose(keys([7, 8, 9]), {"cached": 0, "empty": 0}) is None  # no full block
    table.record(keys(fresh), "empty")
    third = list(range(700, 716))
    assert table.choose(keys(third), {"cached": 0, "empty": 0}) is None  # equal shares: tie


def test_owned_counts_follow_overwrites_eviction_and_forgetting() -> None:
    table = PrefixAffinity(capacity=6)
    prompt = list(range(16))  # 4 keys
    table.record(keys(prompt), "r1")
    table.record(keys(prompt[:8]), "r2")  # the first 2 keys move to r2
    assert (table.owned("r1"), table.owned("r2")) == (2, 2)
    table.record(keys(list(range(50, 66))), "r3")  # 4 more keys: r1's 2 (the oldest) go
    assert len(table) == 6
    assert (table.owned("r1"), table.owned("r2")) == (0, 2)
    assert table.owned("r3") == 4
    table.forget_replica("r3")
    assert table.owned("r3") == 0
    assert len(table) == 2


def test_longest_prefix_wins() -> None:
    table = PrefixAffinity()
    base = list(range(16))
    table.record(keys(base[:8]), "short")
    table.record(keys(base), "long")  # overwrites the first 2 blocks too
    table.record(keys(base[:8]), "short")
    assert table.choose(keys([*base, 1, 2, 3, 4]), {"short": 0, "long": 0}) == "long"


def test_load_guard_falls_back_when_the_preferred_queue_is_much_longer() -> None:
    table = PrefixAffinity(max_queue_gap=2)
    prompt = list(range(32))
    table.record(keys(prompt), "busy")
    assert table.choose(keys(prompt), {"busy": 3, "idle": 1}) == "busy"  # gap 2: allowed
    assert table.choose(keys(prompt), {"busy": 4, "idle": 1}) is None  # gap 3: fall back


def test_session_sticks_before_prefix() -> None:
    table = PrefixAffinity()
    table.record(keys(list(range(32))), "by-prefix")
    table.record(keys([9, 9, 9, 9], session="alice"), "by-session")
    chosen = table.choose(keys(list(range(32)), session="alice"), {"by-prefix": 0, "by-session": 0})
    assert chosen == "by-session"
    assert table.choose(keys([5, 5, 5, 5], session="bob"), {"by-session": 0}) is None


def test_gone_replicas_are_skipped_and_forgotten() -> None:
    table = PrefixAffinity()
    prompt = list(range(32))
    table.record(keys(prompt), "dead")
    assert table.choose(keys(prompt), {"alive": 0}) is None  # not a candidate any more
    table.forget_replica("dead")
    assert len(table) == 0


def test_table_is_bounded_lru() -> None:
    table = PrefixAffinity(capacity=4)
    for i in range(10):
        table.record(keys([i] * 4), f"r{i}")
    assert len(table) == 4
    assert table.choose(keys([9] * 4), {"r9": 0}) == "r9"
    assert table.choose(keys([0] * 4), {"r0": 0}) is None  # evicted


def test_bad_settings_raise() -> None:
    with pytest.raises(ValueError):
        PrefixAffinity(capacity=0)
    with pytest.raises(ValueError):
        PrefixAffinity(max_queue_gap=-1)


def test_an_adapter_keys_its_prefixes_apart_and_prefers_where_it_is_loaded() -> None:
    system = list(range(100, 116))
    base, salted = prefix_keys(system, 4, 64), prefix_keys(system, 4, 64, salt="lora:1:finance")
    assert len(salted) == len(base)
    assert not set(salted) & set(base)  # other KV, other keys
    table = PrefixAffinity(max_queue_gap=4)
    table.record(keys(system), "r1")
    finance = RoutingKeys(salted, adapter=adapter_key("finance"))
    assert table.choose(finance, {"r1": 0, "r2": 0}) == "r2"  # new to the table: least cached
    table.record(finance, "r2")
    other = RoutingKeys(prefix_keys(list(range(500, 516)), 4, 64, "lora:1:finance"))
    fresh = RoutingKeys(other.prefix, adapter=adapter_key("finance"))
    assert table.choose(fresh, {"r1": 0, "r2": 1}) == "r2"  # a new prompt: the adapter's replica
    assert table.choose(RoutingKeys([], adapter=adapter_key("legal")), {"r1": 0, "r2": 0}) is None


def test_a_pin_holds_its_keys_until_it_expires_or_its_replica_is_gone() -> None:
    now = [0.0]
    table = PrefixAffinity(capacity=4, max_queue_gap=1, clock=lambda: now[0])
    system = list(range(100, 112))  # 3 blocks
    pin = RoutingKeys(prefix_keys(system, 4, 64), use=KeyUse.PIN, pin_id="pfx-1", ttl_s=10.0)
    table.routed(pin, "r1")
    table.record(keys(system), "r2")  # a request passed r1 over: the pin still holds
    assert table.choose(keys([*system, 5]), {"r1": 0, "r2": 0}) == "r1"
    for i in range(3):  # the table's bound forgets keys, never a pin's
        table.record(keys(list(range(1000 * i, 1000 * i + 8))), "r2")
    assert table.pinned_replica(pin.prefix[0]) == "r1"
    now[0] = 10.0
    assert table.pinned_replica(pin.prefix[0]) is None  # its TTL passed
    table.routed(pin, "r1")
    table.forget_replica("r1")
    assert table.pinned_replica(pin.prefix[0]) is None
