"""Mistral tool calls: `[TOOL_CALLS]` then a JSON array `[{"name": ..., "arguments": {...}}]`
(or one object); the text before the marker is content. The marker is a special token: the
model's requests must keep special tokens in the text (`skip_special_tokens=false`)."""

from __future__ import annotations

import json

from modelyard.api.tools.base import ParsedOutput, ToolParser, as_call

MARKER = "[TOOL_CALLS]"
_DECODER = json.JSONDecoder()


class MistralParser(ToolParser):
    markers = (MARKER,)

    def parse(self, text: str, *, final: bool) -> ParsedOutput:
        start = text.find(MARKER)
        if start < 0:
            return ParsedOutput(text.strip())
        body = text[start + len(MARKER) :].lstrip()
        try:
            value, _ = _DECODER.raw_decode(body)
        except ValueError:
            return ParsedOutput(text.strip() if final else text[:start].strip())
        items = value if isinstance(value, list) else [value]
        calls = [as_call(item, "arguments", "parameters") for item in items]
        if not calls or any(call is None for call in calls):
            return ParsedOutput(text.strip())
        return ParsedOutput(text[:start].strip(), [c for c in calls if c is not None])
