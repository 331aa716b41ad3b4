"""`PrefixAwareRequestRouter` inside Ray Serve's own routing loop, with in-memory replicas.

Each request goes through `RequestRouter._choose_replica_for_request` (Serve's routing tasks:
`choose_replicas` ranks, queue-length probes, a rank's full replicas skipped) and then the two
calls Serve's `Router` makes once a replica accepted it (`on_send_request`, then
`on_request_routed`), so what is tested is the class as Serve drives it. No Ray cluster.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

pytest.importorskip("ray.serve", reason="the `ray` extra is not installed")

from ray.serve._private.common import (
    DeploymentHandleSource,
    DeploymentID,
    RequestMetadata,
)
from ray.serve.request_router import PendingRequest, ReplicaID, RunningReplica

from modelyard.engine.messages import LoRARequest, PinPrefix
from modelyard.engine.sampling_params import SamplingParams
from modelyard.scale.messages import LLMCall, PinCall
from modelyard.scale.ray_router import PrefixAwareRequestRouter

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

DEPLOYMENT = DeploymentID(name="llm-chat", app_name="modelyard")
BLOCK = 4
SYSTEM_A = list(range(100, 116))  # 4 full blocks
SYSTEM_B = list(range(200, 216))
_ids = itertools.count()


class FakeReplica(RunningReplica):
    """A replica that only answers queue-length probes (what the router asks of it)."""

    def __init__(self, name: str, *, max_ongoing_requests: int = 8) -> None:
        self._replica_id = ReplicaID(unique_id=name, deployment_id=DEPLOYMENT)
        self._max_ongoing_requests = max_ongoing_requests
        self.queue_len = 0  # what the next probe answers

    @property
    def replica_id(self) -> ReplicaID:
        return self._replica_id

    @property
    def node_id(self) -> str:
        return ""

    @property
    def availability_zone(self) -> str | None:
        return None

    @property
    def multiplexed_model_ids(self) -> set[str]:
        return set()

    @property
    def max_ongoing_requests(self) -> int:
        return self._max_ongoing_requests

    async def get_queue_len(self, *, deadline_s: float) -> int:
        return self.queue_len


def request(
    tokens: list[int],
    session: str | None = None,
    arg: Any = None,
    lora: LoRARequest | None = None,
) -> PendingRequest:
    request_id = f"req-{next(_ids)}"
    params = SamplingParams(max_tokens=4)
    call = LLMCall(request_id, tokens, params, session_id=session, lora=lora)
    return PendingRequest(
        args=[call if arg is None else arg],
        kwargs={},
        metadata=RequestMetadata(request_id=request_id, internal_request_id=request_id),
    )


async def new_router(*replicas: FakeReplica, max_queue_gap: int = 4) -> PrefixAwareRequestRouter:
    router = PrefixAwareRequestRouter(
        deployment_id=DEPLOYMENT,
        handle_source=DeploymentHandleSource.UNKNOWN,
        use_replica_queue_len_cache=True,
    )
    router.initialize_state(block_size=BLOCK, max_blocks=64, max_queue_gap=max_queue_gap)
    router.update_replicas(list(replicas))
    await asyncio.sleep(0)  # the first queue-length probes
    return router


async def route(router: PrefixAwareRequestRouter, pending: PendingRequest) -> str:
    """Route one request as Serve's Router does; the chosen replica's name."""
    replica = await router._choose_replica_for_request(pending)
    router.on_send_request(replica.replica_id)
    router.on_request_routed(pending, replica.replica_id, None)
    return str(replica.replica_id.unique_id)


def set_queue(router: PrefixAwareRequestRouter, replica: FakeReplica, queue_len: int) -> None:
    """A queue length as Serve learns it (a replica's answer to a request)."""
    replica.queue_len = queue_len
    router.on_new_queue_len_info(replica.replica_id, queue_len)


async def test_a_shared_prefix_sticks_and_new_prefixes_spread() -> None:
    r1, r2 = FakeReplica("r1"), FakeReplica("r2")
    router = await new_router(r1, r2)
    first = await route(router, request([*SYSTEM_A, 1, 2]))
    for question in range(5):  # repeats of system A, whatever the queues say within the gap
        set_queue(router, r1 if first == "r1" else r2, 3)
        assert await route(router, request([*SYSTEM_A, 7, question])) == first
    other = "r2" if first == "r1" else "r1"
    assert await route(router, request([*SYSTEM_B, 5])) == other  # least cached replica
    set_queue(router, r1, 0)
    set_queue(router, r2, 0)
    assert await route(router, request([*SYSTEM_B, 6, 6])) == other


async def test_a_much_busier_preferred_replica_is_passed_over() -> None:
    r1, r2 = FakeReplica("r1"), FakeReplica("r2")
    router = await new_router(r1, r2, max_queue_gap=2)
    owner = await route(router, request([*SYSTEM_A, 1]))
    busy, idle = (r1, r2) if owner == "r1" else (r2, r1)
    set_queue(router, busy, 3)
    set_queue(router, idle, 0)
    assert await route(router, request([*SYSTEM_A, 2])) == idle.replica_id.unique_id
    set_queue(router, busy, 0)  # the prefix now points at the replica that served it last
    assert await route(router, request([*SYSTEM_A, 3])) == idle.replica_id.unique_id


async def test_a_full_preferred_replica_falls_back_to_the_next_rank() -> None:
    r1, r2 = FakeReplica("r1", max_ongoing_requests=2), FakeReplica("r2", max_ongoing_requests=2)
    router = await new_router(r1, r2, max_queue_gap=100)
    owner = await route(router, request([*SYSTEM_A, 1]))
    full, free = (r1, r2) if owner == "r1" else (r2, r1)
    set_queue(router, full, 2)  # at max_ongoing_requests: Serve skips it
    set_queue(router, free, 0)
    pending = request([*SYSTEM_A, 2])
    ranks = await router.choose_replicas([r1, r2], pending)
    assert [r.replica_id.unique_id for r in ranks[0]] == [owner]  # preferred first...
    assert await route(router, pending) == free.replica_id.unique_id  # ...but full


async def test_sessions_stick_and_other_calls_get_power_of_two() -> None:
    r1, r2 = FakeReplica("r1"), FakeReplica("r2")
    router = await new_router(r1, r2)
    home = await route(router, request([9, 9], session="alice"))
    for prompt in ([*SYSTEM_A, 1], [*SYSTEM_B, 2], [3]):
        assert await route(router, request(prompt, session="alice")) == home
    ranks = await router.choose_replicas([r1, r2], request([], arg="not an LLMCall"))
    assert len(ranks) == 1
    assert {r.replica_id.unique_id for r in ranks[0]} == {"r1", "r2"}


async def test_a_dead_replica_is_forgotten() -> None:
    r1, r2 = FakeReplica("r1"), FakeReplica("r2")
    router = await new_router(r1, r2)
    owner = await route(router, request([*SYSTEM_A, 1]))
    survivor = r2 if owner == "r1" else r1
    dead = r1 if owner == "r1" else r2
    router.on_replica_actor_died(dead.replica_id)
    router.update_replicas([survivor])
    assert await route(router, request([*SYSTEM_A, 2])) == survivor.replica_id.unique_id
    replacement = FakeReplica("r3")
    router.update_replicas([survivor, replacement])
    await asyncio.sleep(0)
    assert await route(router, request([*SYSTEM_A, 3])) == survivor.replica_id.unique_id
    assert await route(router, request([*SYSTEM_B, 4])) == "r3"  # the empty cache


FINANCE = LoRARequest(name="finance", path="/adapters/finance", adapter_id=1)


async def test_an_adapters_requests_go_where_it_is_loaded() -> None:
    r1, r2 = FakeReplica("r1"), FakeReplica("r2")
    router = await new_router(r1, r2)
    await route(router, request([*SYSTEM_B, 1]))  # the base's prompts own one replica's cache
    home = await route(router, request([*SYSTEM_A, 1], lora=FINANCE))
    for prompt in ([*SYSTEM_B, 2], list(range(300, 316)), [7]):  # new to the table, or short
        assert await route(router, request(prompt, lora=FINANCE)) == home


async def test_a_pin_holds_its_prefix_on_the_replica_that_pinned_it() -> None:
    r1, r2 = FakeReplica("r1"), FakeReplica("r2")
    router = await new_router(r1, r2, max_queue_gap=2)
    command = PinPrefix(request_id="pin-1", prefix_id="pfx-1", token_ids=SYSTEM_A, ttl_s=60.0)
    owner = await route(router, request([], arg=PinCall(command)))
    busy, idle = (r1, r2) if owner == "r1" else (r2, r1)
    set_queue(router, busy, 3)
    set_queue(router, idle, 0)
    assert await route(router, request([*SYSTEM_A, 1])) == idle.replica_id.unique_id  # guard
    set_queue(router, busy, 0)
    assert await route(router, request([*SYSTEM_A, 2])) == owner  # the pin, not the last route
    router.on_replica_actor_died(busy.replica_id)  # the pin died with its replica
    router.update_replicas([idle])
    assert await route(router, request([*SYSTEM_A, 3])) == idle.replica_id.unique_id
