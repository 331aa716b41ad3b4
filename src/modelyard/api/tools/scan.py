"""A JSON-aware scanner of one tool call object, for text that may still be growing.

`scan_call(text, pos, argument_keys)` walks the top-level keys of the object that opens at
`text[pos]` (`{"name": ..., "arguments": {...}}`, keys in any order) without decoding the
arguments: string- and escape-aware bracket depth says where each value ends. It reports the
function's name once its string is complete and the arguments as the model wrote them:

- an object value: its raw text, the part written so far while it is still open, so the
  arguments can stream as they are generated (api/tools/parsing.ToolCallStream);
- a string value (some models write the arguments as a JSON string): the decoded string, once
  the string is complete ("" before);
- no arguments key in a closed object: `{}`.

Everything depends only on the text scanned so far and only grows with it: the arguments of a
longer text start with those of any prefix of it. That is what lets a stream send fragments that
add up to the arguments of the whole-text parse.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

#: A complete JSON string, a lone quote (an unterminated string) or a bracket.
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|"|[{}\[\]]')
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_SCALAR = re.compile(r"[^,}\]\s]*")
_SPACE = re.compile(r"\s*")


def skip_space(text: str, pos: int) -> int:
    """The index of the first non-space character at or after `pos`."""
    match = _SPACE.match(text, pos)
    return match.end() if match else pos


def value_end(text: str, pos: int) -> int | None:
    """Where the JSON value starting at `text[pos]` ends (exclusive), or None when the text ends
    first. Brackets are counted outside strings only; the value is not otherwise validated."""
    if pos >= len(text):
        return None
    first = text[pos]
    if first == '"':
        string = _STRING.match(text, pos)
        return string.end() if string else None
    if first in "{[":
        depth = 0
        for token in _TOKEN.finditer(text, pos):
            mark = token.group()
            if mark == '"':
                return None
            if mark in "{[":
                depth += 1
            elif mark in "}]":
                depth -= 1
                if depth == 0:
                    return token.end()
        return None
    scalar = _SCALAR.match(text, pos)
    end = scalar.end() if scalar else pos
    return end if end < len(text) else None


@dataclass(slots=True)
class CallScan:
    """What the text so far says about one call object."""

    name: str | None = None  # the function's name, once its string is complete
    arguments: str = ""  # the arguments written so far (see the module docstring)
    end: int | None = None  # the index after the closing brace; None while open or broken
    broken: bool = False  # the object is not JSON (scanning stopped there)


def scan_call(text: str, pos: int, argument_keys: tuple[str, ...]) -> CallScan:
    """Scan the call object opening at `text[pos]` (which must be `{`); the first of
    `argument_keys` met holds the arguments."""
    scan = CallScan()
    args: tuple[int, int | None] | None = None  # (start, end) of the arguments value
    i = pos + 1
    while True:
        i = skip_space(text, i)
        if i >= len(text):
            break
        if text[i] == "}":
            scan.end = i + 1
            break
        if text[i] == ",":
            i += 1
            continue
        if text[i] != '"':
            scan.broken = True
            break
        key_end = value_end(text, i)
        colon = skip_space(text, key_end) if key_end is not None else len(text)
        if colon >= len(text):
            break
        if text[colon] != ":":
            scan.broken = True
            break
        key = _string(text[i:key_end])
        if key is None:
            scan.broken = True
            break
        start = skip_space(text, colon + 1)
        end = value_end(text, start)
        if key == "name" and scan.name is None and end is not None:
            scan.name = _string(text[start:end])
        elif key in argument_keys and args is None and start < len(text):
            args = (start, end)
        if end is None:
            break
        i = end
    scan.arguments = _arguments(text, args, closed=scan.end is not None)
    return scan


def _arguments(text: str, span: tuple[int, int | None] | None, *, closed: bool) -> str:
    if span is None:
        return "{}" if closed else ""
    start, end = span
    if text[start] == "{":
        return text[start:end]
    if end is None:
        return ""
    raw = text[start:end]
    decoded = _string(raw)
    return raw if decoded is None else decoded


def _string(raw: str) -> str | None:
    """The value of a JSON string literal; None for anything else (or a malformed one)."""
    if not raw.startswith('"'):
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, str) else None
