"""The grammar that forces tool calls (tool_choice "required" or a named function).

One Lark constraint (engine/constraints.py, kind `grammar`) for the structured-output engine:
Hermes call blocks whose JSON is `{"name": <a tool's name>, "arguments": <valid against its
parameters>}` (anyOf over the tools), one block, or several separated by a newline when
parallel calls are allowed:

    start: call ("\\n" call)*
    call: "<tool_call>\\n" %json {...} "\\n</tool_call>"

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
    options = [call_schema(name, params) for name, params in schemas.items()]
    schema: dict[str, Any] = options[0] if len(options) == 1 else {"anyOf": options}
    schema = {"x-guidance": _JSON_OPTIONS, **schema}
    body = json.dumps(schema, separators=(",", ":"), ensure_ascii=False)  # keys keep their order
    start = 'start: call ("\\n" call)*' if parallel else "start: call"
    text = f'{start}\ncall: "<tool_call>\\n" %json {body} "\\n</tool_call>"\n'
    return constraints.grammar(text)
