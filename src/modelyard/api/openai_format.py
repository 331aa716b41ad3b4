"""OpenAI response bodies and stream chunks, built from RequestOutputs.

Shapes follow the OpenAI API exactly (so the official client parses them), plus one documented
extra field, `modelyard`, on non-streaming responses and on the usage chunk:
`{"queue_time", "ttft", "e2e" (seconds), "prompt_tokens", "cached_tokens", "completion_tokens"}`.
`usage` carries the cached prompt tokens in OpenAI's `prompt_tokens_details.cached_tokens` too.

Choice indices: prompt p's completion i is choice `p * n + i` (as OpenAI numbers them).
With tools offered (`tool_calling`), chat messages carry `tool_calls` and streams
`delta.tool_calls` (api/tools/parsing.py).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from modelyard.api.tools.parsing import StreamPiece, ToolCalling, ToolCallStream
from modelyard.engine.client.protocol import CompletionDelta, Tokenizer
from modelyard.engine.messages import FinishReason, TokenLogprobs


@dataclass(slots=True)
class ChoiceText:
    """Everything generated for one choice (non-streaming responses)."""

    text: list[str] = field(default_factory=list)  # text deltas in order
    logprobs: list[TokenLogprobs] = field(default_factory=list)  # per generated token
    finish_reason: str | None = None  # OpenAI finish_reason


def finish_reason_of(delta: CompletionDelta) -> str | None:
    if delta.finish_reason is None:
        return None
    return str(
        delta.finish_reason.value
        if isinstance(delta.finish_reason, FinishReason)
        else delta.finish_reason
    )


def usage_body(
    prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0
) -> dict[str, Any]:
    """OpenAI's `usage`: `prompt_tokens_details.cached_tokens` counts the prompt tokens served
    from the prefix cache (pinned or not), as in the `modelyard` field."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


class OpenAIFormat:
    """Builds the bodies of one response; `chat` selects chat.completion vs text_completion."""

    def __init__(
        self,
        *,
        chat: bool,
        model: str,
        n: int,
        tokenizer: Tokenizer,
        tool_calling: ToolCalling | None = None,
    ) -> None:
        self.chat = chat
        self.model = model  # the model id that served the request
        self.n = n  # completions per prompt
        self.tokenizer = tokenizer  # to spell out logprob tokens
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self._text_offsets: dict[int, int] = {}  # completions logprobs text_offset per choice
        self.tool_calling = tool_calling  # tools offered: read completions for tool calls
        self._tool_streams: dict[int, ToolCallStream] = {}  # per choice index

    def choice_index(self, stream_index: int, delta: CompletionDelta) -> int:
        return stream_index * self.n + delta.index

    # ---------------------------------------------------------------- streaming
    def _chunk(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def role_chunk(self, num_choices: int) -> dict[str, Any]:
        """Chat streams open with the assistant role for every choice."""
        choices = [
            {
                "index": i,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
            for i in range(num_choices)
        ]
        return self._chunk(choices)

    def delta_chunks(self, stream_index: int, delta: CompletionDelta) -> list[dict[str, Any]]:
        """The chunks for one delta; none when it carries nothing (pending multi-byte text,
        text held back while it may begin a tool call)."""
        finish = finish_reason_of(delta)
        index = self.choice_index(stream_index, delta)
        text, calls = delta.text, []
        if self.tool_calling is not None and self.chat:
            stream = self._tool_streams.setdefault(index, self.tool_calling.stream())
            piece = stream.feed(delta.text)
            if finish is not None:
                piece = _joined(piece, stream.finish())
                finish = self.tool_calling.finish_reason(finish, stream.called)
            text, calls = piece.content, piece.tool_calls
        if not text and finish is None and not delta.logprobs and not calls:
            return []
        logprobs = self.logprobs_body(index, delta.logprobs) if delta.logprobs else None
        choice: dict[str, Any] = {"index": index, "logprobs": logprobs, "finish_reason": None}
        if self.chat:
            choice["delta"] = {"content": text} if text else {}
        else:
            choice["text"] = text
        chunks = [self._chunk([choice])] if text or delta.logprobs or not calls else []
        for call in calls:
            call_choice = {"index": index, "delta": {"tool_calls": [call]}, "logprobs": None}
            chunks.append(self._chunk([{**call_choice, "finish_reason": None}]))
        if finish is not None and calls:  # as OpenAI: the reason comes alone, delta {}
            end = {"index": index, "delta": {}, "logprobs": None, "finish_reason": finish}
            chunks.append(self._chunk([end]))
        elif finish is not None:
            chunks[-1]["choices"][0]["finish_reason"] = finish
        return chunks

    def usage_chunk(self, usage: dict[str, Any], timings: dict[str, Any]) -> dict[str, Any]:
        body = self._chunk([])
        body["usage"] = usage
        body["modelyard"] = timings
        return body

    # ---------------------------------------------------------------- whole response
    def response(
        self, choices: dict[int, ChoiceText], usage: dict[str, Any], timings: dict[str, Any]
    ) -> dict[str, Any]:
        out: list[dict[str, Any]] = []
        for index in sorted(choices):
            choice = choices[index]
            text = "".join(choice.text)
            logprobs = self.logprobs_body(index, choice.logprobs) if choice.logprobs else None
            entry: dict[str, Any] = {"index": index, "logprobs": logprobs}
            finish = choice.finish_reason
            if self.chat and self.tool_calling is not None:
                entry["message"] = self.tool_calling.message(text)
                called = "tool_calls" in entry["message"]
                finish = self.tool_calling.finish_reason(finish, called)
            elif self.chat:
                entry["message"] = {"role": "assistant", "content": text}
            else:
                entry["text"] = text
            entry["finish_reason"] = finish
            out.append(entry)
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": out,
            "usage": usage,
            "system_fingerprint": None,
            "modelyard": timings,
        }

    # ---------------------------------------------------------------- logprobs
    def logprobs_body(self, index: int, entries: list[TokenLogprobs]) -> dict[str, Any]:
        if self.chat:
            return {"content": [self._chat_logprob(e) for e in entries]}
        tokens = [self._token(e.token_id) for e in entries]
        offsets = []
        offset = self._text_offsets.get(index, 0)
        for token in tokens:
            offsets.append(offset)
            offset += len(token)
        self._text_offsets[index] = offset
        return {
            "tokens": tokens,
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": [
                {self._token(t): lp for t, lp in zip(e.top_token_ids, e.top_logprobs, strict=False)}
                for e in entries
            ],
            "text_offset": offsets,
        }

    def _chat_logprob(self, entry: TokenLogprobs) -> dict[str, Any]:
        token = self._token(entry.token_id)
        return {
            "token": token,
            "logprob": entry.logprob,
            "bytes": list(token.encode()),
            "top_logprobs": [
                {"token": (t := self._token(tid)), "logprob": lp, "bytes": list(t.encode())}
                for tid, lp in zip(entry.top_token_ids, entry.top_logprobs, strict=False)
            ],
        }

    def _token(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)


def _joined(first: StreamPiece, second: StreamPiece) -> StreamPiece:
    return StreamPiece(first.content + second.content, first.tool_calls + second.tool_calls)
