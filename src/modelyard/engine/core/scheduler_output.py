"""What the scheduler hands the model runner each step, and what it gets back.

These are in-process objects (scheduler and runner live in the same worker process), so they
may hold references to the scheduler's lists instead of copies. They are plain dataclasses,
not wire messages.

A step is one batch that mixes prefill chunks and decodes: there is no separate prefill phase.
For a request, the runner computes the KV of `token_ids` at positions
`[start_position, start_position + len(token_ids))`, writes it into the slots given by
`block_table`, and, when `sample` is true, samples one new token from the logits of the last
position. A decode with `num_spec_tokens` > 0 may also carry proposed tokens, verified in the
same forward (engine.core.spec_decode).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from modelyard.engine.messages import LoRARequest, SchedulerStats, TokenLogprobs
from modelyard.engine.sampling_params import SamplingParams


@dataclass(slots=True)
class ScheduledRequest:
    """One request's share of a step."""

    request_id: str
    token_ids: Sequence[int]
    """Tokens to run this step: a prefill chunk, or the one latest token of a decode."""
    start_position: int
    """Position of token_ids[0] == number of tokens whose KV is already in the cache (computed
    earlier or served by the prefix cache)."""
    block_table: Sequence[int]
    """Physical KV block ids for positions [0, start_position + len(token_ids)), in order.
    Slot of position p: block_table[p // block_size] * block_size + p % block_size."""
    sample: bool
    """True when this chunk reaches the end of the request's known tokens, so a new token is
    sampled; False for a non-final prefill chunk."""
    sampling_params: SamplingParams
    prompt_token_ids: Sequence[int]
    """The prompt, for repetition penalties (a reference, not a copy)."""
    output_token_ids: Sequence[int]
    """Tokens generated so far, for penalties and min_tokens (a reference, not a copy)."""
    lora: LoRARequest | None = None
    """The adapter whose deltas the request's rows get (None: the base model)."""
    num_spec_tokens: int = 0
    """Speculative slots reserved after token_ids (a decode only): the runner may propose up
    to this many tokens, run them after token_ids at the next positions and verify them
    (see engine.core.spec_decode). 0 = a plain step."""


@dataclass(slots=True)
class SchedulerOutput:
    """The batch for one step."""

    scheduled: list[ScheduledRequest]
    """Requests that run this step, decodes first, then prefill chunks."""
    num_batched_tokens: int
    """Sum of len(token_ids) over scheduled; <= max_num_batched_tokens."""
    finished_request_ids: set[str] = field(default_factory=set)
    """Requests that left since the previous step (finished, aborted or preempted): the runner
    drops any per-request state it keeps for them (e.g. seeded generators are kept across
    preemption: only finished/aborted ids appear here)."""

    preempted_request_ids: set[str] = field(default_factory=set)
    """Requests preempted since the previous step: their KV blocks are gone, so the runner
    drops any state about their cache contents (e.g. a draft model's progress)."""

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


@dataclass(slots=True)
class DraftResult:
    """The verification of one request's proposed tokens."""

    draft_token_ids: list[int]
    """The tokens the proposer put in the request's speculative slots (<= num_spec_tokens)."""
    num_accepted: int
    """How many of them, from the first, the target accepted; they precede the request's
    sampled token in the output."""

    @property
    def accepted_token_ids(self) -> list[int]:
        return self.draft_token_ids[: self.num_accepted]


@dataclass(slots=True)
class StructuredOutputStats:
    """Cumulative figures of a runner's structured output (runner.structured)."""

    constrained_requests: int = 0  # distinct requests that were given a grammar matcher
    compile_seconds: float = 0.0  # time spent compiling grammars
    mask_seconds: float = 0.0  # time spent updating matchers and filling token masks
    mask_steps: int = 0  # steps with at least one constrained row


@dataclass(slots=True)
class RunnerOutput:
    """What the runner produced for one SchedulerOutput."""

    sampled_token_ids: dict[str, int] = field(default_factory=dict)
    """request id -> the token sampled this step; only for ScheduledRequest.sample == True."""
    logprobs: dict[str, TokenLogprobs] = field(default_factory=dict)
    """request id -> logprobs of the sampled position, for requests with params.logprobs set."""
    drafts: dict[str, DraftResult] = field(default_factory=dict)
    """request id -> its verified proposal, for requests with num_spec_tokens > 0 (missing or
    empty: nothing was proposed). The sampled token is the target's token after the accepted
    ones."""
    structured: StructuredOutputStats | None = None
    """A snapshot of the runner's structured-output figures (None: it has none to report)."""


class StepRunner(Protocol):
    """What the engine core needs from a model runner (runner.model_runner.ModelRunner is the
    real one; scheduler tests use hand-written fakes)."""

    @property
    def num_kv_blocks(self) -> int:
        """KV blocks the runner allocated (from CacheConfig.kv_cache_bytes or num_blocks)."""
        ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def eos_token_ids(self) -> list[int]:
        """Token ids that end a generation unless ignore_eos."""
        ...

    @property
    def vocab_size(self) -> int:
        """Token ids the model's embedding accepts: [0, vocab_size)."""
        ...

    @property
    def lora(self) -> LoRARunner | None:
        """The runner's LoRA side; None when it serves no adapters (the core reads it only when
        the engine config enables LoRA)."""
        ...

    def execute(self, scheduler_output: SchedulerOutput) -> RunnerOutput:
        """Run one step on the model; sample for the requests with sample=True."""
        ...


class LoRARunner(Protocol):
    """What a runner needs for LoRA adapters (runner.model_runner.ModelRunner has it)."""

    def check_lora(self, lora: LoRARequest) -> None:
        """Raise ValueError when the adapter cannot be read or does not fit the model."""
        ...

    def drop_loras(self, names: list[str]) -> None:
        """Free these adapters' weights."""
        ...

    def fill_lora_stats(self, stats: SchedulerStats) -> None:
        """Write the adapter cache's figures into the scheduler snapshot."""
        ...
