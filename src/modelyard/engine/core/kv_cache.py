"""KV cache block manager: block ids, ref counts, a free list and the prefix cache.

The manager owns no tensors: the model runner allocates `num_blocks` blocks of `block_size`
token slots and writes KV wherever the block table tells it. Here we only decide which block
ids a request uses.

Prefix caching (vLLM v1 style):
- Every FULL block whose KV is computed gets a hash of (parent block's hash, its token ids), so
  a hash names the whole prefix up to the end of that block, prompt or generated tokens alike.
  The first block's parent is the request's cache salt (its LoRA adapter and its
  `cache_salt`: engine/core/request.py), so requests of different adapters or salts never share KV.
- A new request looks up the hashes of its leading full blocks; hits are shared (ref count + 1)
  instead of recomputed. At least the last token is always left to compute, so the runner has
  logits to sample from.
- A block whose ref count drops to 0 keeps its hash and joins the free list in LRU order; it is
  evicted (hash dropped) only when the free list hands it out for a new allocation. Blocks with
  no hash are handed out before any cached one.

Pinned prefixes (CAG): `pin_cached` takes one extra reference on each block of a cached
prefix and counts it in the block's `pin_count`. A pinned block never reaches ref count 0, so
it never joins the free list and is never evicted, whatever the cache pressure; it counts as
used. `unpin` drops that reference again (the block stays cached, LRU-free, until reused).
Admissions whose prefix-cache hits include pinned blocks are counted as pinned hits.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from modelyard.engine.block_hashes import BlockHash, hash_block_tokens
from modelyard.engine.core.request import Request


class KVCacheBlock:
    """Bookkeeping for one physical KV block."""

    __slots__ = ("block_hash", "block_id", "pin_count", "ref_count")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id  # index into the runner's KV tensors
        self.ref_count = 0  # requests whose block table holds this block, plus pins
        self.pin_count = 0  # pinned prefixes that hold this block (each also holds a ref)
        self.block_hash: BlockHash | None = None  # set while the block is in the prefix cache

    def __repr__(self) -> str:
        cached = "cached" if self.block_hash is not None else "uncached"
        return f"KVCacheBlock({self.block_id}, ref={self.ref_count}, {cached})"


class KVCacheManager:
    """Hands out fixed-size KV blocks to requests and shares cached prefixes between them.

    A request's block table is `request.block_ids`; the manager appends to it and empties it.
    All methods are O(blocks touched); nothing here blocks or allocates memory for KV.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        if num_blocks < 1:
            raise ValueError("num_blocks must be >= 1")
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        # Block ids with ref count 0; the first is handed out first (uncached ones at the
        # front, cached ones behind them in the order they were freed: LRU).
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[BlockHash, int] = {}  # hash -> block id holding that prefix
        self._num_hashed_blocks: dict[str, int] = {}  # request id -> leading blocks done
        self.prefix_cache_queries = 0  # cumulative tokens looked up at admissions
        self.prefix_cache_hits = 0  # cumulative tokens served from the cache at admissions
        self.num_pinned_blocks = 0  # blocks with pin_count > 0
        self.pinned_hits = 0  # cumulative admissions that reused at least one pinned block
        # deepest pinned block of each pinned-hit admission -> admissions (per-prefix hits)
        self.pinned_hits_by_block: dict[int, int] = {}

    # ------------------------------------------------------------------ counters

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        """Blocks with ref count 0, cached or not."""
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by at least one request."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    @property
    def num_cached_blocks(self) -> int:
        """Blocks currently findable in the prefix cache (held or free)."""
        return len(self._cached)

    def cached_block_id(self, block_hash: BlockHash) -> int | None:
        """The block holding this prefix, if it is cached."""
        return self._cached.get(block_hash)

    # ------------------------------------------------------------------ pins

    def pin_cached(self, block_hashes: Sequence[BlockHash]) -> list[int]:
        """Pin the cached blocks of this chain of hashes, in order, stopping at the first one
        that is not cached; returns the pinned block ids (one reference each, to `unpin`)."""
        pinned: list[int] = []
        for block_hash in block_hashes:
            block_id = self._cached.get(block_hash)
            if block_id is None:
                break
            self._take_cached_block(block_id)
            block = self.blocks[block_id]
            block.pin_count += 1
            if block.pin_count == 1:
                self.num_pinned_blocks += 1
                self.pinned_hits_by_block.pop(block_id, None)
            pinned.append(block_id)
        return pinned

    def unpin(self, block_ids: Sequence[int]) -> None:
        """Drop the pin references taken by `pin_cached`; blocks reaching ref count 0 join the
        free list (still cached), the prefix's later blocks ahead of its earlier ones."""
        for block_id in reversed(block_ids):
            block = self.blocks[block_id]
            if block.pin_count < 1:
                raise ValueError(f"block {block_id} is not pinned")
            block.pin_count -= 1
            if block.pin_count == 0:
                self.num_pinned_blocks -= 1
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None

    def num_pinned_among(self, block_hashes: Sequence[BlockHash]) -> int:
        """How many of these hashes name a block that is cached and pinned now."""
        count = 0
        for block_hash in block_hashes:
            block_id = self._cached.get(block_hash)
            if block_id is not None and self.blocks[block_id].pin_count:
                count += 1
        return count

    # ------------------------------------------------------------------ prefix lookup

    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """Longest cached prefix of the request's tokens: (block ids, number of tokens).

        Pure lookup: takes no reference (pass the blocks to `allocate_slots`). The number of
        tokens is a multiple of block_size and at most num_tokens - 1.
        """
        if not self.enable_prefix_caching:
            return [], 0
        self._update_block_hashes(request)
        max_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[int] = []
        for block_hash in request.block_hashes[:max_blocks]:
            block_id = self._cached.get(block_hash)
            if block_id is None:
                break
            hits.append(block_id)
        return hits, len(hits) * self.block_size

    # ------------------------------------------------------------------ allocation

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: Sequence[int] = (),
    ) -> bool:
        """Make the block table cover positions up to num_computed + cached + num_new_tokens.

        `new_computed_blocks` are prefix-cache hits from `get_computed_blocks`, passed when
        the request is admitted (it then holds no blocks). Returns False, changing nothing,
        when the free list is too short.
        """
        num_cached_tokens = len(new_computed_blocks) * self.block_size
        total_tokens = request.num_computed_tokens + num_cached_tokens + num_new_tokens
        num_blocks_needed = -(-total_tokens // self.block_size)
        num_new_blocks = max(
            num_blocks_needed - len(request.block_ids) - len(new_computed_blocks), 0
        )
        # Cache hits with ref count 0 sit in the free list: taking them shortens it.
        num_revived = sum(1 for b in new_computed_blocks if self.blocks[b].ref_count == 0)
        if num_new_blocks + num_revived > self.num_free_blocks:
            return False

        if not request.block_ids and request.num_computed_tokens == 0:
            self._record_admission(request, new_computed_blocks)
        for block_id in new_computed_blocks:
            self._take_cached_block(block_id)
        request.block_ids.extend(new_computed_blocks)
        if new_computed_blocks:
            self._num_hashed_blocks[request.request_id] = len(new_computed_blocks)
        request.block_ids.extend(self._take_free_block() for _ in range(num_new_blocks))
        return True

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Enter the request's full blocks within its first `num_computed_tokens` tokens into
        the prefix cache.

        The scheduler calls this when it puts the tokens in a batch (as vLLM does), so that a
        request admitted later in the same step can share them: the runner writes every new
        K/V of a step before any attention reads the cache. If the batch does not run after
        all, `uncache_blocks` takes the entries back. When another block already caches the
        same prefix, it stays the cached one and this block stays private.
        """
        if not self.enable_prefix_caching:
            return
        num_full = min(num_computed_tokens // self.block_size, len(request.block_ids))
        start = self._num_hashed_blocks.get(request.request_id, 0)
        if num_full <= start:
            return
        self._update_block_hashes(request)
        for index in range(start, num_full):
            block_hash = request.block_hashes[index]
            block = self.blocks[request.block_ids[index]]
            if block.block_hash is None and block_hash not in self._cached:
                block.block_hash = block_hash
                self._cached[block_hash] = block.block_id
        self._num_hashed_blocks[request.request_id] = num_full

    def uncache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Take back the cache entries of the request's blocks past its first
        `num_computed_tokens` tokens: their KV will not be computed (the request left the
        batch, or the batch failed), so nobody may find them."""
        first = num_computed_tokens // self.block_size
        for block_id in request.block_ids[first:]:
            block = self.blocks[block_id]
            if block.block_hash is not None and self._cached.get(block.block_hash) == block_id:
                del self._cached[block.block_hash]
                block.block_hash = None
        hashed = self._num_hashed_blocks.get(request.request_id, 0)
        self._num_hashed_blocks[request.request_id] = min(hashed, first)

    def free(self, request: Request) -> None:
        """Drop the request's references; blocks reaching ref count 0 join the free list.

        The tail of the table is freed first so that, among blocks freed together, a prefix's
        later blocks are evicted before its earlier (more shareable) ones.
        """
        for block_id in reversed(request.block_ids):
            self._unref(block_id)
        request.block_ids = []
        self._num_hashed_blocks.pop(request.request_id, None)

    def trim(self, request: Request, num_tokens: int) -> None:
        """Drop the request's blocks past those covering its first `num_tokens` positions
        (speculative slots the target rejected). Those blocks hold no computed prefix, so
        none of them is in the prefix cache on the request's account."""
        keep = -(-num_tokens // self.block_size)
        for block_id in reversed(request.block_ids[keep:]):
            self._unref(block_id)
        del request.block_ids[keep:]

    # ------------------------------------------------------------------ internals

    def _record_admission(self, request: Request, new_computed_blocks: Sequence[int]) -> None:
        if not self.enable_prefix_caching:
            return
        self.prefix_cache_queries += request.num_tokens
        self.prefix_cache_hits += len(new_computed_blocks) * self.block_size
        if self.num_pinned_blocks:
            pinned = [b for b in new_computed_blocks if self.blocks[b].pin_count]
            if pinned:
                self.pinned_hits += 1
                deepest = pinned[-1]
                self.pinned_hits_by_block[deepest] = self.pinned_hits_by_block.get(deepest, 0) + 1

    def _unref(self, block_id: int) -> None:
        """One reference less; at 0 the block joins the free list (uncached ones in front)."""
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count == 0:
            self._free[block_id] = None
            if block.block_hash is None:
                self._free.move_to_end(block_id, last=False)

    def _take_cached_block(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self._free[block_id]
        block.ref_count += 1

    def _take_free_block(self) -> int:
        block_id, _ = self._free.popitem(last=False)
        block = self.blocks[block_id]
        if block.block_hash is not None:  # evict: the prefix it held is no longer findable
            if self._cached.get(block.block_hash) == block_id:
                del self._cached[block.block_hash]
            block.block_hash = None
        block.ref_count = 1
        return block_id

    def _update_block_hashes(self, request: Request) -> None:
        """Extend request.block_hashes to every full block of its current tokens."""
        size = self.block_size
        hashes = request.block_hashes
        tokens = request.all_token_ids
        for index in range(len(hashes), len(tokens) // size):
            parent = hashes[index - 1] if index else request.cache_salt
            hashes.append(hash_block_tokens(parent, tokens[index * size : (index + 1) * size]))
