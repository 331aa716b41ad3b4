"""A real agent framework on modelyard: the openai-agents SDK runs an `Agent` with two Python
function tools against the shared e2e server (SmolLM2-135M-Instruct) over chat completions.

The first turn is forced to call a tool (`tool_choice="required"`, enforced by the grammar; the
SDK resets it to auto after the call), the SDK runs the Python function and sends its output
back, and the model's final answer repeats it: each tool returns a distinctive token that the
answer contains at temperature 0 (checked to be deterministic). Run and streamed run alike."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import jsonschema
import pytest
from agents import (
    Agent,
    FunctionTool,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from agents.items import MessageOutputItem, ToolCallItem, ToolCallOutputItem
from agents.result import RunResultBase
from e2e_server import E2E_MODEL, ServerProcess
from openai import AsyncOpenAI
from openai.types.responses import ResponseFunctionToolCall

pytestmark = pytest.mark.e2e

INSTRUCTIONS = "Answer with the tool result only, repeated verbatim."
QUESTION = "What is the secret code of Paris?"
#: what each tool returns: a token the model cannot know but from the tool result
TOKENS = {"lookup_code": "42-BLUE", "get_weather": "SUNNY-17"}


class Recorder:
    """The agent's two tools; each call of their Python functions is recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

        @function_tool
        def lookup_code(city: str) -> str:
            """Return the secret code of a city."""
            self.calls.append(("lookup_code", {"city": city}))
            return TOKENS["lookup_code"]

        @function_tool
        def get_weather(city: str, days: int) -> str:
            """Return the weather forecast of a city for a number of days."""
            self.calls.append(("get_weather", {"city": city, "days": days}))
            return TOKENS["get_weather"]

        self.tools: list[FunctionTool] = [lookup_code, get_weather]


@pytest.fixture
async def client(server: ServerProcess) -> AsyncIterator[AsyncOpenAI]:
    set_tracing_disabled(True)
    async with AsyncOpenAI(base_url=server.url + "/v1", api_key="unused") as opened:
        yield opened


def make_agent(client: AsyncOpenAI, recorder: Recorder) -> Agent[None]:
    return Agent(
        name="helper",
        instructions=INSTRUCTIONS,
        model=OpenAIChatCompletionsModel(model="smollm2", openai_client=client),
        tools=list(recorder.tools),
        model_settings=ModelSettings(
            tool_choice="required", parallel_tool_calls=False, temperature=0.0, max_tokens=48
        ),
    )


def assert_tool_round_trip(result: RunResultBase, recorder: Recorder) -> None:
    """One tool call with arguments valid for its schema, its function ran with them, its
    output went back to the model, and the final answer (after it) repeats that output."""
    items = result.new_items
    kinds = [type(item) for item in items]
    assert kinds == [ToolCallItem, ToolCallOutputItem, MessageOutputItem], kinds
    call, output = items[0].raw_item, items[1]
    assert isinstance(call, ResponseFunctionToolCall)
    name, arguments = call.name, json.loads(call.arguments)
    schema = next(t.params_json_schema for t in recorder.tools if t.name == name)
    jsonschema.validate(arguments, schema)
    assert recorder.calls == [(name, arguments)]
    assert output.output == TOKENS[name]
    assert isinstance(output.raw_item, dict)
    assert output.raw_item["call_id"] == call.call_id
    assert isinstance(result.final_output, str)
    assert TOKENS[name] in result.final_output, result.final_output


async def test_an_agent_calls_a_python_tool_and_answers_with_its_result(
    client: AsyncOpenAI,
) -> None:
    recorder = Recorder()
    result = await Runner.run(make_agent(client, recorder), QUESTION)
    assert_tool_round_trip(result, recorder)


async def test_a_streamed_agent_run_has_the_same_structure(client: AsyncOpenAI) -> None:
    recorder = Recorder()
    result = Runner.run_streamed(make_agent(client, recorder), QUESTION)
    events = [event.type async for event in result.stream_events()]
    assert result.is_complete
    assert "raw_response_event" in events  # the model's streamed chunks reached the SDK
    assert_tool_round_trip(result, recorder)


async def test_v1_models_says_the_model_serves_tools(client: AsyncOpenAI) -> None:
    """What an agent framework can check first: the chat model lists tool calling and
    structured output (an extra field of the OpenAI model object)."""
    listed = {m.id: m for m in (await client.models.list()).data}
    capabilities = listed[E2E_MODEL].model_extra or {}
    expected = {"chat": True, "tools": True, "structured_output": True}
    assert capabilities.get("capabilities") == expected
