"""What a tool-call parser reads out of a completion, and the contract every parser keeps.

A parser turns the text of a completion into `ParsedOutput`: the calls it found and the text
outside them. A call counts as soon as its name is known, its arguments being the raw text the
model has written so far (api/tools/scan.py), so the parse of a growing text only extends the
parse of its prefix: the last call's arguments grow, calls are appended, none is withdrawn.
`final=True` is the parse of a whole completion (its content is what the client gets).
For streaming, `find_start` says where the calls begin and `pending_length` how much of the
text's end may be the start of a call marker (held back from `delta.content`).
"""

from __future__ import annotations

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
    # its arguments as the model wrote them: the raw text of the JSON object (cut short when
    # the completion was), or the decoded value of a JSON string holding them
    arguments: str


@dataclass(slots=True)
class ParsedOutput:
    content: str  # the text outside the calls (stripped; "" when none)
    calls: list[ParsedCall] = field(default_factory=list)


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
