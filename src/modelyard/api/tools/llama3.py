"""Llama 3.x JSON tool calls: the completion is `{"name": ..., "parameters": {...}}` (or
`"arguments"`), maybe after `<|python_tag|>`, several calls separated by `;`. As in vLLM, only a
completion that starts with a call is read as calls; anything else is content (so is text after
the calls)."""

from __future__ import annotations

from modelyard.api.tools.base import ParsedCall, ParsedOutput, ToolParser
from modelyard.api.tools.scan import scan_call

PYTHON_TAG = "<|python_tag|>"
_ARGUMENT_KEYS = ("parameters", "arguments")


class Llama3JsonParser(ToolParser):
    markers = (PYTHON_TAG, "{")

    def parse(self, text: str, *, final: bool) -> ParsedOutput:
        start = self.find_start(text)
        if start is None:
            return ParsedOutput(text.strip())
        position = start + len(PYTHON_TAG) if text.startswith(PYTHON_TAG, start) else start
        calls: list[ParsedCall] = []
        while True:
            position = _skip(text, position)
            if position >= len(text) or text[position] != "{":
                break
            scan = scan_call(text, position, _ARGUMENT_KEYS)
            if scan.name is None:
                break
            calls.append(ParsedCall(scan.name, scan.arguments))
            if scan.end is None:  # still open, or not JSON after the name: the last call
                position = len(text)
                break
            position = scan.end
        if not calls:
            return ParsedOutput(text.strip())
        return ParsedOutput(text[position:].strip(), calls)

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
