"""KVCacheManager: block accounting, ref counts, prefix-cache hashing, hits and LRU eviction."""

import hashlib
from array import array

import pytest

from modelyard.engine.block_hashes import hash_block_tokens
from modelyard.engine.core.kv_cache import KVCacheManager
from modelyard.engine.core.request import Request
from modelyard.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.unit

BS = 4


def make_request(request_id: str, tokens: list[int]) -> Request:
    return Request(request_id=request_id, prompt_token_ids=tokens, sampling_params=SamplingParams())


def admit(kv: KVCacheManager, request: Request) -> int:
    """Admit with prefix lookup, compute the whole prompt, register its full blocks."""
    blocks, num_cached = kv.get_computed_blocks(request)
    assert kv.allocate_slots(request, request.num_tokens - num_cached, blocks)
    request.num_computed_tokens = request.num_tokens
    kv.cache_blocks(request, request.num_computed_tokens)
    return num_cached


def reference_hash(parent: bytes | None, tokens: list[int]) -> bytes:
    digest = hashlib.blake2b(parent or b"", digest_size=16)
    digest.update(array("q", tokens).tobytes())
    return digest.digest()


def test_allocate_and_free_return_blocks() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=BS, enable_prefix_caching=False)
    request = make_request("a", list(range(10)))
    assert kv.allocate_slots(request, 10)
    assert len(request.block_ids) == 3  # ceil(10 / 4)
    assert len(set(request.block_ids)) == 3
    assert kv.num_free_blocks == 5
    assert kv.usage == pytest.approx(3 / 8)
    request.num_computed_tokens = 10
    assert kv.allocate_slots(request, 2)  # positions 10, 11 still fit block 3
    assert len(request.block_ids) == 3
    assert kv.allocate_slots(request, 3)  # position 12 needs a 4th block
    assert len(request.block_ids) == 4
    kv.free(request)
    assert request.block_ids == []
    assert kv.num_free_blocks == 8
    assert kv.usage == 0.0


def test_allocate_fails_without_side_effects() -> None:
    kv = KVCacheManager(num_blocks=2, block_size=BS, enable_prefix_caching=True)
    request = make_request("a", list(range(9)))
    assert not kv.allocate_slots(request, 9)  # needs 3 blocks
    assert request.block_ids == []
    assert kv.num_free_blocks == 2
    assert kv.prefix_cache_queries == 0


def test_hash_chain_matches_reference_and_depends_on_parent() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=BS, enable_prefix_caching=True)
    tokens = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    request = make_request("a", tokens)
    admit(kv, request)
    expected_first = reference_hash(None, tokens[0:4])
    expected_second = reference_hash(expected_first, tokens[4:8])
    assert request.block_hashes == [expected_first, expected_second]
    assert hash_block_tokens(None, tokens[0:4]) == expected_first
    # Same tokens under another parent name another prefix.
    assert hash_block_tokens(expected_first, tokens[0:4]) != expected_first
    assert kv.cached_block_id(expected_first) == request.block_ids[0]
    assert kv.cached_block_id(expected_second) == request.block_ids[1]
    assert kv.num_cached_blocks == 2  # the partial third block is not cached


def test_only_computed_full_blocks_are_cached() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=BS, enable_prefix_caching=True)
    request = make_request("a", list(range(12)))
    assert kv.allocate_slots(request, 6)  # a first chunk of 6 tokens
    kv.cache_blocks(request, 6)
    assert kv.num_cached_blocks == 1
    request.num_computed_tokens = 6
    assert kv.allocate_slots(request, 6)
    kv.cache_blocks(request, 12)
    assert kv.num_cached_blocks == 3


def test_shared_prefix_hits_share_blocks_and_count_tokens() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=BS, enable_prefix_caching=True)
    system = list(range(100, 108))  # two full blocks
    first = make_request("a", [*system, 1, 2, 3])
    second = make_request("b", [*system, 4, 5])
    assert admit(kv, first) == 0
    assert admit(kv, second) == 8
    assert second.block_ids[:2] == first.block_ids[:2]
    assert second.block_ids[2] != first.block_ids[2]
    assert [kv.blocks[b].ref_count for b in first.block_ids] == [2, 2, 1]
    assert kv.prefix_cache_queries == 11 + 10
    assert kv.prefix_cache_hits == 8
    assert kv.num_free_blocks == 16 - 4
    kv.free(first)
    assert [kv.blocks[b].ref_count for b in second.block_ids] == [1, 1, 1]
    assert kv.num_free_blocks == 16 - 3


def test_fully_cached_prompt_still_computes_last_token() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=BS, enable_prefix_caching=True)
    tokens = list(range(8))  # exactly two full blocks
    admit(kv, make_request("a", tokens))
    blocks, num_cached = kv.get_computed_blocks(make_request("b", tokens))
    assert num_cached == 4  # capped at num_tokens - 1, rounded down to a block
    assert len(blocks) == 1
    blocks, num_cached = kv.get_computed_blocks(make_request("c", [*tokens, 99]))
    assert num_cached == 8


