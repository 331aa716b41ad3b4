"""The JSON Schemas of `structured_serving.py`: five typical ones whose compile time it reports,
and the one every constrained request of the throughput runs carries.

The typical ones are what applications send: a flat record with bounds and a pattern, a nested
one with enums, a tool call (a choice of functions, each with its own arguments), a list of
objects, and an event with optional fields, `anyOf` and formats. `LONG_LIST`'s shortest valid
output (ten strings of 64 characters or more) is far longer than the runs' output budget, so
every constrained request is cut at `max_tokens`, as every unconstrained one is (EOS ignored):
both variants then produce the same number of tokens and their per-token figures compare.
"""

from __future__ import annotations

from typing import Any

PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 60},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string", "pattern": "^[a-z0-9.]+@[a-z0-9]+\\.[a-z]{2,4}$"},
        "active": {"type": "boolean"},
    },
    "required": ["name", "age", "email", "active"],
    "additionalProperties": False,
}

ADDRESS_BOOK_ENTRY: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 200},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "tags": {
            "type": "array",
            "items": {"type": "string", "enum": ["friend", "work", "family"]},
            "maxItems": 3,
        },
        "addr": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
        },
    },
    "required": ["name", "age", "tags", "addr"],
    "additionalProperties": False,
}


def _function(name: str, params: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "name": {"const": name},
            "arguments": {
                "type": "object",
                "properties": params,
                "required": list(params),
                "additionalProperties": False,
            },
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


TOOL_CALL: dict[str, Any] = {
    "anyOf": [
        _function("get_weather", {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}}),
        _function("search", {"query": {"type": "string"}, "limit": {"type": "integer"}}),
        _function("send_email", {"to": {"type": "string"}, "body": {"type": "string"}}),
        _function("create_event", {"title": {"type": "string"}, "day": {"type": "string"}}),
    ]
}

ORDER: dict[str, Any] = {
    "type": "object",
    "properties": {
        "order_id": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{6}$"},
        "items": {
            "type": "array",
            "minItems": 1,
            "maxItems": 10,
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string", "maxLength": 12},
                    "quantity": {"type": "integer", "minimum": 1},
                    "price": {"type": "number", "minimum": 0},
                },
                "required": ["sku", "quantity", "price"],
                "additionalProperties": False,
            },
        },
        "currency": {"enum": ["EUR", "USD", "GBP"]},
    },
    "required": ["order_id", "items", "currency"],
    "additionalProperties": False,
}

EVENT: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "minLength": 1, "maxLength": 120},
        "start": {"type": "string", "format": "date-time"},
        "duration_minutes": {"type": "integer", "minimum": 5, "maximum": 1440},
        "location": {
            "anyOf": [
                {"type": "string"},
                {"type": "object", "properties": {"url": {"type": "string", "format": "uri"}}},
            ]
        },
        "attendees": {"type": "array", "items": {"type": "string", "format": "email"}},
        "notes": {"type": ["string", "null"]},
    },
    "required": ["title", "start", "duration_minutes"],
}

#: name -> schema: the typical schemas whose first (compiling) request is timed
TYPICAL: dict[str, dict[str, Any]] = {
    "person": PERSON,
    "address_book_entry": ADDRESS_BOOK_ENTRY,
    "tool_call": TOOL_CALL,
    "order": ORDER,
    "event": EVENT,
}

#: the schema of every constrained request in the throughput runs
LONG_LIST: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "minLength": 20, "maxLength": 120},
        "points": {
            "type": "array",
            "minItems": 10,
            "maxItems": 16,
            "items": {"type": "string", "minLength": 64, "maxLength": 200},
        },
    },
    "required": ["title", "points"],
    "additionalProperties": False,
}


def response_format(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's `response_format` for a JSON Schema."""
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
