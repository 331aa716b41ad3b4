"""/v1/chat/completions with tools over the fake engine: messages, streams, refusals."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from api_helpers import make_client

from fakes.llm import FakeLLM
from fakes.models import FakeProvider
from modelyard.api.app import build_app
from modelyard.api.protocol import ChatCompletionRequest
from modelyard.api.streaming import parse_sse
from modelyard.api.tools.parsing import with_auto_grammar
from modelyard.config import ModelyardConfig
from modelyard.engine import constraints
from modelyard.engine.client.protocol import EngineCapabilities
from modelyard.engine.sampling_params import SamplingParams

pytestmark = pytest.mark.unit

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
REPLY = 'Checking. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
BODY = {"model": "m", "messages": [{"role": "user", "content": "w?"}], "tools": [TOOL]}


@pytest.fixture
def tool_llm() -> FakeLLM:
    capabilities = EngineCapabilities(structured_output=True, tools=True)
    return FakeLLM(name="m", max_len=4096, reply=REPLY, capabilities=capabilities)


@pytest.fixture
async def tool_client(tool_llm: FakeLLM) -> AsyncIterator[httpx.AsyncClient]:
    app = build_app(
        FakeProvider({"m": tool_llm, "plain": FakeLLM(name="plain")}), ModelyardConfig()
    )
    async with make_client(app) as c:
        yield c


async def test_calls_come_back_as_message_tool_calls(
    tool_client: httpx.AsyncClient, tool_llm: FakeLLM
) -> None:
    r = await tool_client.post("/v1/chat/completions", json=BODY)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] == "Checking."
    [call] = message["tool_calls"]
    assert call["id"].startswith("call_")
    assert call["type"] == "function"
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert tool_llm.rendered[-1][1] == [TOOL]  # the template got the tools
    # auto: the model chooses; a Hermes-format model's calls are held to the schemas
    offer = ChatCompletionRequest.model_validate(BODY).tool_offer()
    assert offer is not None
    assert tool_llm.calls[-1].params.constraint == offer.auto_constraint()


async def test_auto_grammar_only_without_response_format_and_for_hermes_models(
    tool_client: httpx.AsyncClient, tool_llm: FakeLLM
) -> None:
    json_format = {"type": "json_object"}
    r = await tool_client.post(
        "/v1/chat/completions", json={**BODY, "response_format": json_format}
    )
    assert r.status_code == 200, r.text
    assert tool_llm.calls[-1].params.constraint == constraints.json_object()
    offer = ChatCompletionRequest.model_validate(BODY).tool_offer()
    assert offer is not None
    offer = dataclasses.replace(offer, auto_grammar=offer.auto_constraint())
    params = SamplingParams()
    assert with_auto_grammar(offer, tool_llm, params).constraint == offer.auto_grammar
    mistral = SimpleNamespace(
        capabilities=tool_llm.capabilities,
        tokenizer=SimpleNamespace(chat_template="{{ tools }} [TOOL_CALLS]"),
    )
    assert with_auto_grammar(offer, mistral, params) is params  # type: ignore[arg-type]
    ray = FakeLLM(name="r", capabilities=EngineCapabilities(tools=True))
    assert with_auto_grammar(offer, ray, params) is params  # no structured output: free


async def test_streamed_deltas_assemble_to_the_same_message(tool_client: httpx.AsyncClient) -> None:
    r = await tool_client.post("/v1/chat/completions", json={**BODY, "stream": True})
    chunks = [json.loads(p) for p in parse_sse(r.text) if p != "[DONE]"]
    content, calls, finish = "", [], None
    for chunk in chunks:
        [choice] = chunk["choices"]
        delta: dict[str, Any] = choice["delta"]
        content += delta.get("content") or ""
        for entry in delta.get("tool_calls", []):
            if "id" in entry:
                calls.append(dict(entry["function"]))
            else:
                calls[entry["index"]]["arguments"] += entry["function"]["arguments"]
        finish = choice["finish_reason"] or finish
    assert content.strip() == "Checking."
    assert calls == [{"name": "get_weather", "arguments": '{"city": "Paris"}'}]
    assert finish == "tool_calls"
    assert chunks[-1]["choices"][0]["delta"] == {}  # the reason comes alone, as OpenAI


async def test_required_sends_the_forcing_grammar_and_none_offers_nothing(
    tool_client: httpx.AsyncClient, tool_llm: FakeLLM
) -> None:
    r = await tool_client.post("/v1/chat/completions", json={**BODY, "tool_choice": "required"})
    assert r.status_code == 200, r.text
    constraint = tool_llm.calls[-1].params.constraint
    assert constraint is not None
    assert "get_weather" in constraint.spec
    r = await tool_client.post("/v1/chat/completions", json={**BODY, "tool_choice": "none"})
    assert r.json()["choices"][0]["message"] == {"role": "assistant", "content": REPLY}
    assert tool_llm.rendered[-1][1] is None


@pytest.mark.parametrize(
    ("change", "param"),
    [
        (
            {"tools": [{"type": "function", "function": {"description": "no name"}}]},
            "tools.0.function.name",
        ),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
        ({"tool_choice": {"type": "function", "function": {"name": "other"}}}, "tool_choice"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        (
            {"messages": [{"role": "tool", "content": "x", "tool_call_id": "call_9"}]},
            "messages[0].tool_call_id",
        ),
        ({"model": "plain"}, None),  # a model whose engine serves no tools
    ],
)
async def test_malformed_tools_are_400s_in_the_openai_envelope(
    tool_client: httpx.AsyncClient, change: dict[str, Any], param: str | None
) -> None:
    r = await tool_client.post("/v1/chat/completions", json={**BODY, **change})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"].startswith(param.split(".")[0].split("[")[0])
        assert error["param"] == param or param.startswith("tool_choice")
    else:
        assert "tools" in error["message"]
