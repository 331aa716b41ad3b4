"""A scripted in-process LLMClient (`FakeLLM`) and its one-character-per-token tokenizer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from modelyard.engine.client.prefixes import EnginePrefixes
from modelyard.engine.client.protocol import (
    CompletionDelta,
    EngineCapabilities,
    EngineOverloadedError,
    MissingCapabilityError,
    PromptTooLongError,
    RequestMetrics,
    RequestOutput,
)
from modelyard.engine.messages import FinishReason, LoRARequest, SchedulerStats, TokenLogprobs
from modelyard.engine.sampling_params import SamplingParams


class CharTokenizer:
    """One token per character: id = ord(char)."""

    eos_token_id: int | None = 0

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(t) for t in token_ids)


@dataclass
class Call:
    """One generate() call as the fake saw it."""

    prompt: str | list[int]
    params: SamplingParams
    request_id: str
    priority: int
    lora: LoRARequest | None = None


@dataclass
class FakeLLM:
    """Generates the prompt's text reversed, one character per output (so every request's
    tokens are its own), `params.max_tokens` at most, n completions (completion i prefixes
    each char with str(i) when n > 1)."""

    name: str = "fake-chat"
    max_len: int = 64
    delay_s: float = 0.0  # between outputs
    overload: bool = False  # raise EngineOverloadedError on submit
    fail_after: int | None = None  # raise RuntimeError after this many outputs
    calls: list[Call] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    closed_early: list[str] = field(default_factory=list)
    dropped_loras: list[str] = field(default_factory=list)
    live: set[str] = field(default_factory=set)
    shut: bool = False  # shutdown() was called
    started: asyncio.Event = field(default_factory=asyncio.Event)
    reply: str | None = None  # generate this text instead of the reversed prompt
    rendered: list[tuple[list[dict[str, Any]], list[Any] | None]] = field(default_factory=list)
    # LoRA (requests carry the adapter), no pins (no KV cache)
    capabilities: EngineCapabilities = field(default_factory=lambda: EngineCapabilities(lora=True))

    @property
    def prefixes(self) -> EnginePrefixes:
        raise MissingCapabilityError(self.name, "pinned prefixes")

    @property
    def holds_pinned_prefixes(self) -> bool:
        return False

    @property
    def pid(self) -> int | None:
        return None

    @property
    def model_name(self) -> str:
        return self.name

    @property
    def max_model_len(self) -> int:
        return self.max_len

    @property
    def tokenizer(self) -> CharTokenizer:
        return CharTokenizer()

    @property
    def is_alive(self) -> bool:
        return True

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Any] | None = None
    ) -> list[int]:
        self.rendered.append(([dict(m) for m in messages], list(tools) if tools else None))
        text = "|".join(f"{m['role']}:{m['content']}" for m in messages)
        return [ord(c) for c in text]

    def stats(self) -> SchedulerStats:
        return SchedulerStats(num_running=len(self.live), num_blocks=10, num_free_blocks=10)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    async def shutdown(self) -> None:
        self.shut = True

    def generate(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams,
        request_id: str,
        *,
        priority: int = 0,
        lora: LoRARequest | None = None,
    ) -> AsyncIterator[RequestOutput]:
        return self._generate(prompt, params, request_id, priority, lora)

    async def drop_loras(self, names: list[str]) -> None:
        self.dropped_loras.extend(names)

    async def _generate(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams,
        request_id: str,
        priority: int,
        lora: LoRARequest | None = None,
    ) -> AsyncIterator[RequestOutput]:
        text = prompt if isinstance(prompt, str) else "".join(chr(t) for t in prompt)
        self.calls.append(
            Call(
                text if isinstance(prompt, str) else list(prompt),
                params,
                request_id,
                priority,
                lora,
            )
        )
        if self.overload:
            raise EngineOverloadedError("queue full", retry_after_s=2.0)
        max_tokens = params.max_tokens or (self.max_len - len(text))
        if len(text) + max_tokens > self.max_len:
            raise PromptTooLongError(f"{len(text)} prompt tokens + {max_tokens} > {self.max_len}")
        target = (self.reply if self.reply is not None else text[::-1])[:max_tokens] or "x"
        # a whole reply ends on its own (stop); a reversed prompt runs to its length
        ending = FinishReason.STOP if target == self.reply else FinishReason.LENGTH
        metrics = RequestMetrics(arrival_time=1000.0, first_scheduled_time=1000.5)
        self.live.add(request_id)
        self.started.set()
        finished = False
        try:
            generated = 0
            for pos, char in enumerate(target):
                if self.delay_s:
                    await asyncio.sleep(self.delay_s)
                if self.fail_after is not None and pos >= self.fail_after:
                    raise RuntimeError("engine exploded")
                last = pos == len(target) - 1
                deltas = []
                for i in range(params.n):
                    piece = f"{i}{char}" if params.n > 1 else char
                    logprobs = None
                    if params.logprobs is not None:
                        logprobs = [
                            TokenLogprobs(
                                ord(char),
                                -0.5,
                                [ord(char), 65][: params.logprobs + 1],
                                [-0.5, -1.0][: params.logprobs + 1],
                            )
                        ]
                    deltas.append(
                        CompletionDelta(
                            index=i,
                            text=piece,
                            token_ids=[ord(char)],
                            logprobs=logprobs,
                            finish_reason=ending if last else None,
                        )
                    )
                generated += params.n
                if pos == 0:
                    metrics.first_token_time = 1001.0
                if last:
                    metrics.finished_time = 1002.0
                    finished = True
                yield RequestOutput(
                    request_id=request_id,
                    deltas=deltas,
                    num_prompt_tokens=len(text),
                    num_generated_tokens=generated,
                    finished=last,
                    metrics=metrics,
                )
        finally:
            self.live.discard(request_id)
            if not finished:
                self.closed_early.append(request_id)
