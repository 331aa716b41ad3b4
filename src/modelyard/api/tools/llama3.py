"""Llama 3.x JSON tool calls: the completion is `{"name": ..., "parameters": {...}}` (or
`"arguments"`), maybe after `<|python_tag|>`, several calls separated by `;`. As in vLLM, only a
completion that starts with a call is read as calls; anything else is content."""

from __future__ import annotations

import json

from modelyard.api.tools.base import ParsedCall, ParsedOutput, ToolParser, as_call

PYTHON_TAG = "<|python_tag|>"
_DECODER = json.JSONDecoder()


class Llama3JsonParser(ToolParser):
    markers = (PYTHON_TAG, "{")

    def parse(self, text: str, *, final: bool) -> ParsedOutput:
        start = self.find_start(text)
        if start is None:
            return ParsedOutput(text.strip())
        body = text[start:].removeprefix(PYTHON_TAG)
        calls: list[ParsedCall] = []
        position = 0
        while True:
            position = _skip(body, position)
            if position >= len(body):
                break
            try:
                obj, position = _DECODER.raw_decode(body, position)
            except ValueError:
                break
            call = as_call(obj, "parameters", "arguments")
            if call is None:
                break
            calls.append(call)
        if not calls or (final and position < len(body)):
            return ParsedOutput(text.strip()) if final else ParsedOutput("", calls)
        return ParsedOutput("", calls)

    def find_start(self, text: str) -> int | None:
        stripped = text.lstrip()
        if stripped.startswith((PYTHON_TAG, "{")):
            return len(text) - len(stripped)
        return None

    def pending_length(self, text: str) -> int:
        stripped = text.lstrip()
        return len(text) if PYTHON_TAG.startswith(stripped) else 0


def _skip(body: str, position: int) -> int:
    while position < len(body) and (body[position].isspace() or body[position] == ";"):
        position += 1
    return position
