"""ReadDeadline: one timer bounds every read of a request's outputs (api.generation)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from modelyard.api.generation import ReadDeadline
from modelyard.engine.client.protocol import RequestOutput

pytestmark = pytest.mark.unit


async def _outputs(delays: list[float]) -> AsyncIterator[RequestOutput]:
    """Yields its index after each delay (stand-ins for RequestOutputs)."""
    for index, delay in enumerate(delays):
        await asyncio.sleep(delay)
        yield cast(RequestOutput, index)


def _deadline_in(seconds: float) -> ReadDeadline:
    return ReadDeadline(asyncio.get_running_loop().time() + seconds)


def _timers() -> int:
    loop: Any = asyncio.get_running_loop()
    return sum(not handle.cancelled() for handle in loop._scheduled)


async def test_reads_before_the_deadline_use_one_timer() -> None:
    deadline = _deadline_in(5.0)
    iterator = _outputs([0.0] * 50)
    got = [await deadline.read(iterator) for _ in range(50)]
    assert got == list(range(50))
    assert _timers() == 1  # one timer for all 50 reads, not one each
    deadline.close()
    assert _timers() == 0


async def test_a_read_past_the_deadline_times_out() -> None:
    deadline = _deadline_in(0.05)
    iterator = _outputs([0.0, 10.0])
    assert await deadline.read(iterator) == 0
    started = asyncio.get_running_loop().time()
    with pytest.raises(TimeoutError):
        await deadline.read(iterator)  # the second output would come after 10 s
    assert asyncio.get_running_loop().time() - started < 1.0
    with pytest.raises(TimeoutError):  # every later read fails at once
        await deadline.read(_outputs([0.0]))
    task = asyncio.current_task()
    assert task is not None
    assert task.cancelling() == 0  # the timer's cancel was taken back


async def test_a_cancel_from_elsewhere_stays_a_cancel() -> None:
    deadline = _deadline_in(5.0)
    reader = asyncio.create_task(deadline.read(_outputs([10.0])))
    await asyncio.sleep(0.01)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    deadline.close()


async def test_concurrent_readers_all_time_out() -> None:
    deadline = _deadline_in(0.05)
    readers = [asyncio.create_task(deadline.read(_outputs([10.0]))) for _ in range(3)]
    results = await asyncio.gather(*readers, return_exceptions=True)
    assert all(isinstance(r, TimeoutError) for r in results)
