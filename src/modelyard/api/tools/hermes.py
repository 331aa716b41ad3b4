"""Hermes / Qwen tool calls: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one
block per call, text around them is content. A block whose object names no function (not JSON,
no `name`) stays content; an unclosed last block is a call once its name is known."""

from __future__ import annotations

from modelyard.api.tools.base import ParsedCall, ParsedOutput, ToolParser
from modelyard.api.tools.scan import scan_call, skip_space

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_ARGUMENT_KEYS = ("arguments", "parameters")


class HermesParser(ToolParser):
    markers = (OPEN,)

    def parse(self, text: str, *, final: bool) -> ParsedOutput:
        calls: list[ParsedCall] = []
        kept: list[str] = []
        position = 0
        while (opened := text.find(OPEN, position)) >= 0:
            body_start = opened + len(OPEN)
            closed = text.find(CLOSE, body_start)
            if closed >= 0:
                body, block_end = text[body_start:closed], closed + len(CLOSE)
            else:
                body, block_end = _without_partial_close(text[body_start:]), len(text)
            call = _call(body)
            kept.append(text[position:opened] if call is not None else text[position:block_end])
            if call is not None:
                calls.append(call)
            position = block_end
        kept.append(text[position:])
        return ParsedOutput("".join(kept).strip(), calls)


def _call(body: str) -> ParsedCall | None:
    start = skip_space(body, 0)
    if start >= len(body) or body[start] != "{":
        return None
    scan = scan_call(body, start, _ARGUMENT_KEYS)
    return ParsedCall(scan.name, scan.arguments) if scan.name is not None else None


def _without_partial_close(body: str) -> str:
    """An unclosed block's body, less an end that may begin the closing tag."""
    for size in range(min(len(CLOSE) - 1, len(body)), 0, -1):
        if body.endswith(CLOSE[:size]):
            return body[:-size]
    return body
