import asyncio
import time

import pytest

from fakes.engine import FakeCore, start_fake_client
from modelyard.engine.client.protocol import EngineDeadError
from modelyard.engine.core import worker as worker_module
from modelyard.engine.messages import EngineRequest, FinishReason
from modelyard.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.unit


def request(rid: str, prompt: list[int], max_tokens: int = 3) -> EngineRequest:
    return EngineRequest(
        request_id=rid,
        prompt_token_ids=prompt,
        sampling_params=SamplingParams(max_tokens=max_tokens),
    )


async def test_outputs_are_routed_to_their_request() -> None:
    client, _ = await start_fake_client(FakeCore())
    try:
        a = await client.add_request(request("a", [1, 2], max_tokens=4))
        b = await client.add_request(request("b", [7, 8, 9], max_tokens=2))
        outs_a = [o async for o in a]
        outs_b = [o async for o in b]
        assert [t for o in outs_a for t in o.new_token_ids] == [1, 2, 1, 2]
        assert [t for o in outs_b for t in o.new_token_ids] == [7, 8]
        assert {o.request_id for o in outs_a} == {"a"}
        assert outs_a[-1].finish_reason is FinishReason.LENGTH
        assert outs_a[0].first_scheduled_time is not None
        assert client.num_in_flight() == 0
    finally:
        await client.shutdown()


async def test_duplicate_id_rejected_and_abort_ends_stream() -> None:
    core = FakeCore(step_delay_s=0.01)
    client, _ = await start_fake_client(core)
    try:
        stream = await client.add_request(request("x", [5], max_tokens=1000))
        with pytest.raises(ValueError, match="already in flight"):
            await client.add_request(request("x", [5]))
        first = await stream.__anext__()
        assert first.new_token_ids == [5]
        await client.abort(["x"])
        rest = [o async for o in stream]
        assert rest[-1].finish_reason is FinishReason.ABORT
        for _ in range(100):
            if "x" in core.aborted:
                break
            await asyncio.sleep(0.01)
        assert core.aborted == ["x"]
    finally:
        await client.shutdown()


async def test_heartbeat_refreshes_stats_while_idle() -> None:
    core = FakeCore(num_blocks=42)
    client, _ = await start_fake_client(core)
    try:
        await asyncio.sleep(0.7)
        assert client.stats().num_blocks == 42
        assert client.is_alive
    finally:
        await client.shutdown()


async def test_step_exception_fails_live_requests_and_keeps_serving() -> None:
    core = FakeCore()
    client, _ = await start_fake_client(core)
    try:
        core.fail_next_step = True
        outs = [o async for o in await client.add_request(request("bad", [1], max_tokens=5))]
        assert outs[-1].finish_reason is FinishReason.ERROR
        assert outs[-1].error is not None
        assert "boom" in outs[-1].error
        ok = [o async for o in await client.add_request(request("ok", [3], max_tokens=2))]
        assert ok[-1].finish_reason is FinishReason.LENGTH
        bad_prompt = [o async for o in await client.add_request(request("empty", []))]
        assert bad_prompt[-1].finish_reason is FinishReason.ERROR
        assert client.is_alive
    finally:
        await client.shutdown()


async def test_worker_death_fails_every_waiting_caller_quickly() -> None:
    core = FakeCore(step_delay_s=0.01, capacity=1)
    client, worker = await start_fake_client(core)
    streams = [await client.add_request(request(f"r{i}", [i + 1], 10**6)) for i in range(3)]
    await streams[0].__anext__()
    killed_at = time.monotonic()
    worker.kill()

    async def drain(stream: object) -> None:
        async for _ in stream:  # type: ignore[attr-defined]
            pass

    for stream in streams:
        with pytest.raises(EngineDeadError, match="exited"):
            await asyncio.wait_for(drain(stream), 2.0)
    assert time.monotonic() - killed_at < 2.0
    assert not client.is_alive
    with pytest.raises(EngineDeadError):
        await client.add_request(request("late", [1]))
    await client.shutdown()
    await client.shutdown()  # idempotent


async def test_worker_stuck_in_a_step_is_declared_dead_by_heartbeat_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a step pulses for MAX_STEP_S only: one stuck past it falls silent like a hung process
    monkeypatch.setattr(worker_module, "MAX_STEP_S", 0.3)
    core = FakeCore(step_delay_s=1.5)  # stuck well past the cap and the heartbeat timeout
    client, _ = await start_fake_client(core, heartbeat_timeout_s=0.5)
    try:
        stream = await client.add_request(request("slow", [1], max_tokens=2))
        with pytest.raises(EngineDeadError, match="no message"):
            await asyncio.wait_for(stream.__anext__(), 2.0)
        assert not client.is_alive
    finally:
        await client.shutdown()


async def test_shutdown_stops_worker_and_fails_in_flight() -> None:
    core = FakeCore(capacity=0)  # nothing is ever scheduled
    client, worker = await start_fake_client(core)
    stream = await client.add_request(request("w", [1]))
    await client.shutdown()
    assert worker.exitcode == 0
    assert not worker.is_alive()
    with pytest.raises(EngineDeadError, match="shut down"):
        await stream.__anext__()
