"""`PrefixAwareRequestRouter`: Ray Serve's request-router extension point, with prefix affinity.

Set on an LLM deployment with `RequestRouterConfig(request_router_class=<this class>,
request_router_kwargs={...})`; Serve builds one per deployment handle (in the ingress) and asks
`choose_replicas` for ranks of replicas, then sends the request to the least loaded replica of
the first rank that accepts it. This class only ranks:

- a request whose first argument is an `LLMCall` (or a `PinCall`) gets `[[preferred]]` when the
  affinity table (scale/affinity.py) names a replica and the load guard allows it, or, for a
  prompt whose prefix no replica served yet, the replica owning the fewest table keys (the
  least cached); then a power-of-two rank as a fallback should that replica reject the request.
  A request with a LoRA adapter is keyed by the adapter too, so it goes where the adapter's
  weights are loaded;
- anything else (or no preference) gets power of two choices, as Serve's default router.

`on_request_routed` records the request's keys against the replica that got it (a pin holds
them there for its TTL; affinity.py step 6). Queue lengths come from Serve's own per-replica
queue-length cache (probing the replicas it has no fresh value for), the same numbers its
default router uses.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from typing import Any

from ray.serve.request_router import (
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from modelyard.scale.affinity import (
    KeyUse,
    PrefixAffinity,
    RoutingKeys,
    adapter_key,
    prefix_keys,
    session_key,
)
from modelyard.scale.messages import LLMCall, PinCall

_MAX_PENDING_KEYS = 4096


class PrefixAwareRequestRouter(RequestRouter):
    """Prefix-affinity ranks with a load guard (see the module docstring)."""

    def initialize_state(
        self,
        *,
        block_size: int = 16,
        max_blocks: int = 128,
        table_size: int = 8192,
        max_queue_gap: int = 4,
        **_: Any,
    ) -> None:
        self._block_size = block_size
        self._max_blocks = max_blocks
        self._affinity = PrefixAffinity(capacity=table_size, max_queue_gap=max_queue_gap)
        # internal request id -> keys, until routed (bounded: cancelled requests never are)
        self._keys: OrderedDict[str, RoutingKeys] = OrderedDict()

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        fallback = [_two_random(candidate_replicas)]
        keys = self._keys_of(pending_request)
        if keys is None:
            return fallback
        queue_lens = await self._queue_lens(candidate_replicas)
        chosen = self._affinity.choose(keys, queue_lens)
        if chosen is None:
            return fallback
        preferred = [r for r in candidate_replicas if r.replica_id.unique_id == chosen]
        return [preferred, *fallback]

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any
    ) -> None:
        keys = self._keys.pop(pending_request.metadata.internal_request_id, None)
        if keys is not None:
            self._affinity.routed(keys, replica_id.unique_id)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._affinity.forget_replica(replica_id.unique_id)

    def _keys_of(self, pending_request: PendingRequest | None) -> RoutingKeys | None:
        if pending_request is None or not pending_request.args:
            return None
        request_id = pending_request.metadata.internal_request_id
        keys = self._keys.get(request_id)
        if keys is None:
            keys = routing_keys(pending_request.args[0], self._block_size, self._max_blocks)
            if keys is None:
                return None
            self._keys[request_id] = keys
            while len(self._keys) > _MAX_PENDING_KEYS:
                self._keys.popitem(last=False)
        return keys

    async def _queue_lens(self, replicas: list[RunningReplica]) -> dict[str, int]:
        """Every candidate's queue length: Serve's cache, probing the ones it lacks."""
        lens: dict[str, int] = {}
        missing: list[RunningReplica] = []
        for replica in replicas:
            cached = self._replica_queue_len_cache.get(replica.replica_id)
            if cached is None:
                missing.append(replica)
            else:
                lens[replica.replica_id.unique_id] = cached
        if missing:
            for replica, queue_len in await self._probe_queue_lens(missing, 0):
                if queue_len is not None:
                    lens[replica.replica_id.unique_id] = queue_len
        return lens


def routing_keys(call: Any, block_size: int, max_blocks: int) -> RoutingKeys | None:
    """What the affinity table knows a call by (None: not a call it routes)."""
    if isinstance(call, LLMCall):
        lora = call.lora
        salt = None if lora is None else f"lora:{lora.adapter_id}:{lora.name}"
        return RoutingKeys(
            prefix_keys(call.prompt_token_ids, block_size, max_blocks, salt),
            session=session_key(call.session_id) if call.session_id else None,
            adapter=None if lora is None else adapter_key(lora.name),
        )
    if isinstance(call, PinCall):
        command = call.command
        prefix = prefix_keys(command.token_ids, block_size, max_blocks)
        return RoutingKeys(prefix, use=KeyUse.PIN, pin_id=command.prefix_id, ttl_s=command.ttl_s)
    return None


def _two_random(replicas: list[RunningReplica]) -> list[RunningReplica]:
    return random.sample(replicas, k=min(2, len(replicas)))
