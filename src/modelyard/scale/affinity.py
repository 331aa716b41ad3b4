"""Prefix affinity: which LLM replica should serve a prompt. Pure CPU code, no Ray.

Policy, for one request with prompt token ids, an optional session id and an optional LoRA
adapter:

1. **Keys.** The prompt's full blocks of `block_size` tokens (the engine's KV block size) are
   hashed as a chain, `h_i = hash(h_{i-1}, block_i)`, as the engine's prefix cache hashes them,
   for at most `max_blocks` leading blocks. With an adapter the chain starts from the adapter's
   salt (the engine shares KV only among requests of one adapter registration), and the
   adapter's name adds a key. A session id adds one more key.
2. **Preference.** The session key is looked up first; then the block keys from the longest
   prefix to the shortest; then the adapter key (a replica that holds the adapter's weights).
   The first key found names the replica that served it last, or the replica that holds a
   pinned prefix through it (a pin outranks what served the key last); a replica that is no
   longer a candidate (dead, scaled down) is skipped.
3. **Load guard.** The preferred replica is chosen only if its queue is at most `max_queue_gap`
   requests longer than the least loaded candidate's. Otherwise the caller falls back to power
   of two choices among the candidates.
4. **New prefixes.** A prompt with at least one full block and no preference goes to the
   replica that owns the fewest keys of the table (the least cached, as SGLang's cache-aware
   router sends a miss to its smallest tree), among the candidates within `max_queue_gap` of the
   shortest queue; when several own equally few (or one replica is that close), the caller
   falls back to power of two choices.
   So distinct prefixes spread evenly over the replicas' caches instead of by the queue lengths
   of the moment. Prompts shorter than a block always fall back.
5. **Record.** Once routed, every key of the request points at the replica that got it (and
   becomes the most recently used). The table is bounded: past `capacity` keys the least recently
   used are forgotten.
6. **Pins.** A pin (`KeyUse.PIN`) is routed as a request with its prefix, then holds its keys on
   the replica that got it until its TTL passes or that replica is gone: neither newer routes
   nor the table's bound move them. (An unpin is a broadcast the table does not see: the keys
   then point at a replica that very likely still caches the prefix, until the TTL.)

A table lives in the process that routes (each ingress replica has its own); a forgotten or
stale entry only costs a cache miss in the engine, never a wrong answer.
"""

from __future__ import annotations

import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

_SESSION_SALT = "modelyard-session"
_ADAPTER_SALT = "modelyard-lora"


class KeyUse(Enum):
    """What routing a call does to the table (policy steps 5 and 6)."""

    SERVE = "serve"  # a request: record its keys
    PIN = "pin"  # a pin: record its keys and hold them on the replica


