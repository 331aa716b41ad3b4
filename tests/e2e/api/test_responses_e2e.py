"""End-to-end Responses API on SmolLM2-135M-Instruct (the shared e2e server) with the `openai`
SDK: text with instructions, a json_schema text format validated with jsonschema, a required
function call then a second turn through `previous_response_id`, streams the SDK parses, and
the 400 / 404 envelopes. A tiny model: structure is asserted, not cleverness."""

from __future__ import annotations

import json
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from e2e_server import E2E_MODEL, ServerProcess

pytestmark = pytest.mark.e2e

PARAMS = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "London"]}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOL: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather of a city",
    "parameters": PARAMS,
    "strict": True,
}


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_text_with_instructions_is_stored(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model=E2E_MODEL,
        input="Say hello.",
        instructions="You answer in one short sentence.",
        max_output_tokens=12,
        temperature=0,
    )
    assert response.object == "response"
    assert response.status in ("completed", "incomplete")
    assert response.output_text
    assert response.usage is not None
    assert response.usage.input_tokens > 10
    assert client.responses.retrieve(response.id).output_text == response.output_text


def test_json_schema_format_follows_the_schema(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model=E2E_MODEL,
        input="Pick a city.",
        text={"format": {"type": "json_schema", "name": "city", "schema": PARAMS, "strict": True}},
        max_output_tokens=40,
        temperature=0,
    )
    jsonschema.validate(json.loads(response.output_text), PARAMS)


def test_required_call_then_its_output_in_a_second_turn(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model=E2E_MODEL,
        input="What is the weather in Paris?",
        tools=[TOOL],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=60,
        temperature=0,
    )
    [call] = [item for item in first.output if item.type == "function_call"]
    jsonschema.validate(json.loads(call.arguments), PARAMS)
    second = client.responses.create(
        model=E2E_MODEL,
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Sunny, 21C"}],
        tools=[TOOL],
        max_output_tokens=20,
        temperature=0,
    )
    assert second.previous_response_id == first.id
    assert second.output
    assert second.usage is not None
    assert first.usage is not None
    assert second.usage.input_tokens > first.usage.input_tokens  # the conversation came along


def test_stream_deltas_join_to_the_final_text(client: openai.OpenAI) -> None:
    stream = client.responses.create(
        model=E2E_MODEL, input="Count to three.", max_output_tokens=16, temperature=0, stream=True
    )
    events = list(stream)
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    last = events[-1]
    assert last.type in ("response.completed", "response.incomplete")  # cut at 16 tokens
    assert deltas
    assert "".join(deltas) == last.response.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_bad_input_and_unknown_ids_are_openai_errors(server: ServerProcess) -> None:
    url = server.url + "/v1/responses"
    bad = {"model": E2E_MODEL, "input": [{"type": "image", "url": "x"}]}
    r = httpx.post(url, json=bad, timeout=30)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "input[0].type"
    unknown = {"model": E2E_MODEL, "input": "x", "previous_response_id": "resp_unknown"}
    r = httpx.post(url, json=unknown, timeout=30)
    assert r.status_code == 404
    assert r.json()["error"]["param"] == "previous_response_id"
    assert httpx.get(url + "/resp_unknown", timeout=30).status_code == 404
