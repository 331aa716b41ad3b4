"""Mistral tool calls: `[TOOL_CALLS]` then a JSON array `[{"name": ..., "arguments": {...}}]`
(or one object); the text before the marker is content. The marker is a special token, kept in
the text of requests that offer tools to a Mistral-format model (engine/client/detokenizer.py)."""

from __future__ import annotations

from modelyard.api.tools.base import ParsedCall, ParsedOutput, ToolParser
from modelyard.api.tools.scan import scan_call, skip_space

MARKER = "[TOOL_CALLS]"
_ARGUMENT_KEYS = ("arguments", "parameters")


class MistralParser(ToolParser):
    markers = (MARKER,)

    def parse(self, text: str, *, final: bool) -> ParsedOutput:
        start = text.find(MARKER)
        if start < 0:
            return ParsedOutput(text.strip())
        position = skip_space(text, start + len(MARKER))
        if text.startswith("[", position):
            position += 1
        calls: list[ParsedCall] = []
        while True:
            position = skip_space(text, position)
            if text.startswith(",", position):
                position += 1
                continue
            if not text.startswith("{", position):
                break
            scan = scan_call(text, position, _ARGUMENT_KEYS)
            if scan.name is None:
                break
            calls.append(ParsedCall(scan.name, scan.arguments))
            if scan.end is None:
                break
            position = scan.end
        if not calls:
            return ParsedOutput(text.strip())
        return ParsedOutput(text[:start].strip(), calls)
