"""Pinned prefixes from the API side: AsyncLLM.prefixes over the worker loop with a fake core
(the commands travel through the real client, codec and worker loop)."""

from __future__ import annotations

import asyncio

import pytest
from tiny_tokenizer import build_tokenizer

from fakes.engine import FakeCore, start_fake_client
from modelyard.engine.client.async_llm import AsyncLLM
from modelyard.engine.client.prefixes import PrefixBudgetError, PrefixPinError, PrefixRegistry

pytestmark = pytest.mark.unit

PREFIX = list(range(10, 44))  # 34 tokens: 2 full blocks of 16


async def make_llm(core: FakeCore) -> AsyncLLM:
    client, _ = await start_fake_client(core)
    return AsyncLLM(client, build_tokenizer(), model_name="fake")


async def test_pin_list_unpin_through_the_worker_loop() -> None:
    core = FakeCore()
    llm = await make_llm(core)
    try:
        pinned = await llm.prefixes.pin(PREFIX[:20], ttl_s=60, owner="acme")
        assert (pinned.num_blocks, pinned.num_pinned_tokens, pinned.owner) == (1, 16, "acme")
        assert core.pinned == [pinned.prefix_id]
        assert core.added[-1].prompt_token_ids == PREFIX[:20]
        assert core.added[-1].sampling_params.max_tokens == 1
        assert [p.prefix_id for p in llm.prefixes.list()] == [pinned.prefix_id]
        assert pinned.expires_at - pinned.created_at == pytest.approx(60)
        assert await llm.prefixes.unpin(pinned.prefix_id)
        assert not await llm.prefixes.unpin(pinned.prefix_id)
        for _ in range(200):  # the worker thread applies the command at its next turn
            if core.unpinned:
                break
            await asyncio.sleep(0.01)
        assert core.unpinned == [pinned.prefix_id]
        assert llm.prefixes.list() == []
    finally:
        await llm.shutdown()


async def test_refusals_leave_no_pin_behind() -> None:
    core = FakeCore(max_pinned_blocks=4)
    llm = await make_llm(core)
    try:
        await llm.prefixes.pin(PREFIX, ttl_s=60)  # 2 of 4 blocks
        with pytest.raises(PrefixBudgetError, match="too little KV cache"):
            await llm.prefixes.pin(list(range(100, 148)), ttl_s=60)  # +3 blocks
        assert len(core.pinned) == 1
        await llm.prefixes.pin([*PREFIX[:32], *range(200, 216)], ttl_s=60)  # shares 2: +1
        core.fail_pins = True
        with pytest.raises(PrefixPinError, match="pin refused"):
            await llm.prefixes.pin(list(range(300, 316)), ttl_s=60)
        assert len(llm.prefixes.list()) == 2
        with pytest.raises(ValueError, match="at least 16"):
            await llm.prefixes.pin([1, 2, 3], ttl_s=60)
        with pytest.raises(ValueError, match="ttl_s"):
            await llm.prefixes.pin(PREFIX, ttl_s=0)
    finally:
        await llm.shutdown()
    assert not llm.prefixes.is_alive


def test_registry_drops_pins_past_their_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr("modelyard.engine.client.prefixes.time.time", lambda: now[0])
    registry = PrefixRegistry(model="m", block_size=16, max_pinned_blocks=8, max_model_len=64)
    pending = registry.reserve(PREFIX, ttl_s=10, owner="a", messages=None)
    assert registry.live() == []  # pending until the engine answers
    registry.commit(pending.prefix_id)
    assert registry.get(pending.prefix_id, {pending.prefix_id: 3}).hits == 3  # type: ignore[union-attr]
    now[0] += 9.9
    assert len(registry.live()) == 1
    now[0] += 0.2
    assert registry.live() == []
    assert registry.get(pending.prefix_id) is None
