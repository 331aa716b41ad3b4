"""End-to-end structured output on SmolLM2-135M-Instruct (the shared e2e server): ~200 varied
JSON schemas sent concurrently, every finished output validating; choice, regex and
json_object; an unconstrained greedy request unchanged by constrained batch mates; bad
constraints as 400s; a schema over a stream."""

from __future__ import annotations

import asyncio
import json
import random
import re
from typing import Any

import httpx
import jsonschema
import pytest
from e2e_server import E2E_MODEL, ServerProcess

pytestmark = pytest.mark.e2e

NUM_SCHEMAS = 200
CONCURRENCY = 24  # within the e2e server's running + waiting limits (16 + 32)
MAX_TOKENS = 96


def _leaf(rng: random.Random) -> dict[str, Any]:
    kind = rng.randrange(6)
    if kind == 0:
        low = rng.randrange(0, 50)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randrange(1, 100)}
    if kind == 1:
        return {"type": "string", "enum": rng.sample(["red", "green", "blue", "cat", "dog"], 3)}
    if kind == 2:
        return {"type": "boolean"}
    if kind == 3:
        return {"type": "string", "pattern": "^[a-z]{1,6}$"}
    if kind == 4:
        return {"type": "number", "minimum": -5, "maximum": 5}
    return {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "maxItems": 2}


def _schema(i: int) -> dict[str, Any]:
    """A small schema of one of five shapes (objects, nested, arrays, $ref, enums)."""
    rng = random.Random(i)
    names = rng.sample(["id", "name", "age", "color", "ok", "size", "tags", "x"], 3)
    props: dict[str, Any] = {n: _leaf(rng) for n in names[: rng.randrange(1, 4)]}
    shape = i % 5
    if shape == 1:
        props["inner"] = _closed({"v": _leaf(rng)})
    if shape == 2:
        return {"type": "array", "items": _closed(props), "minItems": 1, "maxItems": 2}
    if shape == 3:
        return {**_closed({"item": {"$ref": "#/$defs/item"}}), "$defs": {"item": _closed(props)}}
    if shape == 4:
        return {"type": "string", "enum": [f"option{j}" for j in range(rng.randrange(2, 5))]}
    return _closed(props)


def _closed(props: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": props,
        "required": list(props),
        "additionalProperties": False,
    }


def _chat(content: str, **extra: Any) -> dict[str, Any]:
    return {
        "model": E2E_MODEL,
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
        **extra,
    }


def _json_schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "s", "schema": schema, "strict": True}}


async def _post_all(
    client: httpx.AsyncClient, bodies: list[tuple[str, dict[str, Any]]]
) -> list[dict[str, Any]]:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(path: str, body: dict[str, Any]) -> dict[str, Any]:
        async with gate:
            response = await client.post(path, json=body)
        assert response.status_code == 200, response.text
        data: dict[str, Any] = response.json()
        return data

    return await asyncio.gather(*(one(path, body) for path, body in bodies))


def _choice(data: dict[str, Any]) -> tuple[str, str]:
    """(text, finish_reason) of a chat or completion response's first choice."""
    choice = data["choices"][0]
    text = choice["message"]["content"] if "message" in choice else choice["text"]
    return text, choice["finish_reason"]


async def test_many_schemas_and_kinds_in_one_mixed_batch(server: ServerProcess) -> None:
    free = _chat("Name three colours.", max_tokens=16)
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
        (alone,) = await _post_all(client, [("/v1/chat/completions", free)])
        schemas = [_schema(i) for i in range(NUM_SCHEMAS)]
        bodies = [
            (
                "/v1/chat/completions",
                _chat("Answer in JSON.", response_format=_json_schema_format(s)),
            )
            for s in schemas
        ]
        others = [
            ("/v1/chat/completions", free),
            ("/v1/chat/completions", _chat("Is the sky blue?", guided_choice=["yes", "no"])),
            (
                "/v1/completions",
                {
                    "model": E2E_MODEL,
                    "prompt": "My phone number is",
                    "temperature": 0,
                    "max_tokens": 16,
                    "structured_outputs": {"regex": r"\d{3}-\d{4}"},
                },
            ),
            (
                "/v1/chat/completions",
                _chat("A person as JSON.", response_format={"type": "json_object"}),
            ),
        ]
        results = await _post_all(client, [*others[:2], *bodies, *others[2:]])
    mixed, yes_no, *schema_results, phone, obj = results
    assert _choice(mixed) == _choice(alone)  # constrained batch mates leave it unchanged
    assert _choice(yes_no)[0] in {"yes", "no"}
    assert re.fullmatch(r"\d{3}-\d{4}", _choice(phone)[0])
    obj_text, obj_reason = _choice(obj)
    assert obj_reason == "length" or isinstance(json.loads(obj_text), dict)
    finished = 0
    for schema, data in zip(schemas, schema_results, strict=True):
        text, reason = _choice(data)
        if reason == "length":
            assert data["usage"]["completion_tokens"] == MAX_TOKENS
            continue
        assert reason == "stop", (schema, text)
        jsonschema.validate(json.loads(text), schema)
        finished += 1
    assert finished >= 0.9 * NUM_SCHEMAS


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        (
            "response_format",
            _json_schema_format({"type": "array", "uniqueItems": True}),
            "uniqueItems",
        ),
        ("response_format", {"type": "json_schema", "json_schema": {"name": "s"}}, "schema"),
        ("structured_outputs", {"regex": "a(b"}, "regex"),
        ("guided_grammar", "start: undefined_rule", "unknown name"),
        ("guided_json", "not json", "guided_json"),
    ],
)
def test_bad_constraints_are_400s(
    server: ServerProcess, field: str, value: Any, named: str
) -> None:
    response = httpx.post(server.url + "/v1/chat/completions", json=_chat("hi", **{field: value}))
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert named in error["message"]


def test_two_constraints_at_once_are_a_400(server: ServerProcess) -> None:
    body = _chat("hi", guided_regex="a+", response_format={"type": "json_object"})
    response = httpx.post(server.url + "/v1/chat/completions", json=body)
    assert response.status_code == 400
    assert "give one" in response.json()["error"]["message"]


def test_a_stream_with_a_schema(server: ServerProcess) -> None:
    schema = _closed(
        {"city": {"type": "string", "enum": ["Paris", "Rome"]}, "n": _leaf(random.Random(1))}
    )
    body = _chat(
        "The capital of France as JSON.", stream=True, response_format=_json_schema_format(schema)
    )
    parts: list[str] = []
    reasons: list[str] = []
    with httpx.stream(
        "POST", server.url + "/v1/chat/completions", json=body, timeout=60
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            parts.append(choice["delta"].get("content") or "")
            if choice.get("finish_reason"):
                reasons.append(choice["finish_reason"])
    assert reasons == ["stop"]
    jsonschema.validate(json.loads("".join(parts)), schema)
