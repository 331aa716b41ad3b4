"""What a tool-call parser reads out of a completion, and the contract every parser keeps.

A parser turns the whole text of a completion into `ParsedOutput`: the calls it found and the
text outside them. `final=False` (while streaming) reports only calls that can no longer
change; `final=True` also accepts a last call whose closing marker never came. For streaming,
`find_start` says where the calls begin and `pending_length` how much of the text's end may
be the start of a call marker (held back from `delta.content`).
"""

from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass, field

_ID_ALPHABET = string.ascii_letters + string.digits


def new_call_id() -> str:
    """An OpenAI-style tool call id: `call_` and 24 random letters and digits."""
    return "call_" + "".join(secrets.choice(_ID_ALPHABET) for _ in range(24))


@dataclass(frozen=True, slots=True)
class ParsedCall:
    name: str  # the function's name
    arguments: str  # its arguments, a JSON object as text


@dataclass(slots=True)
class ParsedOutput:
    content: str  # the text outside the calls (stripped; "" when none)
    calls: list[ParsedCall] = field(default_factory=list)


def as_call(obj: object, *argument_keys: str) -> ParsedCall | None:
    """A call from a decoded JSON value `{"name": str, <argument key>: object}`, else None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments: object = next((obj[k] for k in argument_keys if k in obj), {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(obj["name"], json.dumps(arguments, ensure_ascii=False))


class ToolParser:
    """A parser of tool calls introduced by one of `markers` anywhere in the text."""

    markers: tuple[str, ...] = ()

    def parse(self, text: str, *, final: bool) -> ParsedOutput:
        raise NotImplementedError

    def find_start(self, text: str) -> int | None:
        """Where the first call marker begins, or None."""
        found = [i for i in (text.find(m) for m in self.markers) if i >= 0]
        return min(found) if found else None

    def pending_length(self, text: str) -> int:
        """Length of the longest end of `text` that is a proper prefix of a marker."""
        best = 0
        for marker in self.markers:
            for size in range(min(len(marker) - 1, len(text)), best, -1):
                if text.endswith(marker[:size]):
                    best = size
                    break
        return best
