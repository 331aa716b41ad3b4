"""`RayPinTransport`: the transport of the ingress's `EnginePrefixes` (engine/client/prefixes.py)
over an LLM deployment, so pins work in Ray mode through the same registry as in local mode.

- `add_request(PinPrefix)` sends a `PinCall`; the request router routes it by the prefix like
  a request that starts with it, and holds the prefix on the replica that got it for the pin's
  TTL (affinity.py step 6), so later requests with that prefix go to the engine that pinned its
  blocks. The replica streams its engine's outputs back;
- `unpin_prefixes` broadcasts the unpin to every replica (the engines ignore pins they do not
  hold), so it reaches the pin whichever router placed it;
- `abort` cancels a pin's stream (the replica aborts the prefill);
- `stats` counts the pinned blocks of the pins made here (the engines' own counts and the
  per-pin hits stay in the replicas: hits read 0 in Ray mode).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from modelyard.engine.block_hashes import block_hashes_of
from modelyard.engine.client.core_client import OutputQueue
from modelyard.engine.messages import (
    EngineOutput,
    EngineRequest,
    FinishReason,
    PinPrefix,
    SchedulerStats,
)
from modelyard.scale.calls import reraise_local
from modelyard.scale.messages import PinCall


@dataclass(slots=True)
class _Pin:
    token_ids: list[int]  # the prefix
    ttl_s: float
    expires_at: float | None = None  # time.time() once pinned; None while pending


class RayPinTransport:
    """`engine.client.prefixes.PinTransport` over a deployment handle (see the module docstring)."""

    def __init__(self, handle: Any, block_size: int) -> None:
        self._handle = handle
        self._stream = handle.options(stream=True)
        self._block_size = block_size
        self._pins: dict[str, _Pin] = {}  # prefix id -> its pin
        self._live: dict[str, Any] = {}  # pin request id -> the response generator

    @property
    def is_alive(self) -> bool:
        return True  # Serve replaces dead replicas; a failed call raises EngineDeadError

    async def add_request(
        self, request: EngineRequest | PinPrefix, queue: OutputQueue | None = None
    ) -> AsyncIterator[EngineOutput]:
        if not isinstance(request, PinPrefix):
            raise TypeError("RayPinTransport only sends pins; requests go through generate")
        self._pins[request.prefix_id] = _Pin(list(request.token_ids), request.ttl_s)
        stream = self._stream.pin.remote(PinCall(request))
        self._live[request.request_id] = stream
        return self._outputs(request, stream)

    async def abort(self, request_ids: list[str]) -> None:
        for request_id in request_ids:
            stream = self._live.pop(request_id, None)
            if stream is not None:
                stream.cancel()

    async def unpin_prefixes(self, prefix_ids: list[str]) -> None:
        for prefix_id in prefix_ids:
            self._pins.pop(prefix_id, None)
        try:
            response = self._handle.broadcast("unpin", list(prefix_ids))
            await response.results_async(return_exceptions=True)
        except Exception as exc:
            reraise_local(exc, llm=True)

    def stats(self) -> SchedulerStats:
        """The pinned blocks of the live pins made through this transport."""
        now = time.time()
        for prefix_id, pin in list(self._pins.items()):
            if pin.expires_at is not None and pin.expires_at <= now:
                del self._pins[prefix_id]
        live = [p for p in self._pins.values() if p.expires_at is not None]
        hashes = {h for p in live for h in block_hashes_of(p.token_ids, self._block_size)}
        return SchedulerStats(num_pinned_blocks=len(hashes), num_pinned_prefixes=len(live))

    def _settle(self, request: PinPrefix, reason: FinishReason | None) -> None:
        """The pin's prefill ended: live from now, or forgotten when it failed."""
        pin = self._pins.get(request.prefix_id)
        if pin is None:
            return
        if reason in (FinishReason.ERROR, FinishReason.ABORT):
            del self._pins[request.prefix_id]
        else:
            pin.expires_at = time.time() + request.ttl_s

    async def _outputs(self, request: PinPrefix, stream: Any) -> AsyncIterator[EngineOutput]:
        finished = False
        try:
            async for output in stream:
                finished = output.finish_reason is not None
                if finished:
                    self._settle(request, output.finish_reason)
                yield output
        except Exception as exc:
            reraise_local(exc, llm=True)
        finally:
            self._live.pop(request.request_id, None)
            if not finished:
                stream.cancel()
