"""Request bodies of the HTTP API (pydantic), and their mapping onto SamplingParams.

Field names and meanings follow the OpenAI API (and vLLM's extras: top_k, min_p,
repetition_penalty, ignore_eos, min_tokens, priority). Unknown fields are ignored, as OpenAI and
vLLM do. Range checks live in `SamplingParams.validate()`, so the same rules apply to every route
and the 400 names the field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from modelyard.engine.sampling_params import SamplingParams


class StreamOptions(BaseModel):
    include_usage: bool = False  # send a final chunk with `usage` (choices: [])


class SamplingFields(BaseModel):
    """Sampling fields shared by every generating route."""

    model_config = ConfigDict(extra="ignore")

    temperature: float | None = None  # None: 1.0 (OpenAI default)
    top_p: float | None = None
    n: int = 1  # completions per prompt
    stop: str | list[str] | None = None  # stop strings (excluded from the text)
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    priority: int = 0  # added to the tenant's priority (higher runs first)
    speculate: bool | None = None  # speculative decoding: None = the model's policy
    user: str | None = None  # accepted for compatibility; logged, not used

    def sampling_params(self, *, max_tokens: int | None, logprobs: int | None) -> SamplingParams:
        """The engine's SamplingParams; raises ValueError naming the first bad field."""
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        values: dict[str, Any] = {
            "n": self.n,
            "max_tokens": max_tokens,
            "min_tokens": self.min_tokens,
            "ignore_eos": self.ignore_eos,
            "stop": stop,
            "stop_token_ids": list(self.stop_token_ids or []),
            "seed": self.seed,
            "logprobs": logprobs,
            "speculate": self.speculate,
        }
        optional = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
        }
        values.update({k: v for k, v in optional.items() if v is not None})
        return SamplingParams(**values).validate()


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str = "text"
    text: str = ""


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[ContentPart] | None = None
    name: str | None = None

    def as_template_message(self) -> dict[str, str]:
        """{role, content} for the tokenizer's chat template (text parts joined)."""
        if isinstance(self.content, list):
            text = "".join(part.text for part in self.content if part.type == "text")
        else:
            text = self.content or ""
        role = "system" if self.role == "developer" else self.role
        return {"role": role, "content": text}


class ChatCompletionRequest(SamplingFields):
    """POST /v1/chat/completions."""

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None  # None: up to the context length
    max_completion_tokens: int | None = None  # the newer name; wins over max_tokens
    logprobs: bool = False  # return the sampled tokens' logprobs
    top_logprobs: int | None = None  # and this many alternatives per position (0..20)
    stream: bool = False
    stream_options: StreamOptions | None = None
    prefix_id: str | None = None  # a pinned prefix (POST /v1/prefixes) the prompt starts with

    def to_sampling_params(self) -> SamplingParams:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs=true")
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        max_tokens = self.max_completion_tokens or self.max_tokens
        return self.sampling_params(max_tokens=max_tokens, logprobs=logprobs)


class CompletionRequest(SamplingFields):
    """POST /v1/completions."""

    model: str
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16  # OpenAI's default for completions
    logprobs: int | None = None  # sampled token's logprob + this many alternatives (0..20)
    echo: bool = False  # not supported (400 when true)
    stream: bool = False
    stream_options: StreamOptions | None = None
    prefix_id: str | None = None  # a pinned prefix (POST /v1/prefixes) the prompt starts with

    def to_sampling_params(self) -> SamplingParams:
        if self.echo:
            raise ValueError("echo is not supported")
        return self.sampling_params(max_tokens=self.max_tokens, logprobs=self.logprobs)

    def prompts(self) -> list[str | list[int]]:
        """The prompts as a list: strings or token-id lists (each one or more choices)."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if not prompt:
            raise ValueError("prompt must not be empty")
        if all(isinstance(p, int) for p in prompt):
            return [[int(p) for p in prompt]]  # type: ignore[arg-type]
        return list(prompt)  # type: ignore[arg-type]


class TextbookSampling(BaseModel):
    """Optional sampling fields of the textbook endpoints; None takes the documented default."""

    model_config = ConfigDict(extra="ignore")

    max_tokens: int | None = None  # default 50 (server.textbook.max_tokens)
    temperature: float | None = None  # default 0.7 (server.textbook.temperature)
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    model: str | None = None  # default: server.textbook.model


class BasicGenerateRequest(TextbookSampling):
    prompt: str


class GenerateRequest(TextbookSampling):
    prompts: list[str] = Field(min_length=1)


class GenerateStreamRequest(TextbookSampling):
    prompt: str
