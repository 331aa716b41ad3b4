"""The scheduler-side state of one request.

`Request` is built from the wire message `EngineRequest` and then lives only inside the worker
process: the scheduler and the KV cache manager mutate it every step. It is never sent anywhere
(the wire message stays apart, so neither side pays for the other's fields).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

from modelyard.engine.block_hashes import BlockHash, prefix_cache_salt
from modelyard.engine.messages import EngineRequest, FinishReason, LoRARequest
from modelyard.engine.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    """Where a request is in its life. The FINISHED_* states are terminal."""

    WAITING = enum.auto()  # queued, never ran (or ran and was preempted: see PREEMPTED)
    RUNNING = enum.auto()  # holds KV blocks and is stepped every iteration
    PREEMPTED = enum.auto()  # lost its KV blocks under memory pressure; queued for recompute
    FINISHED_STOPPED = enum.auto()  # EOS or a stop token id
    FINISHED_LENGTH = enum.auto()  # max_tokens or the context length
    FINISHED_ABORTED = enum.auto()  # aborted by the API process
    FINISHED_ERROR = enum.auto()  # made its step fail (engine/core/isolation.py): failed alone

    @property
    def is_finished(self) -> bool:
        return self in _FINISHED

    @property
    def finish_reason(self) -> FinishReason | None:
        """The wire value for a finished status; None while the request is alive."""
        return _FINISH_REASONS.get(self)


_FINISHED = frozenset(
    {
        RequestStatus.FINISHED_STOPPED,
        RequestStatus.FINISHED_LENGTH,
        RequestStatus.FINISHED_ABORTED,
        RequestStatus.FINISHED_ERROR,
    }
)
_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: FinishReason.STOP,
    RequestStatus.FINISHED_LENGTH: FinishReason.LENGTH,
    RequestStatus.FINISHED_ABORTED: FinishReason.ABORT,
    RequestStatus.FINISHED_ERROR: FinishReason.ERROR,
}


class Request:
    """One request as the scheduler sees it: tokens, progress, KV blocks, timings.

    Invariants: `num_computed_tokens <= num_tokens`; tokens are only ever appended, so a
    hash in `block_hashes` stays valid for the request's whole life (also across preemption).
    """

    def __init__(
        self,
        *,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling_params: SamplingParams,
        priority: int = 0,
        arrival_time: float = 0.0,
        lora: LoRARequest | None = None,
    ) -> None:
        self.request_id = request_id  # unique among live requests (the API process's id)
        self.prompt_token_ids = list(prompt_token_ids)  # the tokenized prompt, never changed
        self.output_token_ids: list[int] = []  # tokens generated so far (kept on preemption)
        self.all_token_ids = list(prompt_token_ids)  # prompt + outputs, kept in step
        self.sampling_params = sampling_params  # how to sample and when to stop
        self.priority = priority  # higher runs first; the lowest is preempted first
        self.arrival_time = arrival_time  # time.time() at the API process; FCFS order
        self.arrival_order = 0  # set by the scheduler: breaks ties between equal arrival_time
        self.status = RequestStatus.WAITING  # where the request is in its life
        self.num_computed_tokens = 0  # tokens whose KV is in the cache (computed or cached)
        self.block_ids: list[int] = []  # the block table: physical KV block per logical block
        self.block_hashes: list[BlockHash] = []  # hashes of the full blocks of all_token_ids
        self.num_cached_tokens = 0  # tokens served by the prefix cache at first schedule
        self.first_scheduled_time: float | None = None  # time.time() when it first ran
        self.stop_reason: int | None = None  # the stop token id that ended it, if one did
        self.num_preemptions = 0  # times this request lost its blocks
        self.lora = lora  # the adapter it runs with (None: the base model)
        self.spec_k: int | None = (
            None  # its speculative k (engine.core.spec_decode rule 5; None: k)
        )
        self.spec_trials = (0.0, 0.0)  # rule 5: decayed counts of accepted and tried draft tokens
        # the prefix cache's salt: KV is only shared with requests of the same adapter
        # registration and the same cache_salt
        self.cache_salt = prefix_cache_salt(lora, sampling_params.cache_salt)

    @classmethod
    def from_engine_request(cls, message: EngineRequest) -> Request:
        """Build the scheduler state from the wire message (which is not kept)."""
        return cls(
            request_id=message.request_id,
            prompt_token_ids=message.prompt_token_ids,
            sampling_params=message.sampling_params,
            priority=message.priority,
            arrival_time=message.arrival_time,
            lora=message.lora,
        )

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.all_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self.all_token_ids.append(token_id)

    def __repr__(self) -> str:
        return (
            f"Request({self.request_id!r}, {self.status.name}, prio={self.priority}, "
            f"tokens={self.num_prompt_tokens}+{self.num_output_tokens}, "
            f"computed={self.num_computed_tokens}, blocks={self.block_ids})"
        )
