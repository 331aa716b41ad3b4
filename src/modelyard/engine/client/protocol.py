"""The API-side face of an LLM engine: what route handlers and the manager program against.

`AsyncLLM` (engine/client/async_llm.py) implements `LLMClient` over a worker process; tests use an
in-process fake with the same shape. Route handlers never see token-level wire messages: they get
`RequestOutput`s with text deltas, stop strings already applied.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from modelyard.engine.messages import FinishReason, LoRARequest, SchedulerStats, TokenLogprobs
from modelyard.engine.sampling_params import SamplingParams


class EngineDeadError(RuntimeError):
    """The engine worker died or stopped answering; every in-flight request gets this."""


class EngineOverloadedError(RuntimeError):
    """The engine's bounded waiting queue is full (by requests or by prompt tokens)."""

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class PromptTooLongError(ValueError):
    """prompt tokens + max_tokens exceed the model's context (or the prompt alone does)."""


@dataclass(slots=True)
class CompletionDelta:
    """New output of one of the request's n completions since the previous RequestOutput."""

    index: int  # which completion (0..n-1)
    text: str  # new text (stop strings trimmed); may be "" while a multi-byte char is pending
    token_ids: list[int]  # new token ids
    logprobs: list[TokenLogprobs] | None = None  # aligned with token_ids when asked
    finish_reason: FinishReason | None = None  # set on this completion's last delta
    stop_reason: str | int | None = None  # the stop string or stop token id that ended it
    error: str | None = None  # with FinishReason.ERROR


@dataclass(slots=True)
class RequestMetrics:
    """Timings of one request, time.time() seconds; None until known."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None

    @property
    def queue_time(self) -> float | None:
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time

    @property
    def ttft(self) -> float | None:
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time


@dataclass(slots=True)
class RequestOutput:
    """One update of a request, yielded by LLMClient.generate as tokens arrive."""

    request_id: str
    deltas: list[CompletionDelta]  # completions that changed since the last update
    num_prompt_tokens: int
    num_cached_tokens: int = 0
    num_generated_tokens: int = 0  # cumulative over all n completions
    finished: bool = False  # True on the last update: every completion has finished
    metrics: RequestMetrics = field(default_factory=lambda: RequestMetrics(arrival_time=0.0))


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer route handlers use."""

    eos_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


class LLMClient(Protocol):
    """An LLM engine seen from the API process."""

    @property
    def model_name(self) -> str: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def tokenizer(self) -> Tokenizer: ...

    def apply_chat_template(self, messages: Sequence[dict[str, str]]) -> list[int]:
        """Render chat messages with the tokenizer's template, add the generation prompt,
        return token ids."""
        ...

    def generate(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams,
        request_id: str,
        *,
        priority: int = 0,
    ) -> AsyncIterator[RequestOutput]:
        """Submit a request and stream its outputs; the last has finished=True.

        Raises PromptTooLongError / ValueError (bad params) / EngineOverloadedError before the
        first yield; EngineDeadError at any point. Closing the iterator early (client gone)
        aborts the request in the engine.
        """
        ...

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> SchedulerStats:
        """The latest scheduler snapshot received from the worker."""
        ...

    @property
    def is_alive(self) -> bool: ...

    async def shutdown(self) -> None: ...


class LoRAClient(LLMClient, Protocol):
    """An engine client that serves LoRA adapters (engine.client.async_llm.AsyncLLM is one)."""

    def generate(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams,
        request_id: str,
        *,
        priority: int = 0,
        lora: LoRARequest | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """LLMClient.generate, with the adapter `lora` applied when given."""
        ...

    async def drop_loras(self, names: list[str]) -> None:
        """These adapters were unregistered: the engine frees their memory."""
        ...


def serves_lora(llm: LLMClient) -> bool:
    """True when the client can run requests with a LoRA adapter."""
    return callable(getattr(llm, "drop_loras", None))
