"""Response objects and stream events of POST /v1/responses, built from the chat path's output.

`ResponseDraft` holds what a response repeats from its request (model, instructions, tools,
text, metadata...) and builds the whole object from the output items. The output items come
from the completion read as a chat message (`output_items`: a `message` item for its text,
one `function_call` item per call) or, streaming, from the chat chunks (`ResponseEvents`).

Streams, in order: `response.created`, `response.in_progress`; per text item
`response.output_item.added`, `response.content_part.added`, `response.output_text.delta`...,
`response.output_text.done`, `response.content_part.done`, `response.output_item.done`; per
call `response.output_item.added`, `response.function_call_arguments.delta` / `.done`,
`response.output_item.done`; then `response.completed` (or `response.incomplete` when cut at
`max_output_tokens`) carrying the whole response. Each event has `type` and `sequence_number`
and is framed with its `event:` name.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import msgspec

from modelyard.api.responses_protocol import ResponsesRequest

_encode = msgspec.json.Encoder().encode


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def named_event(payload: dict[str, Any]) -> bytes:
    """One SSE frame named after the payload's `type`."""
    name: str = payload["type"]
    return b"event: " + name.encode() + b"\ndata: " + _encode(payload) + b"\n\n"


def usage_of(input_tokens: int, output_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens,
    }


def message_item(text: str, status: str = "completed") -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": []}
    return {
        "type": "message",
        "id": new_id("msg"),
        "role": "assistant",
        "status": status,
        "content": [part] if status == "completed" else [],
    }


def call_item(call_id: str, name: str, arguments: str, status: str = "completed") -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": new_id("fc"),
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def output_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A chat message (`content`, `tool_calls`) as Responses output items."""
    items = [message_item(message["content"])] if message.get("content") else []
    for call in message.get("tool_calls", []):
        function = call["function"]
        items.append(call_item(call["id"], function["name"], function["arguments"]))
    return items


def _text_config(request: ResponsesRequest) -> dict[str, Any]:
    """The request's `text`, as OpenAI echoes it (only `type` for text and json_object)."""
    fmt = request.text.format if request.text is not None else None
    if fmt is None or fmt.type != "json_schema":
        return {"format": {"type": fmt.type if fmt is not None else "text"}}
    return {"format": fmt.model_dump(by_alias=True, exclude_none=True)}


class ResponseDraft:
    """One response's fixed fields; `body` builds the object around its output."""

    def __init__(self, request: ResponsesRequest, model: str) -> None:
        self.id = new_id("resp")
        self.created_at = int(time.time())
        self.model = model  # the model that served it
        choice = request.tool_choice
        self._fixed: dict[str, Any] = {
            "instructions": request.instructions,
            "max_output_tokens": request.max_output_tokens,
            "metadata": request.metadata or {},
            "parallel_tool_calls": request.parallel_tool_calls,
            "previous_response_id": request.previous_response_id,
            "store": request.store,
            "temperature": 1.0 if request.temperature is None else request.temperature,
            "top_p": 1.0 if request.top_p is None else request.top_p,
            "text": _text_config(request),
            "tool_choice": choice.model_dump()
            if choice is not None and not isinstance(choice, str)
            else (choice or "auto"),
            "tools": [t.model_dump() for t in request.tools or []],
            "truncation": "disabled",
            "reasoning": {"effort": None, "summary": None},
        }

    def body(
        self,
        output: list[dict[str, Any]],
        *,
        status: str,
        usage: dict[str, Any] | None,
        incomplete_reason: str | None = None,
    ) -> dict[str, Any]:
        details = {"reason": incomplete_reason} if incomplete_reason is not None else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "error": None,
            "incomplete_details": details,
            "model": self.model,
            "output": output,
            "usage": usage,
            **self._fixed,
        }

    def finished(
        self, output: list[dict[str, Any]], finish_reason: str | None, usage: dict[str, Any]
    ) -> dict[str, Any]:
        """The final object: incomplete when cut at max_output_tokens."""
        if finish_reason == "length":
            return self.body(
                output, status="incomplete", usage=usage, incomplete_reason="max_output_tokens"
            )
        return self.body(output, status="completed", usage=usage)


