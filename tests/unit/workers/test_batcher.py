from __future__ import annotations

import pytest

from modelyard.model_spec import BatchingConfig
from modelyard.workers.batcher import Batch, Batcher, PendingRequest
from modelyard.workers.main import _run_batch
from modelyard.workers.messages import PredictError, PredictResult

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


class _Sent:
    """Collects what the worker sends (the connection's send side)."""

    def __init__(self) -> None:
        self.messages: list[PredictResult | PredictError] = []

    def send(self, message: PredictResult | PredictError) -> None:
        self.messages.append(message)


class _DoublingBackend:
    """Outputs 2x each item; a batch holding a negative item raises (`error` decides how)."""

    def __init__(self, error: type[Exception]) -> None:
        self.error = error
        self.calls: list[list[int]] = []

    def infer(self, items: list[int], options: dict[str, object]) -> list[int]:
        self.calls.append(list(items))
        if any(item < 0 for item in items):
            raise self.error("negative item")
        return [2 * item for item in items]


@pytest.mark.parametrize(("error", "bad_input"), [(RuntimeError, False), (ValueError, True)])
def test_a_failing_item_fails_only_its_request(error: type[Exception], bad_input: bool) -> None:
    conn, backend = _Sent(), _DoublingBackend(error)
    requests = [PendingRequest(i, [i, 100 + i], {}, "{}", 0.0) for i in range(16)]
    requests[11] = PendingRequest(11, [5, -1], {}, "{}", 0.0)  # passes preprocess, fails infer
    _run_batch(conn, backend, Batch(requests))
    replies = {m.request_id: m for m in conn.messages}
    assert sorted(replies) == list(range(16))
    failed = replies.pop(11)
    assert isinstance(failed, PredictError)
    assert failed.bad_input is bad_input
    assert "negative item" in failed.error
    for request_id, reply in replies.items():
        assert isinstance(reply, PredictResult)
        assert reply.outputs == [2 * request_id, 2 * (100 + request_id)]
    assert len(backend.calls) <= 2 * 4 + 1  # bisection: about log2(16) rounds of two calls
