"""Pinned prefixes seen from the API process: the registry of one engine's pins.

`AsyncLLM` owns one `PrefixRegistry` (it dies with the engine: a model unload releases every
pin). The registry mirrors the worker's pins (engine/core/prefixes.py) closely enough to
refuse early:

- `reserve` checks the pin budget with the same rule the worker applies (distinct full blocks
  of every live or pending pin, plus the new prefix's blocks not already counted, at most
  `EngineReady.max_pinned_blocks`) and records the pin as pending; raises PrefixBudgetError;
  with `owner_limit_blocks` it first checks the owner's share the same way, counting only the
  owner's pins (PrefixShareError: the gateway's per-tenant share, gateway/pin_policy.py);
- `commit` makes it live once the worker answered that its blocks are pinned; `drop` forgets
  a pending or live pin;
- entries past their TTL disappear from every read (the worker releases their blocks on its
  own clock, within milliseconds of ours).

Nothing here talks to the worker; AsyncLLM sends the commands.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from modelyard.engine.block_hashes import BlockHash, block_hashes_of
from modelyard.engine.client.core_client import OutputQueue
from modelyard.engine.messages import (
    EngineOutput,
    EngineRequest,
    FinishReason,
    PinPrefix,
    SchedulerStats,
)

#: Default and largest TTL of a pin, seconds.
DEFAULT_PREFIX_TTL_S = 3600.0
MAX_PREFIX_TTL_S = 7 * 24 * 3600.0


class PrefixBudgetError(RuntimeError):
    """Pinning would leave too little KV cache for serving (HTTP 507)."""


class PrefixShareError(PrefixBudgetError):
    """Pinning would take the owner (tenant) past its share of the pin budget (HTTP 507)."""


class PrefixPinError(RuntimeError):
    """The engine could not pin the prefix (its prefill failed or was aborted)."""


class PrefixNotFoundError(LookupError):
    """No live pin has this id (never pinned, deleted, expired, or its model was unloaded)."""


@dataclass(frozen=True, slots=True)
class PinnedPrefix:
    """One pinned prefix of one engine, as the API reports it."""

    prefix_id: str  # "pfx-" + 24 hex digits, unique in the server
    model: str  # the engine's model name
    token_ids: list[int]  # the prefix; requests naming the pin start with these tokens
    messages: list[dict[str, str]] | None  # chat messages it was rendered from, if any
    owner: str  # tenant that pinned it ("anonymous" when auth is off)
    num_blocks: int  # full KV blocks pinned (num_pinned_tokens / block_size)
    num_pinned_tokens: int  # tokens whose KV is pinned; the rest (< one block) is recomputed
    ttl_s: float  # the TTL it was pinned with
    created_at: float  # time.time() when the pin was in place
    expires_at: float  # time.time() after which it is gone
    hits: int = 0  # requests that reused its blocks (from the worker's latest stats)
    cache_salt: str | None = None  # prefix-cache salt of its blocks (SamplingParams.cache_salt)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def describe(self) -> dict[str, object]:
        """The JSON object of the prefix API (`GET /v1/prefixes`)."""
        return {
            "id": self.prefix_id,
            "object": "prefix",
            "model": self.model,
            "owner": self.owner,
            "num_tokens": self.num_tokens,
            "num_pinned_tokens": self.num_pinned_tokens,
            "num_blocks": self.num_blocks,
            "from_messages": self.messages is not None,
            "ttl_s": self.ttl_s,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "hits": self.hits,
        }


@dataclass
class _Entry:
    prefix: PinnedPrefix
    hashes: list[BlockHash]
    live: bool = False  # False while the worker is still prefilling it


@dataclass
class PrefixRegistry:
    """The pins of one engine (see the module docstring)."""

    model: str
    block_size: int
    max_pinned_blocks: int
    max_model_len: int
    _entries: dict[str, _Entry] = field(default_factory=dict)

    def reserve(
        self,
        token_ids: Sequence[int],
        *,
        ttl_s: float,
        owner: str,
        messages: Sequence[dict[str, str]] | None,
        cache_salt: str | None = None,
        owner_limit_blocks: int | None = None,
    ) -> PinnedPrefix:
        """Validate, check the owner's share and the budget, record as pending; returns the
        pending prefix."""
        self._purge()
        ids = [int(t) for t in token_ids]
        if not 0 < ttl_s <= MAX_PREFIX_TTL_S:
            raise ValueError(f"ttl_s must be in (0, {MAX_PREFIX_TTL_S:.0f}]")
        if len(ids) < self.block_size:
            raise ValueError(f"a prefix needs at least {self.block_size} tokens, got {len(ids)}")
        if len(ids) > self.max_model_len - 2:
            raise ValueError(
                f"a prefix of {len(ids)} tokens leaves no room for a request "
                f"(max_model_len={self.max_model_len})"
            )
        prefix_id = f"pfx-{uuid.uuid4().hex[:24]}"
        hashes = block_hashes_of(ids, self.block_size, cache_salt)
        if owner_limit_blocks is not None:
            self._check_share(hashes, owner, owner_limit_blocks)
        used = {h for entry in self._entries.values() for h in entry.hashes}
        needed = len(used) + len(set(hashes) - used)
        if needed > self.max_pinned_blocks:
            raise PrefixBudgetError(
                f"pinning {len(hashes)} KV blocks ({len(hashes) * self.block_size} tokens) "
                f"would leave too little KV cache for serving: {len(used)} of at most "
                f"{self.max_pinned_blocks} blocks are pinned on model {self.model!r}"
            )
        now = time.time()
        prefix = PinnedPrefix(
            prefix_id=prefix_id,
            model=self.model,
            token_ids=ids,
            messages=[dict(m) for m in messages] if messages is not None else None,
            owner=owner,
            cache_salt=cache_salt,
            num_blocks=len(hashes),
            num_pinned_tokens=len(hashes) * self.block_size,
            ttl_s=ttl_s,
            created_at=now,
            expires_at=now + ttl_s,
        )
        self._entries[prefix_id] = _Entry(prefix, hashes)
        return prefix

    def _check_share(self, hashes: list[BlockHash], owner: str, limit: int) -> None:
        mine = {h for e in self._entries.values() if e.prefix.owner == owner for h in e.hashes}
        needed = len(mine) + len(set(hashes) - mine)
        if needed > limit:
            raise PrefixShareError(
                f"pinning {len(hashes)} KV blocks would exceed this tenant's share of the pin "
                f"budget of model {self.model!r}: its pins hold {len(mine)} of at most {limit} "
                f"blocks (of {self.max_pinned_blocks} for all tenants)"
            )

    def commit(self, prefix_id: str) -> PinnedPrefix:
        """The worker pinned it: live from now, TTL counted from now."""
        entry = self._entries[prefix_id]
        now = time.time()
        entry.prefix = replace(entry.prefix, created_at=now, expires_at=now + entry.prefix.ttl_s)
        entry.live = True
        return entry.prefix

    def drop(self, prefix_id: str) -> bool:
        """Forget a pending or live pin; False if unknown."""
        return self._entries.pop(prefix_id, None) is not None

    def get(self, prefix_id: str, hits: dict[str, int] | None = None) -> PinnedPrefix | None:
        """A live pin, with its hits from the worker's latest stats."""
        self._purge()
        entry = self._entries.get(prefix_id)
        if entry is None or not entry.live:
            return None
        return replace(entry.prefix, hits=(hits or {}).get(prefix_id, 0))

    def live(self, hits: dict[str, int] | None = None) -> list[PinnedPrefix]:
        """Every live pin, oldest first."""
        self._purge()
        return [
            replace(e.prefix, hits=(hits or {}).get(e.prefix.prefix_id, 0))
            for e in sorted(self._entries.values(), key=lambda e: e.prefix.created_at)
            if e.live
        ]

    def _purge(self) -> None:
        now = time.time()
        expired = [k for k, e in self._entries.items() if e.live and e.prefix.expires_at <= now]
        for prefix_id in expired:
            del self._entries[prefix_id]


