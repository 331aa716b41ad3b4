"""Request bodies of the HTTP API (pydantic), and their mapping onto SamplingParams.

Field names and meanings follow the OpenAI API (and vLLM's extras: top_k, min_p,
repetition_penalty, ignore_eos, min_tokens, priority). Unknown fields are ignored, as OpenAI and
vLLM do. Range checks live in `SamplingParams.validate()`, so the same rules apply to every route
and the 400 names the field; integers that never reach it (priority) are bounded here. Limits
that depend on the server (n, n x max_tokens) are checked by api/limits.py.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import msgspec
from pydantic import BaseModel, ConfigDict, Field

from modelyard.api.structured import RequestedConstraint, StructuredFields
from modelyard.api.tools.definitions import (
    AssistantToolCall,
    ToolFields,
    ToolOffer,
    check_tool_messages,
)
from modelyard.engine.sampling_params import (
    INT32_MAX,
    INT64_MAX,
    INT64_MIN,
    InvalidParamError,
    SamplingParams,
)

#: Request priorities are 32-bit (added to the tenant's before they reach the engine).
PRIORITY_LIMIT = 2**31 - 1


class StreamOptions(BaseModel):
    include_usage: bool = False  # send a final chunk with `usage` (choices: [])


class SamplingFields(StructuredFields):
    """Sampling fields shared by every generating route (structured output: api/structured.py)."""

    model_config = ConfigDict(extra="ignore")

    temperature: float | None = None  # None: 1.0 (OpenAI default)
    top_p: float | None = None
    n: int = Field(1, ge=1, le=INT32_MAX)  # completions per prompt (server.max_n at most)
    best_of: int | None = Field(None, ge=1, le=INT32_MAX)  # accepted only when equal to n
    logit_bias: dict[str, float] | None = None  # token id -> bias; only {} is accepted
    stop: str | list[str] | None = None  # stop strings (excluded from the text)
    stop_token_ids: list[int] | None = None
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    priority: int = Field(0, ge=-PRIORITY_LIMIT, le=PRIORITY_LIMIT)  # + the tenant's priority
    speculate: bool | None = None  # speculative decoding: None = the model's policy
    # vLLM's prefix-cache salt: requests share cached KV only with those of the same salt
    cache_salt: str | None = Field(None, min_length=1, max_length=1024)
    user: str | None = None  # accepted for compatibility; logged, not used

    def sampling_params(
        self,
        *,
        max_tokens: int | None,
        logprobs: int | None,
        renames: dict[str, str] | None = None,
    ) -> SamplingParams:
        """The engine's SamplingParams; raises InvalidParamError naming the first bad field
        (as the request spelled it: `renames` maps engine names to request names)."""
        if self.best_of is not None and self.best_of != self.n:
            raise InvalidParamError("best_of", "other than n is not supported")
        if self.logit_bias:
            _check_logit_bias(self.logit_bias)
            raise InvalidParamError("logit_bias", "is not supported (only {} is accepted)")
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        requested = self.requested_constraint()
        values: dict[str, Any] = {
            "constraint": requested.constraint if requested is not None else None,
            "n": self.n,
            "max_tokens": max_tokens,
            "min_tokens": self.min_tokens,
            "ignore_eos": self.ignore_eos,
            "stop": stop,
            "stop_token_ids": list(self.stop_token_ids or []),
            "seed": self.seed,
            "logprobs": logprobs,
            "speculate": self.speculate,
            "cache_salt": self.cache_salt,
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
        try:
            return SamplingParams(**values).validate()
        except InvalidParamError as exc:
            if renames and exc.param in renames:
                raise exc.renamed(renames[exc.param]) from None
            raise


def _check_logit_bias(logit_bias: dict[str, float]) -> None:
    """Keys are token ids (decimal strings within 32 bits), values in [-100, 100]."""
    for key, value in logit_bias.items():
        if not key.isdecimal() or int(key) > INT32_MAX:
            raise InvalidParamError("logit_bias", f"keys must be token ids, not {key[:20]!r}")
        if not -100.0 <= value <= 100.0:
            raise InvalidParamError("logit_bias", "values must be in [-100, 100]")


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str = "text"
    text: str = ""


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[AssistantToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # role tool: the call this message answers

    def as_template_message(self) -> dict[str, Any]:
        """{role, content[, tool_calls][, tool_call_id]} for the tokenizer's chat template (text
        parts joined; call arguments decoded from JSON where they parse, as templates expect)."""
        if isinstance(self.content, list):
            text = "".join(part.text for part in self.content if part.type == "text")
        else:
            text = self.content or ""
        role = "system" if self.role == "developer" else self.role
        message: dict[str, Any] = {"role": role, "content": text}
        if self.tool_calls:
            message["tool_calls"] = [_template_call(call) for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


def _template_call(call: AssistantToolCall) -> dict[str, Any]:
    try:
        arguments: Any = json.loads(call.function.arguments)
    except ValueError:
        arguments = call.function.arguments
    function = {"name": call.function.name, "arguments": arguments}
    return {"id": call.id, "type": "function", "function": function}


class ChatCompletionRequest(ToolFields, SamplingFields):
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

    def checked_tool_offer(self) -> ToolOffer | None:
        """The tools offered (api/tools/definitions.py), with the tool messages checked."""
        check_tool_messages([(m.role, m.tool_calls, m.tool_call_id) for m in self.messages])
        return self.tool_offer()

    def requested_constraint(self) -> RequestedConstraint | None:
        """The structured-output constraint, or the one forcing tool calls; not both."""
        requested = super().requested_constraint()
        offer = self.tool_offer()
        forced = offer.constraint() if offer is not None else None
        if forced is None:
            return requested
        if requested is not None:
            message = f"forces a tool call, which conflicts with {requested.param}"
            raise InvalidParamError("tool_choice", message)
        return RequestedConstraint("tools", forced)

    def to_sampling_params(self) -> SamplingParams:
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidParamError("top_logprobs", "requires logprobs=true")
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        renames = {"logprobs": "top_logprobs"}
        max_tokens = self.max_tokens
        if self.max_completion_tokens is not None:  # 0 is a value (400), not "unset"
            max_tokens = self.max_completion_tokens
            renames["max_tokens"] = "max_completion_tokens"
        params = self.sampling_params(max_tokens=max_tokens, logprobs=logprobs, renames=renames)
        offer = self.tool_offer()
        if offer is None or not offer.kept_special_tokens():
            return params
        return msgspec.structs.replace(params, kept_special_tokens=offer.kept_special_tokens())


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
            raise InvalidParamError("echo", "is not supported")
        return self.sampling_params(max_tokens=self.max_tokens, logprobs=self.logprobs)

    def prompts(self) -> list[str | list[int]]:
        """The prompts as a list: strings or token-id lists (each one or more choices)."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if not prompt:
            raise InvalidParamError("prompt", "must not be empty")
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
    seed: int | None = Field(None, ge=INT64_MIN, le=INT64_MAX)
    stop: str | list[str] | None = None
    model: str | None = None  # default: server.textbook.model


class BasicGenerateRequest(TextbookSampling):
    prompt: str


class GenerateRequest(TextbookSampling):
    prompts: list[str] = Field(min_length=1)


class GenerateStreamRequest(TextbookSampling):
    prompt: str
