"""Pinned prefixes in the engine: the KV manager's pin counts and EngineCore's pin lifecycle,
driven with test_core's FakeKVRunner (which checks every KV slot a step reads)."""

from __future__ import annotations

import pytest
from test_engine_core import BS, FakeKVRunner, make_request

from modelyard.engine.block_hashes import block_hashes_of
from modelyard.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from modelyard.engine.core.engine_core import EngineCore
from modelyard.engine.core.kv_cache import KVCacheManager
from modelyard.engine.core.prefixes import PrefixBudgetError, pin_limit_blocks
from modelyard.engine.core.request import Request
from modelyard.engine.messages import EngineOutput, FinishReason, PinPrefix
from modelyard.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.unit

PREFIX = list(range(300, 318))  # 18 tokens: 4 full blocks of 4 + 2 tokens


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_core(
    num_blocks: int = 32, max_model_len: int = 32, clock: Clock | None = None
) -> tuple[EngineCore, FakeKVRunner]:
    runner = FakeKVRunner(num_kv_blocks=num_blocks, max_model_len=max_model_len)
    config = EngineConfig(
        model=ModelConfig(model="fake"),
        cache=CacheConfig(block_size=BS, max_pinned_fraction=0.5),
        scheduler=SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64),
    )
    return EngineCore(config, runner, clock=clock or Clock()), runner


def run(core: EngineCore) -> dict[str, EngineOutput]:
    """Step until idle; the last output of every request."""
    last: dict[str, EngineOutput] = {}
    for _ in range(500):
        if not core.has_unfinished_requests():
            return last
        for output in core.step():
            last[output.request_id] = output
    raise AssertionError("no progress")


def pin(core: EngineCore, prefix_id: str, tokens: list[int], ttl_s: float = 60.0) -> EngineOutput:
    core.pin_prefix(
        PinPrefix(request_id=f"pin-{prefix_id}", prefix_id=prefix_id, token_ids=tokens, ttl_s=ttl_s)
    )
    return run(core)[f"pin-{prefix_id}"]


def ask(core: EngineCore, request_id: str, prompt: list[int], max_tokens: int = 3) -> EngineOutput:
    """Run one request alone; its last output (carries num_cached_tokens)."""
    core.add_request(make_request(request_id, prompt, max_tokens))
    return run(core)[request_id]


# ---------------------------------------------------------------- KV manager


def test_pinned_blocks_leave_the_free_list_and_come_back_on_unpin() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=BS, enable_prefix_caching=True)
    request = Request(request_id="a", prompt_token_ids=PREFIX, sampling_params=SamplingParams())
    assert kv.allocate_slots(request, len(PREFIX))
    kv.cache_blocks(request, len(PREFIX))
    kv.free(request)
    assert kv.num_free_blocks == 8  # freed, still cached
    pinned = kv.pin_cached(block_hashes_of(PREFIX, BS))
    assert len(pinned) == 4
    assert kv.num_pinned_blocks == 4
    assert kv.num_free_blocks == 4
    assert all(kv.blocks[b].pin_count == 1 and kv.blocks[b].ref_count == 1 for b in pinned)
    kv.unpin(pinned)
    assert kv.num_pinned_blocks == 0
    assert kv.num_free_blocks == 8
    assert kv.num_cached_blocks == 4  # unpinned blocks stay findable until reused
    with pytest.raises(ValueError, match="not pinned"):
        kv.unpin(pinned[:1])


def test_pin_cached_stops_at_the_first_uncached_block() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=BS, enable_prefix_caching=True)
    assert kv.pin_cached(block_hashes_of(PREFIX, BS)) == []


def test_pin_limit_keeps_room_for_a_full_context_request() -> None:
    assert pin_limit_blocks(100, 16, 512, 0.5) == 50
    assert pin_limit_blocks(40, 16, 512, 0.5) == 8  # 40 - 32 blocks of one full context
    assert pin_limit_blocks(32, 16, 512, 0.5) == 0


# ---------------------------------------------------------------- EngineCore


def test_later_requests_prefill_only_their_own_tokens() -> None:
    core, _ = make_core()
    done = pin(core, "kb", PREFIX)
    assert done.finish_reason == FinishReason.LENGTH
    stats = core.stats()
    assert (stats.num_pinned_blocks, stats.num_pinned_prefixes) == (4, 1)
    for i in range(3):
        own = [900 + 10 * i, 901 + 10 * i, 902 + 10 * i]
        before = core.stats().num_computed_tokens
        out = ask(core, f"q{i}", [*PREFIX, *own], max_tokens=3)
        assert out.num_cached_tokens == 16  # the 4 pinned blocks
        computed = core.stats().num_computed_tokens - before
        # the prefix's 2-token tail + its own 3 tokens, then 2 decode steps
        assert computed == (len(PREFIX) - 16 + len(own)) + 2
    stats = core.stats()
    assert stats.pinned_prefix_hits == 3
    assert stats.prefix_hits == {"kb": 3}