class PinTransport(Protocol):
    """The part of core_client.EngineCoreClient that pinning uses (tests pass fakes)."""

    async def add_request(
        self, request: EngineRequest | PinPrefix, queue: OutputQueue | None = None
    ) -> AsyncIterator[EngineOutput]: ...

    async def abort(self, request_ids: list[str]) -> None: ...

    async def unpin_prefixes(self, prefix_ids: list[str]) -> None: ...

    def stats(self) -> SchedulerStats: ...

    @property
    def is_alive(self) -> bool: ...


class EnginePrefixes:
    """Pin, list and release the prefixes of one engine (`AsyncLLM.prefixes`).

    Every method runs on the event loop and never blocks; `pin` waits (asynchronously) for the
    worker to prefill the prefix.
    """

    def __init__(self, transport: PinTransport, registry: PrefixRegistry) -> None:
        self._transport = transport
        self._registry = registry

    @property
    def model(self) -> str:
        return self._registry.model

    @property
    def max_pinned_blocks(self) -> int:
        """The pin budget: most KV blocks all pins together may hold."""
        return self._registry.max_pinned_blocks

    @property
    def block_size(self) -> int:
        return self._registry.block_size

    @property
    def is_alive(self) -> bool:
        """False once the engine stopped (its pins are gone with it)."""
        return self._transport.is_alive

    def num_pinned_blocks(self) -> int:
        """KV blocks pinned now (the worker's latest stats)."""
        return self._transport.stats().num_pinned_blocks

    async def pin(
        self,
        token_ids: Sequence[int],
        *,
        ttl_s: float = DEFAULT_PREFIX_TTL_S,
        owner: str = "anonymous",
        messages: Sequence[dict[str, str]] | None = None,
        priority: int = 0,
        cache_salt: str | None = None,
        owner_limit_blocks: int | None = None,
    ) -> PinnedPrefix:
        """Prefill and pin `token_ids` (hashed with `cache_salt`); returns once the blocks are
        pinned. Raises ValueError (bad prefix or TTL), PrefixShareError (over the owner's
        `owner_limit_blocks`), PrefixBudgetError (over the pin budget), PrefixPinError (the
        engine failed it), EngineDeadError."""
        pending = self._registry.reserve(
            token_ids,
            ttl_s=ttl_s,
            owner=owner,
            messages=messages,
            cache_salt=cache_salt,
            owner_limit_blocks=owner_limit_blocks,
        )
        command = PinPrefix(
            request_id=f"pin-{pending.prefix_id}",
            prefix_id=pending.prefix_id,
            token_ids=pending.token_ids,
            ttl_s=ttl_s,
            priority=priority,
            cache_salt=cache_salt,
        )
        finished = False
        try:
            stream = await self._transport.add_request(command)
            async for output in stream:
                if output.finish_reason is None:
                    continue
                finished = True
                if output.finish_reason in (FinishReason.ERROR, FinishReason.ABORT):
                    raise PrefixPinError(output.error or f"pin {output.finish_reason.value}")
        except BaseException:
            self._registry.drop(pending.prefix_id)
            if not finished:
                with contextlib.suppress(Exception):
                    await self._transport.abort([command.request_id])
                    await self._transport.unpin_prefixes([pending.prefix_id])
            raise
        return self._registry.commit(pending.prefix_id)

    async def unpin(self, prefix_id: str) -> bool:
        """Release a pin now; False if there was none (or it expired)."""
        if self._registry.get(prefix_id) is None:
            return False
        self._registry.drop(prefix_id)
        await self._transport.unpin_prefixes([prefix_id])
        return True

    def list(self) -> list[PinnedPrefix]:
        """The live pins, oldest first, with their hits."""
        return self._registry.live(self._transport.stats().prefix_hits)

    def get(self, prefix_id: str) -> PinnedPrefix | None:
        """A live pin by id, with its hits."""
        return self._registry.get(prefix_id, self._transport.stats().prefix_hits)
