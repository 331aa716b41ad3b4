"""The scheduler's working structures: the waiting queue and the batch one `schedule()` builds.

Both are plain CPU bookkeeping, used only by engine.scheduler.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass, field

from modelyard.engine.core.request import Request
from modelyard.engine.core.scheduler_output import ScheduledRequest


@dataclass(order=True)
class _QueueEntry:
    key: tuple[int, int, float, int]
    request: Request = field(compare=False)


class WaitingQueue:
    """Requests waiting for their (first or next) admission, best first.

    Order: priority desc; inside a priority class, preempted requests first (so that work
    already paid for resumes before new work starts), then arrival asc.
    """

    def __init__(self) -> None:
        self._entries: list[_QueueEntry] = []

    def push(self, request: Request, *, front_of_class: bool = False) -> None:
        rank = 0 if front_of_class else 1
        key = (-request.priority, rank, request.arrival_time, request.arrival_order)
        bisect.insort(self._entries, _QueueEntry(key, request))

    def peek(self) -> Request:
        return self._entries[0].request

    def pop(self) -> Request:
        return self._entries.pop(0).request

    def remove(self, request: Request) -> None:
        self._entries = [e for e in self._entries if e.request is not request]

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Request]:
        return (e.request for e in self._entries)


@dataclass
class StepBatch:
    """The batch being built by one `schedule()` call."""

    token_budget: int  # tokens still allowed this step
    scheduled: dict[str, ScheduledRequest] = field(default_factory=dict)  # insertion ordered
    decode_ids: set[str] = field(default_factory=set)  # scheduled ids that are plain decodes
    preempted_ids: set[str] = field(default_factory=set)  # requests preempted this step

    def add(self, request: Request, num_new_tokens: int, num_spec_tokens: int = 0) -> None:
        start = request.num_computed_tokens
        end = start + num_new_tokens
        self.scheduled[request.request_id] = ScheduledRequest(
            request_id=request.request_id,
            token_ids=request.all_token_ids[start:end],
            start_position=start,
            block_table=request.block_ids,
            sample=end == request.num_tokens,
            sampling_params=request.sampling_params,
            prompt_token_ids=request.prompt_token_ids,
            output_token_ids=request.output_token_ids,
            lora=request.lora,
            num_spec_tokens=num_spec_tokens,
        )
        self.token_budget -= num_new_tokens + num_spec_tokens
        if num_new_tokens == 1 and end == request.num_tokens and request.num_output_tokens:
            self.decode_ids.add(request.request_id)

    def remove(self, request_id: str) -> None:
        entry = self.scheduled.pop(request_id, None)
        if entry is not None:
            self.token_budget += len(entry.token_ids) + entry.num_spec_tokens
            self.decode_ids.discard(request_id)
