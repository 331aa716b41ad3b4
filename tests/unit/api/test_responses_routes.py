"""/v1/responses over the fake engine, read with the `openai` SDK: text, tool calls and a second
turn through `previous_response_id`, streams the SDK parses, stored responses, 400s and 404s."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from api_helpers import make_client, path_app

from fakes.llm import FakeLLM
from fakes.models import CatalogProvider, FakeProvider, MemoryKeys
from modelyard.api.app import build_app
from modelyard.api.responses_store import ResponseStore
from modelyard.config import ModelyardConfig
from modelyard.engine.client.protocol import EngineCapabilities
from modelyard.model_spec import ModelKind, ModelSpec

pytestmark = pytest.mark.unit

REPLY = 'Checking. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": True,
}


@pytest.fixture
def tool_llm() -> FakeLLM:
    capabilities = EngineCapabilities(structured_output=True, tools=True)
    return FakeLLM(name="m", max_len=4096, reply=REPLY, capabilities=capabilities)


@pytest.fixture
async def sdk(tool_llm: FakeLLM) -> AsyncIterator[openai.AsyncOpenAI]:
    plain = FakeLLM(name="plain", max_len=4096, reply="Hello there.")
    app = build_app(FakeProvider({"m": tool_llm, "plain": plain}), ModelyardConfig())
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        yield openai.AsyncOpenAI(
            api_key="unused", base_url="http://test/v1", http_client=http, max_retries=0
        )


async def test_text_response_and_get_of_the_stored_one(sdk: openai.AsyncOpenAI) -> None:
    response = await sdk.responses.create(
        model="plain", input="Hi", instructions="Be brief.", metadata={"k": "v"}
    )
    assert response.id.startswith("resp_")
    assert response.status == "completed"
    assert response.output_text == "Hello there."
    assert response.output[0].type == "message"
    assert response.output[0].id.startswith("msg_")
    assert response.instructions == "Be brief."
    assert response.metadata == {"k": "v"}
    usage = response.usage
    assert usage is not None
    assert usage.output_tokens == len("Hello there.")
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    stored = await sdk.responses.retrieve(response.id)
    assert stored.model_dump() == response.model_dump()


async def test_store_false_keeps_nothing_and_text_format_comes_back(
    sdk: openai.AsyncOpenAI, tool_llm: FakeLLM
) -> None:
    fmt: Any = {"type": "json_schema", "name": "c", "schema": {"type": "object"}}
    response = await sdk.responses.create(model="m", input="x", store=False, text={"format": fmt})
    assert tool_llm.calls[-1].params.constraint is not None  # the schema constrains the output
    assert response.text is not None
    echoed = response.text.model_dump(exclude_none=True, by_alias=True)["format"]
    assert echoed == fmt
    with pytest.raises(openai.NotFoundError):
        await sdk.responses.retrieve(response.id)


async def test_cut_at_max_output_tokens_is_incomplete(sdk: openai.AsyncOpenAI) -> None:
    response = await sdk.responses.create(model="plain", input="Hi", max_output_tokens=5)
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output_text == "Hello"


async def test_call_then_second_turn_with_previous_response_id(
    sdk: openai.AsyncOpenAI, tool_llm: FakeLLM
) -> None:
    first = await sdk.responses.create(
        model="m",
        input="Weather in Paris?",
        tools=[TOOL],
        tool_choice="required",  # type: ignore[list-item]
    )
    assert tool_llm.calls[-1].params.constraint is not None  # required: the forcing grammar
    [call] = [item for item in first.output if item.type == "function_call"]
    assert [item.type for item in first.output] == ["function_call"]
    assert call.id.startswith("fc_")
    assert (call.name, call.arguments) == ("get_weather", '{"city": "Paris"}')
    assert first.tools[0].type == "function"
    second = await sdk.responses.create(
        model="m",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
    )
    assert second.previous_response_id == first.id
    messages = tool_llm.rendered[-1][0]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]
    assert not messages[1]["content"]  # a forced output is calls only: the text is dropped
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert messages[2] == {"role": "tool", "content": "sunny", "tool_call_id": call.call_id}


async def test_streamed_text_joins_to_the_final_text(sdk: openai.AsyncOpenAI) -> None:
    async with sdk.responses.stream(model="plain", input="Hi") as stream:
        events = [event async for event in stream]
        final = await stream.get_final_response()
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == "Hello there."
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert (await sdk.responses.retrieve(final.id)).output_text == "Hello there."


async def test_streamed_calls_match_the_whole_response(sdk: openai.AsyncOpenAI) -> None:
    stream = await sdk.responses.create(model="m", input="w?", tools=[TOOL], stream=True)  # type: ignore[list-item]
    events = [event async for event in stream]
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [e.arguments for e in done] == ['{"city": "Paris"}']
    completed = events[-1]
    assert completed.type == "response.completed"
    kinds = [item.type for item in completed.response.output]
    assert kinds == ["message", "function_call"]
    assert completed.response.output_text.strip() == "Checking."


async def test_a_failure_mid_stream_is_an_error_event(
    sdk: openai.AsyncOpenAI, tool_llm: FakeLLM
) -> None:
    tool_llm.fail_after = 3
    stream = await sdk.responses.create(model="m", input="x", stream=True)
    events = [event async for event in stream]
    assert events[-1].type == "error"
    assert "engine exploded" in events[-1].message
    assert [e.sequence_number for e in events] == list(range(len(events)))


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"input": [{"type": "image", "url": "x"}]}, 400, "input[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, 400, None),
        ({"input": [{"type": "function_call_output", "call_id": "c1", "output": "x"}]}, 400, None),
        ({"input": "x", "text": {"format": {"type": "json_schema", "name": "s"}}}, 400, None),
        ({"input": "x", "tools": [{"type": "function", "name": "a b"}]}, 400, "tools[0].name"),
        ({"input": "x", "max_output_tokens": 0}, 400, "max_output_tokens"),
        ({"input": "x", "previous_response_id": "resp_nope"}, 404, "previous_response_id"),
        ({"input": []}, 400, "input"),
        ({"model": "plain", "input": "x", "tools": [TOOL]}, 400, "model"),
    ],
)
async def test_bad_requests_are_openai_errors(
    sdk: openai.AsyncOpenAI, body: dict[str, Any], status: int, param: str | None
) -> None:
    http = sdk._client  # the SDK's httpx client, on the app
    r = await http.post("http://test/v1/responses", json={"model": "m", **body})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["type"] == ("invalid_request_error" if status == 400 else "not_found_error")
    if param is not None:
        assert error["param"] == param
    r = await http.get("http://test/v1/responses/resp_nope")
    assert r.status_code == 404


def test_store_is_per_tenant_bounded_and_expires() -> None:
    now = [0.0]
    store = ResponseStore(ttl_s=10.0, max_per_tenant=2, clock=lambda: now[0])
    for i in range(3):
        store.put("a", {"id": f"r{i}", "output": []}, [])
    assert store.get("a", "r0") is None  # bounded: the oldest went
    assert store.get("a", "r2") is not None
    assert store.get("b", "r2") is None  # another tenant's
    now[0] = 11.0
    assert store.get("a", "r2") is None  # expired


async def test_a_stored_response_is_its_tenants_only_and_the_allow_list_holds() -> None:
    specs = [ModelSpec(id=n, kind=ModelKind.CHAT, backend="llm") for n in ("m", "other")]
    provider, keys = CatalogProvider(specs), MemoryKeys()
    provider.models.update({"m": FakeLLM(name="m", max_len=256), "other": FakeLLM(name="other")})
    acme, beta = keys.bearer("acme", models=("m",)), keys.bearer("beta", models=("m",))
    async with make_client(path_app(provider, keys, {})) as client:
        r = await client.post("/v1/responses", json={"model": "m", "input": "hi"}, headers=acme)
        assert r.status_code == 200, r.text
        response_id = r.json()["id"]
        assert (await client.get(f"/v1/responses/{response_id}", headers=acme)).status_code == 200
        assert (await client.get(f"/v1/responses/{response_id}", headers=beta)).status_code == 404
        follow = {"model": "m", "input": "more", "previous_response_id": response_id}
        r = await client.post("/v1/responses", json=follow, headers=beta)
        assert r.status_code == 404
        r = await client.post("/v1/responses", json={"model": "other", "input": "x"}, headers=acme)
        assert r.status_code == 403  # the request path's allow-list
