from __future__ import annotations

import pytest

from modelyard.model_spec import BatchingConfig
from modelyard.workers.batcher import Batcher, PendingRequest

pytestmark = pytest.mark.unit


def batcher_of(max_batch_size: int, max_queue_delay_s: float) -> Batcher:
    return Batcher(
        BatchingConfig(max_batch_size=max_batch_size, max_queue_delay_ms=max_queue_delay_s * 1000)
    )


def req(request_id: int, items: int = 1, at: float = 0.0, key: str = "{}") -> PendingRequest:
    return PendingRequest(request_id, [request_id] * items, {}, key, at)


def test_waits_for_the_delay_then_joins_everything_that_arrived() -> None:
    batcher = batcher_of(8, 0.010)
    batcher.add(req(1, at=0.000))
    batcher.add(req(2, at=0.004))
    assert batcher.time_until_ready(0.005) == pytest.approx(0.005)
    assert batcher.pop_batch(0.005) is None
    batch = batcher.pop_batch(0.010)
    assert batch is not None
    assert [r.request_id for r in batch.requests] == [1, 2]
    assert batcher.time_until_ready(0.011) is None


def test_full_batch_is_due_at_once_and_capped() -> None:
    batcher = batcher_of(4, 1.0)
    for i in range(6):
        batcher.add(req(i, at=0.0))
    assert batcher.time_until_ready(0.0) == 0.0
    first = batcher.pop_batch(0.0)
    assert first is not None
    assert first.size == 4
    assert [r.request_id for r in first.requests] == [0, 1, 2, 3]
    assert batcher.pop_batch(0.0) is None  # two left: they wait for the delay
    second = batcher.pop_batch(1.0)
    assert second is not None
    assert [r.request_id for r in second.requests] == [4, 5]


def test_oversized_request_runs_alone_and_order_is_kept() -> None:
    batcher = batcher_of(4, 0.0)
    batcher.add(req(1, items=3))
    batcher.add(req(2, items=6))
    batcher.add(req(3, items=1))
    sizes = []
    while (batch := batcher.pop_batch(0.0)) is not None:
        sizes.append([r.request_id for r in batch.requests])
    assert sizes == [[1], [2], [3]]  # 3 would fit after 1, but never jumps ahead of 2


def test_requests_with_different_options_never_share_a_batch() -> None:
    batcher = batcher_of(8, 0.0)
    batcher.add(req(1, key='{"top_k":1}'))
    batcher.add(req(2, key='{"top_k":5}'))
    batcher.add(req(3, key='{"top_k":1}'))
    first = batcher.pop_batch(0.0)
    second = batcher.pop_batch(0.0)
    assert first is not None
    assert second is not None
    assert [r.request_id for r in first.requests] == [1, 3]
    assert [r.request_id for r in second.requests] == [2]


def test_config_is_validated() -> None:
    with pytest.raises(ValueError):
        BatchingConfig(max_batch_size=0, max_queue_delay_ms=0.0)
