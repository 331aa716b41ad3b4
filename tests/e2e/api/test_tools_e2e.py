"""End-to-end tool calling on SmolLM2-135M-Instruct (the shared e2e server) with the `openai`
SDK: forced calls (required, named) validate against the tool's parameters, streamed argument
fragments assemble to the non-streamed message, a second turn with the tool result is accepted,
malformed tools are 400s. A tiny model: structure is asserted, not cleverness."""

from __future__ import annotations

import json
from typing import Any, Literal

import jsonschema
import openai
import pytest
from e2e_server import E2E_MODEL, ServerProcess
from pydantic import BaseModel

pytestmark = pytest.mark.e2e

WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "London", "Tokyo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather forecast of a city",
            "parameters": WEATHER_PARAMS,
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The local time of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "maxLength": 12}},
                "required": ["city"],
                "additionalProperties": False,
            },
        },
    },
]
QUESTION: list[Any] = [{"role": "user", "content": "What is the weather in Paris this week?"}]
NAMED: Any = {"type": "function", "function": {"name": "get_weather"}}


def _client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def _create(client: openai.OpenAI, choice: Any, max_tokens: int = 80, **extra: Any) -> Any:
    return client.chat.completions.create(
        model=E2E_MODEL,
        messages=QUESTION,
        tools=TOOLS,
        tool_choice=choice,
        max_tokens=max_tokens,
        temperature=0,
        **extra,
    )


def _check_calls(calls: list[Any]) -> None:
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    assert calls
    for call in calls:
        jsonschema.validate(json.loads(call["arguments"]), schemas[call["name"]])


def _streamed(
    client: openai.OpenAI, choice: Any
) -> tuple[list[dict[str, str]], str | None, list[int]]:
    """The calls assembled from a stream, its finish reason and each call's number of argument
    fragments."""
    calls: list[dict[str, str]] = []
    fragments: list[int] = []
    finish = None
    for chunk in _create(client, choice, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        for entry in delta.tool_calls or []:
            if entry.id is not None:
                assert entry.index == len(calls)
                assert entry.type == "function"
                assert entry.function.arguments == ""
                calls.append({"name": entry.function.name, "arguments": ""})
                fragments.append(0)
            else:
                assert entry.function.name is None
                fragments[entry.index] += 1
            calls[entry.index]["arguments"] += entry.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return calls, finish, fragments


@pytest.mark.parametrize(("choice", "finish"), [("required", "tool_calls"), (NAMED, "stop")])
def test_forced_calls_validate_and_stream_the_same(
    server: ServerProcess, choice: Any, finish: str
) -> None:
    client = _client(server)
    reply = _create(client, choice)
    message = reply.choices[0].message
    assert reply.choices[0].finish_reason == finish
    assert message.content is None
    calls = [
        {"name": c.function.name, "arguments": c.function.arguments} for c in message.tool_calls
    ]
    _check_calls(calls)
    assert all(c.id.startswith("call_") and c.type == "function" for c in message.tool_calls)
    if choice is NAMED:
        assert {c["name"] for c in calls} == {"get_weather"}
    streamed, streamed_finish, fragments = _streamed(client, choice)
    assert (streamed, streamed_finish) == (calls, finish)
    _check_calls(streamed)
    assert all(n > 1 for n in fragments)  # the arguments stream as they are generated


def test_a_second_turn_with_the_tool_result_is_accepted(server: ServerProcess) -> None:
    client = _client(server)
    first = _create(client, NAMED).choices[0].message
    call = first.tool_calls[0]
    history: list[Any] = [
        *QUESTION,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"forecast": "sunny", "high": 21}'},
    ]
    second = client.chat.completions.create(
        model=E2E_MODEL, messages=history, tools=TOOLS, max_tokens=16, temperature=0
    )
    assert second.choices[0].message.content or second.choices[0].message.tool_calls


@pytest.mark.parametrize(
    ("change", "param"),
    [
        (
            {"tools": [{"type": "function", "function": {"name": "bad name"}}]},
            "tools[0].function.name",
        ),
        ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "string"}},
                    }
                ]
            },
            "tools[0].function.parameters",
        ),
    ],
)
def test_malformed_tools_are_400s(
    server: ServerProcess, change: dict[str, Any], param: str
) -> None:
    body = {"tools": TOOLS, "tool_choice": "auto", **change}
    with pytest.raises(openai.BadRequestError) as caught:
        _client(server).chat.completions.create(
            model=E2E_MODEL, messages=QUESTION, max_tokens=4, **body
        )
    assert caught.value.body["param"] == param  # type: ignore[index]


class GetWeather(BaseModel):
    """The weather forecast of a city."""

    city: Literal["Paris", "London", "Tokyo"]
    days: Literal[1, 2, 3]


def test_sdk_parse_with_a_pydantic_tool_and_a_pydantic_response_format(
    server: ServerProcess,
) -> None:
    client = _client(server)
    tool = openai.pydantic_function_tool(GetWeather)  # strict: true, additionalProperties false
    called = client.chat.completions.parse(
        model=E2E_MODEL,
        messages=QUESTION,
        tools=[tool],
        tool_choice="required",
        max_tokens=60,
        temperature=0,
    )
    calls = called.choices[0].message.tool_calls
    assert calls  # a tiny model may call more than once (parallel calls are allowed)
    assert all(isinstance(c.function.parsed_arguments, GetWeather) for c in calls)
    answered = client.chat.completions.parse(
        model=E2E_MODEL,
        messages=QUESTION,
        response_format=GetWeather,
        max_tokens=60,
        temperature=0,
    )
    assert isinstance(answered.choices[0].message.parsed, GetWeather)


def test_auto_mode_answers_text_or_calls_held_to_the_schemas(server: ServerProcess) -> None:
    """Auto mode on a Hermes-format model: the model may write text, but a call it starts
    follows the grammar (free text, then calls valid against the tools' parameters)."""
    client = _client(server)
    reply = _create(client, "auto", max_tokens=120)
    [choice] = reply.choices
    message = choice.message
    assert "<tool_call>" not in (message.content or "")
    if message.tool_calls:
        _check_calls([c.function.model_dump() for c in message.tool_calls])
        assert choice.finish_reason == "tool_calls"
    else:
        assert message.content