def test_pins_survive_pressure_that_evicts_everything_else() -> None:
    core, runner = make_core(num_blocks=32, max_model_len=32)
    other = list(range(700, 718))  # cached, but not pinned: the control
    pin(core, "kb", PREFIX)
    ask(core, "warm", [*other, 1], max_tokens=1)
    # 28 requests of 28 distinct tokens: each needs 7-8 blocks, more than the 28 unpinned
    # blocks can keep cached together, so every unpinned cached block is evicted
    for i in range(28):
        core.add_request(make_request(f"p{i}", list(range(2000 + 40 * i, 2028 + 40 * i)), 3))
    run(core)
    assert core.stats().num_pinned_blocks == 4
    assert ask(core, "control", [*other, 5], max_tokens=1).num_cached_tokens == 0
    out = ask(core, "after", [*PREFIX, 5, 6], max_tokens=2)
    assert out.num_cached_tokens == 16  # the runner checked these slots still hold PREFIX
    assert runner.num_steps > 28


def test_ttl_expiry_releases_the_blocks() -> None:
    clock = Clock()
    core, _ = make_core(clock=clock)
    pin(core, "kb", PREFIX, ttl_s=30.0)
    free_pinned = core.stats().num_free_blocks
    clock.now += 29.0
    core.expire_pins()
    assert core.stats().num_pinned_prefixes == 1
    clock.now += 2.0
    core.expire_pins()
    stats = core.stats()
    assert (stats.num_pinned_blocks, stats.num_pinned_prefixes, stats.prefix_hits) == (0, 0, {})
    assert stats.num_free_blocks == free_pinned + 4


def test_unpin_releases_and_unknown_ids_are_ignored() -> None:
    core, _ = make_core()
    pin(core, "kb", PREFIX)
    core.unpin_prefixes(["kb", "nope"])
    assert core.stats().num_pinned_blocks == 0


def test_pin_over_budget_is_refused_before_prefill() -> None:
    core, runner = make_core(num_blocks=40, max_model_len=64)  # limit: 20 blocks
    assert core.prefixes.limit_blocks == 20
    pin(core, "a", list(range(100, 132)))  # 8 blocks
    pin(core, "b", list(range(100, 132)) + list(range(400, 418)))  # shares a's 8: +4
    assert core.stats().num_pinned_blocks == 12
    steps = runner.num_steps
    with pytest.raises(PrefixBudgetError, match="pin budget"):
        core.pin_prefix(
            PinPrefix(request_id="pin-c", prefix_id="c", token_ids=list(range(50, 90)), ttl_s=9)
        )
    assert not core.has_unfinished_requests()
    assert runner.num_steps == steps
    pin(core, "d", list(range(50, 82)))  # exactly the 8 blocks left
    assert core.stats().num_pinned_blocks == 20


def test_invalid_pins_are_refused() -> None:
    core, _ = make_core()
    pin(core, "kb", PREFIX)
    with pytest.raises(ValueError, match="already pinned"):
        core.pin_prefix(PinPrefix(request_id="x", prefix_id="kb", token_ids=PREFIX, ttl_s=9))
    with pytest.raises(ValueError, match="at least"):
        core.pin_prefix(PinPrefix(request_id="y", prefix_id="s", token_ids=[1, 2], ttl_s=9))
    with pytest.raises(ValueError, match="tokens"):  # longer than the context
        core.pin_prefix(
            PinPrefix(request_id="z", prefix_id="l", token_ids=list(range(40)), ttl_s=9)
        )
    assert not core.has_unfinished_requests()
    core.pin_prefix(PinPrefix(request_id="z", prefix_id="l", token_ids=PREFIX[:8], ttl_s=9))


def test_aborted_pin_pins_nothing() -> None:
    core, _ = make_core()
    core.pin_prefix(PinPrefix(request_id="pin-kb", prefix_id="kb", token_ids=PREFIX, ttl_s=9))
    core.abort_requests(["pin-kb"])
    run(core)
    assert core.stats().num_pinned_prefixes == 0
    pin(core, "kb", PREFIX)  # the id is free again
    assert core.stats().num_pinned_prefixes == 1