@dataclass(slots=True)
class ResponseEvents:
    """The stream of one response, fed with the chat chunks of its completion."""

    draft: ResponseDraft
    output: list[dict[str, Any]] = field(default_factory=list)  # finished items
    sequence: int = 0
    _text: dict[str, Any] | None = None  # the message item being streamed
    _parts: list[str] = field(default_factory=list)  # its text so far
    _call: dict[str, Any] | None = None  # the call item being streamed
    _arguments: list[str] = field(default_factory=list)  # its arguments so far
    _late_text: list[str] = field(default_factory=list)  # text sent while a call was open
    finish_reason: str | None = None  # the chat finish reason, once sent
    final: dict[str, Any] | None = None  # the whole response, once finished

    def event(self, type_: str, **fields: Any) -> bytes:
        payload = {"type": type_, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return named_event(payload)

    def start(self) -> list[bytes]:
        body = self.draft.body([], status="in_progress", usage=None)
        return [
            self.event("response.created", response=body),
            self.event("response.in_progress", response=body),
        ]

    def chunk(self, chunk: dict[str, Any]) -> list[bytes]:
        """The events of one chat chunk (content, tool call entries, finish reason)."""
        events: list[bytes] = []
        for choice in chunk["choices"]:
            delta = choice["delta"]
            if delta.get("content") and self._call is not None:
                self._late_text.append(delta["content"])  # after the calls: once they close
            elif delta.get("content"):
                events += self._text_delta(delta["content"])
            for entry in delta.get("tool_calls", []):
                events += self._call_entry(entry)
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
        return events

    def finish(self, usage: dict[str, Any]) -> list[bytes]:
        events = self._close_call()
        if self._late_text:
            events += self._text_delta("".join(self._late_text))
        events += self._close_text()
        body = self.final = self.draft.finished(self.output, self.finish_reason, usage)
        name = "response.completed" if body["status"] == "completed" else "response.incomplete"
        return [*events, self.event(name, response=body)]

    def failed(self, error: dict[str, Any]) -> bytes:
        """The error event of a stream that fails after its first byte."""
        fields = {k: error.get(k) for k in ("code", "message", "param")}
        return self.event("error", **fields)

    def _text_delta(self, text: str) -> list[bytes]:
        events: list[bytes] = []
        if self._text is None:
            self._text = message_item("", status="in_progress")
            index = len(self.output)
            events.append(
                self.event("response.output_item.added", output_index=index, item=self._text)
            )
            part = {"type": "output_text", "text": "", "annotations": []}
            events.append(self._part_event("response.content_part.added", part))
        self._parts.append(text)
        events.append(self._text_event("response.output_text.delta", delta=text))
        return events

    def _close_text(self) -> list[bytes]:
        if self._text is None:
            return []
        text = "".join(self._parts)
        done = self._text_event("response.output_text.done", text=text)
        part = {"type": "output_text", "text": text, "annotations": []}
        item = {**self._text, "status": "completed", "content": [part]}
        events = [done, self._part_event("response.content_part.done", part)]
        events.append(self._item_done(item))
        self._text, self._parts = None, []
        return events

    def _text_event(self, type_: str, **fields: Any) -> bytes:
        assert self._text is not None  # called while a message item is open
        index = len(self.output)
        return self.event(
            type_,
            item_id=self._text["id"],
            output_index=index,
            content_index=0,
            logprobs=[],
            **fields,
        )

    def _part_event(self, type_: str, part: dict[str, Any]) -> bytes:
        assert self._text is not None
        index = len(self.output)
        return self.event(
            type_, item_id=self._text["id"], output_index=index, content_index=0, part=part
        )

    def _call_entry(self, entry: dict[str, Any]) -> list[bytes]:
        """A first entry (id, name) opens a call item (closing the one before), the next ones
        carry its arguments in fragments."""
        function = entry["function"]
        if "id" in entry:
            events = [*self._close_call(), *self._close_text()]
            self._call = call_item(entry["id"], function["name"], "", status="in_progress")
            index = len(self.output)
            events.append(
                self.event("response.output_item.added", output_index=index, item=self._call)
            )
            return events
        assert self._call is not None  # the chat stream sends the arguments after the name
        self._arguments.append(function["arguments"])
        index, item_id = len(self.output), self._call["id"]
        return [
            self.event(
                "response.function_call_arguments.delta",
                item_id=item_id,
                output_index=index,
                delta=function["arguments"],
            )
        ]

    def _close_call(self) -> list[bytes]:
        if self._call is None:
            return []
        arguments = "".join(self._arguments)
        index, item_id = len(self.output), self._call["id"]
        done = self.event(
            "response.function_call_arguments.done",
            item_id=item_id,
            output_index=index,
            arguments=arguments,
        )
        item = {**self._call, "arguments": arguments, "status": "completed"}
        self._call, self._arguments = None, []
        return [done, self._item_done(item)]

    def _item_done(self, item: dict[str, Any]) -> bytes:
        index = len(self.output)
        self.output.append(item)
        return self.event("response.output_item.done", output_index=index, item=item)
