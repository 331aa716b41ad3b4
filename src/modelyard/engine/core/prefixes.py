"""Pinned prefixes (CAG): knowledge prefilled once and kept in the prefix cache.

Policy, worker side (the API process keeps the user-facing registry, engine/client/prefixes.py):

1. `PinPrefix` arrives: the budget is checked first. The prefix's full blocks that are not
   pinned yet must fit under `limit_blocks` together with every block pinned now; otherwise
   `PrefixBudgetError` (the API process checks the same rule earlier and answers 507).
2. The prefix runs as an ordinary request (`max_tokens=1`, the sampled token is thrown away):
   its prefill is chunked, batched and preempted like any other, and its full blocks enter the
   prefix cache as they are scheduled.
3. When that request finishes, the full blocks of the prefix are pinned (`pin_cached`: one
   reference each), before its output leaves the worker. From then on every request whose
   prompt starts with the prefix gets those blocks as prefix-cache hits; the prefix's trailing
   partial block (len % block_size tokens) is recomputed by each request, as with any cached
   prefix.
4. A pin ends when the API process unpins it, when its TTL passes (`expire`, called by the
   worker loop every iteration), or when the worker exits (model unload).

The budget: pinned blocks may take at most `max_pinned_fraction` of the cache, and must always
leave room for one request of the full context length.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from modelyard.engine.block_hashes import BlockHash, block_hashes_of
from modelyard.engine.core.kv_cache import KVCacheManager
from modelyard.engine.messages import EngineOutput, EngineRequest, FinishReason, PinPrefix
from modelyard.engine.sampling_params import SamplingParams


class PrefixBudgetError(ValueError):
    """Pinning this prefix would leave too little KV cache for serving."""


def pin_limit_blocks(
    num_blocks: int, block_size: int, max_model_len: int, max_pinned_fraction: float
) -> int:
    """Most blocks all pins together may hold: a fraction of the cache, and never so many that
    a request of the full context length could not fit in the blocks left."""
    full_context = math.ceil(max_model_len / block_size)
    return max(0, min(int(num_blocks * max_pinned_fraction), num_blocks - full_context))


@dataclass
class _Pin:
    prefix_id: str
    block_ids: list[int]  # pinned blocks, in prefix order
    expires_at: float  # clock() value after which the pin is dropped
    hits_baseline: int  # kv.pinned_hits_by_block summed over block_ids when pinned


@dataclass
class _Pending:
    prefix_id: str
    hashes: list[BlockHash]
    ttl_s: float


@dataclass
class PrefixPins:
    """The pins of one engine; owns their blocks' extra references in `kv`."""

    kv: KVCacheManager
    limit_blocks: int  # pin_limit_blocks(...) of this engine
    clock: Callable[[], float] = time.monotonic
    _pins: dict[str, _Pin] = field(default_factory=dict)
    _pending: dict[str, _Pending] = field(default_factory=dict)  # by request id

    def start(self, command: PinPrefix) -> EngineRequest:
        """Check the budget and return the request that prefills the prefix (step 1-2).
        ValueError for a prefix id already pinned or pending, PrefixBudgetError over budget."""
        if command.prefix_id in self._pins or any(
            p.prefix_id == command.prefix_id for p in self._pending.values()
        ):
            raise ValueError(f"prefix {command.prefix_id!r} is already pinned")
        if not self.kv.enable_prefix_caching:
            raise ValueError("prefix caching is off for this model: nothing can be pinned")
        hashes = block_hashes_of(command.token_ids, self.kv.block_size, command.cache_salt)
        if not hashes:
            raise ValueError(f"a prefix needs at least {self.kv.block_size} tokens to pin")
        new_blocks = len(hashes) - self.kv.num_pinned_among(hashes)
        if self.kv.num_pinned_blocks + new_blocks > self.limit_blocks:
            raise PrefixBudgetError(
                f"pinning {len(hashes)} blocks would exceed the pin budget: "
                f"{self.kv.num_pinned_blocks} of {self.limit_blocks} blocks are pinned"
            )
        self._pending[command.request_id] = _Pending(command.prefix_id, hashes, command.ttl_s)
        return EngineRequest(
            request_id=command.request_id,
            prompt_token_ids=list(command.token_ids),
            sampling_params=SamplingParams(
                max_tokens=1, temperature=0.0, cache_salt=command.cache_salt
            ),
            priority=command.priority,
            arrival_time=time.time(),
        )

    def finish(self, output: EngineOutput) -> EngineOutput:
        """Pin a prefix whose prefill request just finished (step 3); other outputs pass
        through. The pin request's output becomes an error when its blocks could not be
        pinned (they left the cache, or the request failed)."""
        pending = self._pending.get(output.request_id)
        if pending is None or output.finish_reason is None:
            return output
        del self._pending[output.request_id]
        if output.finish_reason in (FinishReason.ERROR, FinishReason.ABORT):
            return output
        block_ids = self.kv.pin_cached(pending.hashes)
        if len(block_ids) < len(pending.hashes):
            self.kv.unpin(block_ids)
            return _failed(output.request_id, "the prefix's blocks left the cache before pinning")
        baseline = sum(self.kv.pinned_hits_by_block.get(b, 0) for b in block_ids)
        expires_at = self.clock() + pending.ttl_s
        self._pins[pending.prefix_id] = _Pin(pending.prefix_id, block_ids, expires_at, baseline)
        return output

    def abandon(self, request_ids: list[str]) -> None:
        """Forget pending pins whose prefill requests were aborted."""
        for request_id in request_ids:
            self._pending.pop(request_id, None)

    def unpin(self, prefix_ids: list[str]) -> None:
        """Release these pins (unknown ids are ignored: they may have expired meanwhile)."""
        for prefix_id in prefix_ids:
            pin = self._pins.pop(prefix_id, None)
            if pin is not None:
                self.kv.unpin(pin.block_ids)

    def expire(self) -> None:
        """Release every pin whose TTL has passed."""
        now = self.clock()
        self.unpin([p.prefix_id for p in self._pins.values() if p.expires_at <= now])

    def hits(self) -> dict[str, int]:
        """prefix id -> admissions that reused its pinned blocks since it was pinned."""
        by_block = self.kv.pinned_hits_by_block
        return {
            pin.prefix_id: sum(by_block.get(b, 0) for b in pin.block_ids) - pin.hits_baseline
            for pin in self._pins.values()
        }

    def pending_request_ids(self) -> list[str]:
        return list(self._pending)

    def __len__(self) -> int:
        return len(self._pins)


def _failed(request_id: str, error: str) -> EngineOutput:
    return EngineOutput(
        request_id=request_id, new_token_ids=[], finish_reason=FinishReason.ERROR, error=error
    )