def test_freed_blocks_stay_cached_and_are_evicted_lru() -> None:
    kv = KVCacheManager(num_blocks=6, block_size=BS, enable_prefix_caching=True)
    old = make_request("old", [*range(0, 8), 1])  # blocks: 2 cached + 1 partial
    new = make_request("new", [*range(50, 58), 1])
    admit(kv, old)
    admit(kv, new)
    old_hashes, new_hashes = list(old.block_hashes), list(new.block_hashes)
    kv.free(old)
    kv.free(new)  # freed after old: more recently used
    assert kv.num_free_blocks == 6
    assert kv.num_cached_blocks == 4
    # A revisit of "old" hits although nobody holds those blocks.
    _, num_cached = kv.get_computed_blocks(make_request("old2", [*range(0, 8), 7]))
    assert num_cached == 8
    # 2 uncached blocks (the partial ones) are handed out first, then the LRU cached ones:
    # old's blocks go before new's, and old's tail block before its head.
    filler = make_request("filler", list(range(1000, 1013)))
    assert kv.allocate_slots(filler, 13)  # 4 blocks
    assert kv.cached_block_id(old_hashes[0]) is None
    assert kv.cached_block_id(old_hashes[1]) is None
    assert kv.cached_block_id(new_hashes[0]) is not None
    assert kv.cached_block_id(new_hashes[1]) is not None
    _, num_cached = kv.get_computed_blocks(make_request("new2", [*range(50, 58), 3]))
    assert num_cached == 8


def test_taking_a_free_cached_block_counts_against_the_free_list() -> None:
    kv = KVCacheManager(num_blocks=3, block_size=BS, enable_prefix_caching=True)
    first = make_request("a", list(range(9)))  # 3 blocks, 2 cached
    admit(kv, first)
    kv.free(first)
    hog = make_request("hog", [7])
    assert kv.allocate_slots(hog, 1)  # takes the one uncached free block
    second = make_request("b", [*range(8), 42, 43])
    blocks, num_cached = kv.get_computed_blocks(second)
    assert num_cached == 8
    # 2 revived + 1 new block needed, only 2 free: refused, nothing taken.
    assert not kv.allocate_slots(second, 2, blocks)
    assert kv.num_free_blocks == 2
    assert all(kv.blocks[b].ref_count == 0 for b in blocks)
    kv.free(hog)
    assert kv.allocate_slots(second, 2, blocks)
    assert second.block_ids[:2] == blocks
    assert kv.num_free_blocks == 0


def test_generated_tokens_fill_cacheable_blocks() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=BS, enable_prefix_caching=True)
    request = make_request("a", [1, 2, 3])
    admit(kv, request)
    for token in (4, 5, 6):
        request.append_output_token(token)
        assert kv.allocate_slots(request, 1)
        request.num_computed_tokens += 1
        kv.cache_blocks(request, request.num_computed_tokens)
    # Tokens 1..6 known, KV computed for 1..5 + now 6: first block [1,2,3,4] is cached.
    assert request.block_hashes[0] == reference_hash(None, [1, 2, 3, 4])
    assert kv.cached_block_id(request.block_hashes[0]) == request.block_ids[0]


def test_same_prefix_computed_twice_keeps_first_cached() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=BS, enable_prefix_caching=True)
    tokens = list(range(5))
    first, second = make_request("a", tokens), make_request("b", tokens)
    for request in (first, second):  # both admitted before either computed its KV
        assert kv.allocate_slots(request, 5)
    for request in (first, second):
        request.num_computed_tokens = 5
        kv.cache_blocks(request, 5)
    assert kv.cached_block_id(first.block_hashes[0]) == first.block_ids[0]
    assert kv.num_cached_blocks == 1
    kv.free(first)
    kv.free(second)
    assert kv.num_free_blocks == 8
    _, num_cached = kv.get_computed_blocks(make_request("c", tokens))
    assert num_cached == 4


def test_uncache_withdraws_blocks_that_will_not_be_computed() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=BS, enable_prefix_caching=True)
    request = make_request("a", list(range(10)))
    assert kv.allocate_slots(request, 10)
    kv.cache_blocks(request, 10)  # published when scheduled
    assert kv.num_cached_blocks == 2
    kv.uncache_blocks(request, 5)  # only block 0 was really computed
    assert kv.cached_block_id(request.block_hashes[0]) == request.block_ids[0]
    assert kv.cached_block_id(request.block_hashes[1]) is None
    kv.cache_blocks(request, 10)  # scheduled again later: published again
    assert kv.cached_block_id(request.block_hashes[1]) == request.block_ids[1]


def test_prefix_caching_disabled() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=BS, enable_prefix_caching=False)
    admit(kv, make_request("a", list(range(9))))
    assert kv.get_computed_blocks(make_request("b", list(range(9)))) == ([], 0)
    assert kv.num_cached_blocks == 0
    assert kv.prefix_cache_queries == 0


@pytest.mark.parametrize(("num_blocks", "block_size"), [(0, 4), (4, 0)])
def test_rejects_bad_sizes(num_blocks: int, block_size: int) -> None:
    with pytest.raises(ValueError):
        KVCacheManager(num_blocks=num_blocks, block_size=block_size, enable_prefix_caching=True)