def prefix_keys(
    token_ids: Sequence[int], block_size: int, max_blocks: int, salt: str | None = None
) -> list[int]:
    """Chained hashes of the leading full blocks, shortest prefix first (the chain starts from
    `salt` when given: an adapter's KV is not the base model's)."""
    keys: list[int] = []
    parent = 0 if salt is None else hash(salt)
    for start in range(0, min(len(token_ids) // block_size, max_blocks) * block_size, block_size):
        parent = hash((parent, tuple(token_ids[start : start + block_size])))
        keys.append(parent)
    return keys


def session_key(session_id: str) -> int:
    return hash((_SESSION_SALT, session_id))


def adapter_key(adapter_name: str) -> int:
    return hash((_ADAPTER_SALT, adapter_name))


@dataclass(frozen=True, slots=True)
class RoutingKeys:
    """What the table knows a call by."""

    prefix: list[int]  # block-chain hashes, shortest prefix first
    session: int | None = None  # session key when the request named a session
    adapter: int | None = None  # adapter key when the request runs with a LoRA adapter
    use: KeyUse = KeyUse.SERVE  # what routing it does to the table
    pin_id: str | None = None  # with PIN: the pin it makes
    ttl_s: float = 0.0  # with PIN: the pin's TTL

    def lookup_order(self) -> list[int]:
        """Session first, then longest prefix to shortest, then the adapter."""
        head = [self.session] if self.session is not None else []
        tail = [self.adapter] if self.adapter is not None else []
        return head + self.prefix[::-1] + tail

    def all(self) -> list[int]:
        return self.lookup_order()


@dataclass(slots=True)
class _Pin:
    replica: str
    keys: list[int]
    expires_at: float  # clock() value


class PrefixAffinity:
    """The bounded key -> replica table and the choice rule (see the module docstring)."""

    def __init__(
        self,
        *,
        capacity: int = 8192,
        max_queue_gap: int = 4,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity < 1 or max_queue_gap < 0:
            raise ValueError("capacity must be >= 1 and max_queue_gap >= 0")
        self.capacity = capacity
        self.max_queue_gap = max_queue_gap
        self._clock = clock
        self._table: OrderedDict[int, str] = OrderedDict()
        self._owned: Counter[str] = Counter()  # replica -> keys of the table that name it
        self._pins: dict[str, _Pin] = {}  # pin id -> where its keys are held
        self._pinned: dict[int, str] = {}  # key -> replica, over the live pins

    def __len__(self) -> int:
        return len(self._table)

    def owned(self, replica: str) -> int:
        """How many keys of the table name `replica` (its share of the cached prefixes)."""
        return self._owned[replica]

    def preferred(self, keys: RoutingKeys, candidates: Mapping[str, int]) -> str | None:
        """The replica that pins or served the longest known key, if it is still a candidate."""
        self._expire_pins()
        for key in keys.lookup_order():
            replica = self._pinned.get(key) or self._table.get(key)
            if replica is not None and replica in candidates:
                return replica
        return None

    def choose(self, keys: RoutingKeys, queue_lens: Mapping[str, int]) -> str | None:
        """The preferred replica if the load guard allows it; for a new prefix the least
        cached replica; else None (fall back).

        `queue_lens`: every candidate replica's queue length (ongoing requests)."""
        if not queue_lens:
            return None
        shortest = min(queue_lens.values())
        replica = self.preferred(keys, queue_lens)
        if replica is not None:
            return replica if queue_lens[replica] - shortest <= self.max_queue_gap else None
        if not keys.prefix:
            return None
        near = [r for r, n in queue_lens.items() if n - shortest <= self.max_queue_gap]
        if len(near) < 2:
            return None
        fewest = min(self._owned[r] for r in near)
        least_cached = [r for r in near if self._owned[r] == fewest]
        return least_cached[0] if len(least_cached) == 1 else None

    def routed(self, keys: RoutingKeys, replica: str) -> None:
        """A call went to `replica`: record its keys, and pin them for a PIN."""
        self.record(keys, replica)
        if keys.use is KeyUse.PIN and keys.pin_id is not None:
            self.pin(keys.pin_id, keys.prefix, replica, keys.ttl_s)

    def pin(self, pin_id: str, prefix: list[int], replica: str, ttl_s: float) -> None:
        """Hold these keys on `replica` for `ttl_s` seconds."""
        self._pins[pin_id] = _Pin(replica, list(prefix), self._clock() + ttl_s)
        self._index_pins()

    def pinned_replica(self, key: int) -> str | None:
        """The replica a live pin holds `key` on."""
        self._expire_pins()
        return self._pinned.get(key)

    def record(self, keys: RoutingKeys, replica: str) -> None:
        """Point every key at `replica` (most recently used); forget the oldest past capacity."""
        for key in keys.all():
            previous = self._table.get(key)
            if previous != replica:
                if previous is not None:
                    self._disown(previous)
                self._owned[replica] += 1
            self._table[key] = replica
            self._table.move_to_end(key)
        while len(self._table) > self.capacity:
            _, oldest = self._table.popitem(last=False)
            self._disown(oldest)

    def forget_replica(self, replica: str) -> None:
        """Drop every key and pin of a replica that is gone."""
        for key in [k for k, r in self._table.items() if r == replica]:
            del self._table[key]
        self._owned.pop(replica, None)
        for pin_id in [p for p, pin in self._pins.items() if pin.replica == replica]:
            del self._pins[pin_id]
        self._index_pins()

    def _expire_pins(self) -> None:
        now = self._clock()
        expired = [p for p, pin in self._pins.items() if pin.expires_at <= now]
        for pin_id in expired:
            del self._pins[pin_id]
        if expired:
            self._index_pins()

    def _index_pins(self) -> None:
        """key -> replica over the live pins (the newest pin wins a key two pins share)."""
        self._pinned = {key: pin.replica for pin in self._pins.values() for key in pin.keys}

    def _disown(self, replica: str) -> None:
        self._owned[replica] -= 1
        if not self._owned[replica]:
            del self._owned[replica]
