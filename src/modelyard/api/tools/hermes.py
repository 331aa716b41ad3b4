"""Hermes / Qwen tool calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one
block per call, text around them is content. A block whose JSON does not parse stays content."""

from __future__ import annotations

import json
import re

from modelyard.api.tools.base import ParsedCall, ParsedOutput, ToolParser, as_call

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class HermesParser(ToolParser):
    markers = (OPEN,)

    def parse(self, text: str, *, final: bool) -> ParsedOutput:
        calls: list[ParsedCall] = []
        kept: list[str] = []
        position = 0
        for match in _BLOCK.finditer(text):
            call = _decode(match.group(1))
            if call is not None:
                calls.append(call)
                kept.append(text[position : match.start()])
                position = match.end()
        rest = text[position:]
        start = rest.find(OPEN)
        if final and start >= 0 and CLOSE not in rest[start:]:
            call = _decode(rest[start + len(OPEN) :])
            if call is not None:  # the last call, its closing tag never written
                calls.append(call)
                rest = rest[:start]
        kept.append(rest)
        return ParsedOutput("".join(kept).strip(), calls)


def _decode(body: str) -> ParsedCall | None:
    try:
        return as_call(json.loads(body), "arguments", "parameters")
    except ValueError:
        return None
