"""Dynamic batching inside a non-LLM worker: pure CPU bookkeeping, no I/O, no clock of its own.

Requests arrive with their prepared items. A batch is ready when the requests at the head of the
queue that share the head's options hold at least `max_batch_size` items, or when the head has
waited `max_queue_delay_ms` (both from the model's `BatchingConfig`). A batch then takes those
requests in arrival order while their items fit in `max_batch_size` (a single request larger
than that runs alone, never split). Requests with different options (top_k, labels) never share
a batch.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from modelyard.model_spec import BatchingConfig


@dataclass(slots=True)
class PendingRequest:
    """One request waiting in the worker's queue."""

    request_id: int  # the API process's id for the reply
    items: list[Any]  # prepared items (backend.preprocess output)
    options: dict[str, Any]  # per-request options (all requests of a batch share them)
    options_key: str  # canonical encoding of options, to group compatible requests
    arrival: float  # monotonic time the worker received it


@dataclass(slots=True)
class Batch:
    """Requests joined into one backend call."""

    requests: list[PendingRequest] = field(default_factory=list)

    @property
    def items(self) -> list[Any]:
        return [item for request in self.requests for item in request.items]

    @property
    def size(self) -> int:
        return sum(len(request.items) for request in self.requests)

    @property
    def options(self) -> dict[str, Any]:
        return self.requests[0].options if self.requests else {}


class Batcher:
    def __init__(self, config: BatchingConfig) -> None:
        self.max_batch_size = config.max_batch_size
        self.max_queue_delay_s = config.max_queue_delay_ms / 1000.0
        self._queue: deque[PendingRequest] = deque()

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, request: PendingRequest) -> None:
        self._queue.append(request)

    def _compatible_items(self) -> int:
        head = self._queue[0]
        return sum(len(r.items) for r in self._queue if r.options_key == head.options_key)

    def time_until_ready(self, now: float) -> float | None:
        """Seconds until the next batch is due (0 = now); None when nothing waits."""
        if not self._queue:
            return None
        if self._compatible_items() >= self.max_batch_size:
            return 0.0
        return max(0.0, self._queue[0].arrival + self.max_queue_delay_s - now)

    def pop_batch(self, now: float) -> Batch | None:
        """The next batch if one is due, else None."""
        due = self.time_until_ready(now)
        if due is None or due > 0:
            return None
        head = self._queue[0]
        batch = Batch()
        kept: deque[PendingRequest] = deque()
        closed = False  # once a compatible request does not fit, later ones wait (FIFO)
        while self._queue:
            request = self._queue.popleft()
            fits = batch.size + len(request.items) <= self.max_batch_size or not batch.requests
            if request.options_key == head.options_key and not closed and fits:
                batch.requests.append(request)
            else:
                closed = closed or request.options_key == head.options_key
                kept.append(request)
        self._queue = kept
        return batch
