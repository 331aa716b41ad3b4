"""The grammars of tool calls: forced (tool_choice "required" or a named function) and auto.

Each is one Lark constraint (engine/constraints.py, kind `grammar`) for the structured-output
engine, built on Hermes call blocks whose JSON is `{"name": <a tool's name>, "arguments":
<valid against its parameters>}` (anyOf over the tools): one block, or several separated by a
newline when parallel calls are allowed.

Forced, the output is nothing but calls:

    start: call ("\\n" call)*
    call: "<tool_call>\\n" %json {...} "\\n</tool_call>"

Auto, free text that does not contain `<tool_call>`, then, once the model writes that marker,
calls that must follow the schemas (so `strict: true` holds in auto mode too):

    start: TEXT | OPEN body ("\\n" call)*
    TEXT: /(?s:.*)/ & ~/(?s:.*<tool_call>.*)/
    OPEN: the same text, then "<tool_call>"
    call: "<tool_call>" body
    body: "\\n" %json {...} "\\n</tool_call>"

The text is one lexeme that excludes the marker and the marker ends the other, so the lexer
never has to guess where the text ends; every token is allowed while the model writes text.
Every model's forced calls use this wrapper, so they are read with the Hermes parser.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from modelyard.engine import constraints
from modelyard.engine.constraints import Constraint

#: Compact JSON inside the calls, as the other JSON constraints (constraints._JSON_OPTIONS).
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
#: Free text without the call marker (llguidance's `&` and `~` on lexemes).
_FREE_TEXT = r"/(?s:.*)/ & ~/(?s:.*<tool_call>.*)/"


def call_schema(name: str, parameters: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON Schema of one call of function `name`."""
    return {
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": dict(parameters)},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def forced_calls(schemas: Mapping[str, Mapping[str, Any]], *, parallel: bool) -> Constraint:
    """The constraint for calls of the functions `schemas` (name -> parameters schema)."""
    start = 'start: call ("\\n" call)*' if parallel else "start: call"
    return constraints.grammar(
        f'{start}\ncall: "<tool_call>\\n" %json {_json(schemas)} "\\n</tool_call>"\n'
    )


def auto_calls(schemas: Mapping[str, Mapping[str, Any]], *, parallel: bool) -> Constraint:
    """The constraint for free text, then (once the model starts one) calls of `schemas`."""
    more = ' ("\\n" call)*' if parallel else ""
    rules = [
        f"start: TEXT | OPEN body{more}",
        f"TEXT: {_FREE_TEXT}",
        f'OPEN: {_FREE_TEXT} "<tool_call>"',
        'call: "<tool_call>" body',
        f'body: "\\n" %json {_json(schemas)} "\\n</tool_call>"',
    ]
    return constraints.grammar("\n".join(rules) + "\n")


def _json(schemas: Mapping[str, Mapping[str, Any]]) -> str:
    """The `%json` argument: a call of any of `schemas`."""
    options = [call_schema(name, params) for name, params in schemas.items()]
    schema: dict[str, Any] = options[0] if len(options) == 1 else {"anyOf": options}
    schema = {"x-guidance": _JSON_OPTIONS, **schema}
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)  # keys keep their order
