"""Prefix-cache salts and the per-owner share of the pin budget: requests of different
`cache_salt`s never share cached KV, pins hash their blocks with their salt, and the API-side
registry refuses an owner's pin past its share."""

from __future__ import annotations

import pytest

from modelyard.engine.block_hashes import block_hashes_of
from modelyard.engine.client.prefixes import PrefixBudgetError, PrefixRegistry, PrefixShareError
from modelyard.engine.core.kv_cache import KVCacheManager
from modelyard.engine.core.prefixes import PrefixPins
from modelyard.engine.core.request import Request
from modelyard.engine.messages import PinPrefix
from modelyard.engine.sampling_params import InvalidParamError, SamplingParams

pytestmark = pytest.mark.unit

BS = 4
TOKENS = list(range(100, 110))  # 10 tokens: 2 full blocks may be served from the cache


def _request(request_id: str, salt: str | None) -> Request:
    return Request(
        request_id=request_id,
        prompt_token_ids=TOKENS,
        sampling_params=SamplingParams(cache_salt=salt),
    )


def _run(kv: KVCacheManager, request: Request) -> int:
    """Admit the request, compute its prompt, return the tokens the cache served."""
    blocks, cached = kv.get_computed_blocks(request)
    assert kv.allocate_slots(request, request.num_tokens - cached, blocks)
    kv.cache_blocks(request, request.num_tokens)
    return cached


def test_only_requests_of_the_same_salt_share_cached_blocks() -> None:
    kv = KVCacheManager(num_blocks=32, block_size=BS, enable_prefix_caching=True)
    assert _run(kv, _request("a1", "a")) == 0
    assert _run(kv, _request("b1", "b")) == 0  # another salt: nothing shared
    assert _run(kv, _request("none", None)) == 0  # unsalted: nothing shared with salted ones
    assert _run(kv, _request("a2", "a")) == 2 * BS  # the same salt: shared
    assert _run(kv, _request("none2", None)) == 2 * BS


def test_a_pin_hashes_its_blocks_with_its_salt() -> None:
    kv = KVCacheManager(num_blocks=32, block_size=BS, enable_prefix_caching=True)
    pins = PrefixPins(kv, limit_blocks=8)
    command = PinPrefix(
        request_id="pin-1", prefix_id="pfx-1", token_ids=TOKENS, ttl_s=60, cache_salt="a"
    )
    prefill = pins.start(command)
    assert prefill.sampling_params.cache_salt == "a"  # its blocks enter the cache salted
    request = _request("a", "a")
    kv.get_computed_blocks(request)
    assert request.block_hashes == block_hashes_of(TOKENS, BS, "a")
    assert block_hashes_of(TOKENS, BS, "a") != block_hashes_of(TOKENS, BS, "b")
    assert block_hashes_of(TOKENS, BS) == block_hashes_of(TOKENS, BS, None)


def test_cache_salt_must_not_be_empty() -> None:
    with pytest.raises(InvalidParamError, match="cache_salt"):
        SamplingParams(cache_salt="").validate()


def test_an_owner_pins_at_most_its_share() -> None:
    registry = PrefixRegistry(model="m", block_size=BS, max_pinned_blocks=8, max_model_len=64)

    def pin(tokens: list[int], owner: str, salt: str | None = None) -> None:
        registry.reserve(
            tokens, ttl_s=60, owner=owner, messages=None, cache_salt=salt, owner_limit_blocks=4
        )

    pin(list(range(8)), "acme")  # 2 of acme's 4
    pin(list(range(12)), "acme")  # shares 2 with acme's first: 3 of 4
    with pytest.raises(PrefixShareError, match="share"):
        pin(list(range(50, 58)), "acme")  # 2 more: 5 of 4
    with pytest.raises(PrefixShareError):
        pin(list(range(8)), "acme", salt="x")  # salted blocks are other blocks
    pin(list(range(60, 76)), "globex")  # 4 of globex's 4: 7 of the budget's 8
    with pytest.raises(PrefixBudgetError):
        registry.reserve(list(range(80, 88)), ttl_s=60, owner="ops", messages=None)
