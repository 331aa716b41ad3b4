"""The API-side face of an LLM engine: what route handlers and the manager program against.

`AsyncLLM` (engine/client/async_llm.py) implements `LLMClient` over a worker process; tests use an
in-process fake with the same shape. Route handlers never see token-level wire messages: they get
`RequestOutput`s with text deltas, stop strings already applied.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from modelyard.engine.client.errors import EngineDeadError as EngineDeadError
from modelyard.engine.client.errors import EngineOverloadedError as EngineOverloadedError
from modelyard.engine.client.errors import MissingCapabilityError as MissingCapabilityError
from modelyard.engine.client.errors import PromptTooLongError as PromptTooLongError
from modelyard.engine.messages import FinishReason, LoRARequest, SchedulerStats, TokenLogprobs
from modelyard.engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from modelyard.engine.client.prefixes import EnginePrefixes


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


#: A chat message or tool as the chat template reads it ({role, content, tool_calls, ...}).
ChatMessageDict = Mapping[str, Any]


class Tokenizer(Protocol):
    """The part of a Hugging Face tokenizer route handlers use."""

    eos_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineCapabilities:
    """What optional features an engine client serves; a route checks these, never probes.

    A route that needs a feature its model's engine lacks answers 400 naming it."""

    lora: bool = False  # runs requests with a LoRA adapter (`generate(lora=...)`, `drop_loras`)
    pins: bool = False  # pins prefixes in its KV cache (`prefixes`)
    speculation: bool = False  # speculative decoding is configured
    structured_output: bool = False  # output constraints (SamplingParams.constraint)
    tools: bool = False  # renders `tools` into chat prompts (apply_chat_template(tools=...))

    def listed(self, *, chat: bool) -> dict[str, bool]:
        """The `capabilities` that /models and /v1/models list for an LLM whose engine serves
        these: `chat` (it has a chat template: /v1/chat/completions), `tools` (tool calling,
        which needs chat) and `structured_output` (`response_format`; forced tool calls)."""
        return {
            "chat": chat,
            "tools": chat and self.tools,
            "structured_output": self.structured_output,
        }


#: What a local engine (`AsyncLLM`) always serves, whatever its config (LoRA and speculation
#: are added from the config): known before the model loads, so the listing can say it.
LOCAL_ENGINE_CAPABILITIES = EngineCapabilities(pins=True, structured_output=True, tools=True)


class LLMClient(Protocol):
    """An LLM engine seen from the API process. Optional features are declared in
    `capabilities`; calling one that is not declared raises MissingCapabilityError."""

    @property
    def capabilities(self) -> EngineCapabilities:
        """The optional features this engine serves."""
        ...

    @property
    def model_name(self) -> str: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def tokenizer(self) -> Tokenizer: ...

    def apply_chat_template(
        self, messages: Sequence[ChatMessageDict], tools: Sequence[ChatMessageDict] | None = None
    ) -> list[int]:
        """Render chat messages (and the offered `tools`, OpenAI tool dicts) with the
        tokenizer's template, add the generation prompt, return token ids
        (engine/client/chat_template.py)."""
        ...

    def generate(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams,
        request_id: str,
        *,
        priority: int = 0,
        lora: LoRARequest | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Submit a request and stream its outputs; the last has finished=True. `lora` runs it
        with that adapter (only with `capabilities.lora`).

        Raises PromptTooLongError / ValueError (bad params) / EngineOverloadedError before the
        first yield; EngineDeadError at any point. Closing the iterator early (client gone)
        aborts the request in the engine.
        """
        ...

    async def drop_loras(self, names: list[str]) -> None:
        """These adapters were unregistered: the engine frees their memory (a no-op without
        `capabilities.lora`)."""
        ...

    @property
    def prefixes(self) -> EnginePrefixes:
        """This engine's pinned prefixes; MissingCapabilityError without `capabilities.pins`."""
        ...

    @property
    def holds_pinned_prefixes(self) -> bool:
        """Pinned prefixes live in this engine (evicting it would drop them)."""
        ...

    @property
    def pid(self) -> int | None:
        """The engine worker's process id (None when it runs elsewhere)."""
        ...

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> SchedulerStats:
        """The latest scheduler snapshot received from the worker."""
        ...

    @property
    def is_alive(self) -> bool: ...

    async def shutdown(self) -> None: ...
