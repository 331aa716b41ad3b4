"""OpenAI routes over the fake engine: field mapping, response shapes, SSE framing, errors."""

from __future__ import annotations

import json

import httpx
import pytest
from api_helpers import make_client

from fakes.llm import FakeLLM
from fakes.models import FakeProvider
from modelyard.api.app import build_app
from modelyard.api.streaming import parse_sse
from modelyard.config import ModelyardConfig
from modelyard.gateway.base import Principal, RouteDecision

pytestmark = pytest.mark.unit

CHAT = {"model": "m", "messages": [{"role": "user", "content": "abc"}]}


async def test_chat_maps_every_sampling_field(client: httpx.AsyncClient, llm: FakeLLM) -> None:
    body = {
        **CHAT,
        "max_completion_tokens": 5,
        "max_tokens": 9,
        "temperature": 0.3,
        "top_p": 0.9,
        "n": 2,
        "stop": "zz",
        "seed": 7,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "logprobs": True,
        "top_logprobs": 1,
        "user": "u1",
        "top_k": 4,
        "min_p": 0.1,
        "repetition_penalty": 1.2,
        "ignore_eos": True,
        "min_tokens": 2,
        "priority": 3,
    }
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    p = llm.calls[0].params
    assert (p.max_tokens, p.temperature, p.top_p, p.n, p.stop, p.seed) == (
        5,
        0.3,
        0.9,
        2,
        ["zz"],
        7,
    )
    assert (p.presence_penalty, p.frequency_penalty, p.logprobs) == (0.5, -0.5, 1)
    assert (p.top_k, p.min_p, p.repetition_penalty, p.ignore_eos, p.min_tokens) == (
        4,
        0.1,
        1.2,
        True,
        2,
    )
    assert llm.calls[0].priority == 3
    assert llm.calls[0].prompt == [ord(c) for c in "user:abc"]


async def test_chat_response_shape_and_headers(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 3})
    data = r.json()
    assert data["object"] == "chat.completion"
    assert data["id"].startswith("chatcmpl-")
    assert data["model"] == "m"
    # the fake generates the prompt "user:abc" reversed
    assert data["choices"] == [
        {
            "index": 0,
            "logprobs": None,
            "message": {"role": "assistant", "content": "cba"},
            "finish_reason": "length",
        }
    ]
    assert data["usage"] == {
        "prompt_tokens": 8,
        "completion_tokens": 3,
        "total_tokens": 11,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert data["modelyard"]["ttft"] == pytest.approx(1.0)
    assert float(r.headers["x-modelyard-queue-time"]) == pytest.approx(0.5)
    assert float(r.headers["x-modelyard-ttft"]) == pytest.approx(1.0)
    assert r.headers["x-modelyard-route"] == "m->m;direct"
    assert r.headers["x-request-id"]


async def test_chat_logprobs_shape(client: httpx.AsyncClient) -> None:
    body = {**CHAT, "max_tokens": 2, "logprobs": True, "top_logprobs": 1}
    data = (await client.post("/v1/chat/completions", json=body)).json()
    content = data["choices"][0]["logprobs"]["content"]
    assert [e["token"] for e in content] == ["c", "b"]
    assert content[0]["top_logprobs"][0] == {"token": "c", "logprob": -0.5, "bytes": [99]}


async def test_n_gives_n_choices(client: httpx.AsyncClient) -> None:
    data = (
        await client.post("/v1/chat/completions", json={**CHAT, "max_tokens": 2, "n": 2})
    ).json()
    assert [c["message"]["content"] for c in data["choices"]] == ["0c0b", "1c1b"]
    assert data["usage"]["completion_tokens"] == 4


async def test_completions_prompt_forms(client: httpx.AsyncClient, llm: FakeLLM) -> None:
    r = await client.post("/v1/completions", json={"model": "m", "prompt": "hello"})
    data = r.json()
    assert data["object"] == "text_completion"
    assert data["choices"][0]["text"] == "olleh"
    assert llm.calls[-1].params.max_tokens == 16  # OpenAI's completions default
    r = await client.post("/v1/completions", json={"model": "m", "prompt": ["ab", "cd"], "n": 2})
    texts = [c["text"] for c in r.json()["choices"]]
    assert texts == ["0b0a", "1b1a", "0d0c", "1d1c"]  # prompt p, completion i -> p * n + i
    r = await client.post("/v1/completions", json={"model": "m", "prompt": [104, 105]})
    assert r.json()["choices"][0]["text"] == "ih"
    assert llm.calls[-1].prompt == [104, 105]
    r = await client.post("/v1/completions", json={"model": "m", "prompt": [[104], [105]]})
    assert [c["text"] for c in r.json()["choices"]] == ["h", "i"]


async def test_completion_logprobs_shape(client: httpx.AsyncClient) -> None:
    body = {"model": "m", "prompt": "ab", "logprobs": 1}
    lp = (await client.post("/v1/completions", json=body)).json()["choices"][0]["logprobs"]
    assert lp["tokens"] == ["b", "a"]
    assert lp["token_logprobs"] == [-0.5, -0.5]
    assert lp["top_logprobs"][0] == {"b": -0.5, "A": -1.0}
    assert lp["text_offset"] == [0, 1]


async def test_chat_stream_framing(client: httpx.AsyncClient) -> None:
    body = {**CHAT, "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}
    r = await client.post("/v1/chat/completions", json=body)
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.text.endswith("data: [DONE]\n\n")
    events = parse_sse(r.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:-1])
    assert content == "cba"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {
        "prompt_tokens": 8,
        "completion_tokens": 3,
        "total_tokens": 11,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


async def test_completion_stream_without_usage(client: httpx.AsyncClient) -> None:
    body = {"model": "m", "prompt": ["ab", "cd"], "stream": True}
    events = parse_sse((await client.post("/v1/completions", json=body)).text)
    chunks = [json.loads(e) for e in events[:-1]]
    assert all("usage" not in c for c in chunks)
    by_index: dict[int, str] = {}
    for c in chunks:
        for choice in c["choices"]:
            by_index[choice["index"]] = by_index.get(choice["index"], "") + choice["text"]
    assert by_index == {0: "ba", 1: "dc"}


async def test_models_listing(client: httpx.AsyncClient) -> None:
    data = (await client.get("/v1/models")).json()
    assert data["object"] == "list"
    assert {m["id"] for m in data["data"]} == {"m", "smollm2-135m-instruct"}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({**CHAT, "temperature": -1}, "temperature"),
        ({**CHAT, "top_p": 0}, "top_p"),
        ({**CHAT, "n": 0}, "n"),
        ({**CHAT, "max_tokens": 0}, "max_tokens"),
        ({**CHAT, "logprobs": True, "top_logprobs": 50}, "top_logprobs"),
        ({**CHAT, "max_completion_tokens": 0}, "max_completion_tokens"),
        ({**CHAT, "max_tokens": 5, "max_completion_tokens": 0}, "max_completion_tokens"),
        ({**CHAT, "seed": 2**64}, "seed"),
        ({**CHAT, "priority": 1e20}, "priority"),
        ({**CHAT, "top_k": 2**40}, "top_k"),
        ({**CHAT, "n": 2, "best_of": 3}, "best_of"),
        ({**CHAT, "logit_bias": {"2**70": 5}}, "logit_bias"),
        ({**CHAT, "logit_bias": {"5": 1000}}, "logit_bias"),
        ({**CHAT, "logit_bias": {"5": 10}}, "logit_bias"),
        ({**CHAT, "n": 1000}, "n"),
        ({**CHAT, "n": 4, "max_tokens": 10**5}, "max_tokens"),
        ({**CHAT, "temperature": "hot"}, "temperature"),
        ({"model": "m", "messages": []}, "messages"),
        ({"messages": CHAT["messages"]}, "model"),
        ({**CHAT, "messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
    ],
)
async def test_bad_fields_are_400_naming_the_field(
    client: httpx.AsyncClient, body: dict[str, object], param: str
) -> None:
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert param.split(".")[0] in error["message"]


async def test_invalid_json_is_400(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/chat/completions", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400
    assert "error" in r.json()


async def test_prompt_too_long_is_400_naming_limits(client: httpx.AsyncClient) -> None:
    r = await client.post(
        "/v1/completions", json={"model": "m", "prompt": "x" * 60, "max_tokens": 10}
    )
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "max_model_len=64" in error["message"]


async def test_unknown_model_is_404(client: httpx.AsyncClient) -> None:
    r = await client.post("/v1/chat/completions", json={**CHAT, "model": "nope"})
    assert r.status_code == 404
    assert r.json()["error"]["param"] == "model"


async def test_overload_is_429_with_retry_after(client: httpx.AsyncClient, llm: FakeLLM) -> None:
    llm.overload = True
    r = await client.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 429
    assert r.headers["retry-after"] == "2"
    assert r.json()["error"]["type"] == "rate_limit_error"
    r = await client.post("/v1/chat/completions", json={**CHAT, "stream": True})
    assert r.status_code == 429  # before the first byte: a real status, not an event


async def test_unavailable_is_503_with_retry_after(llm: FakeLLM) -> None:
    app = build_app(FakeProvider({"m": llm}, unavailable={"m"}), ModelyardConfig())
    async with make_client(app) as c:
        r = await c.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 503
    assert r.headers["retry-after"] == "3"


async def test_error_after_first_byte_is_an_error_event(
    client: httpx.AsyncClient, llm: FakeLLM
) -> None:
    llm.fail_after = 2
    body = {**CHAT, "stream": True, "max_tokens": 5}
    r = await client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200
    events = parse_sse(r.text)
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["error"]["message"].endswith("engine exploded")


class FallbackRouter:
    def __init__(self) -> None:
        self.failed: list[str] = []

    def route(self, requested: str, principal: Principal) -> RouteDecision:
        return RouteDecision(requested=requested, targets=["busy", "gone", "m"], reason="fallback")

    def report_failure(self, model_id: str) -> None:
        self.failed.append(model_id)

    def resolve(self, name: str) -> str | None:
        return None

    def route_names(self) -> list[str]:
        return []


async def test_fallback_to_next_target_before_first_byte(llm: FakeLLM) -> None:
    busy = FakeLLM(name="busy", overload=True)
    provider = FakeProvider({"busy": busy, "gone": llm, "m": llm}, unavailable={"gone"})
    router = FallbackRouter()
    app = build_app(provider, ModelyardConfig(), router=router)
    async with make_client(app) as c:
        r = await c.post("/v1/chat/completions", json={**CHAT, "model": "alias"})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "m"
    assert r.headers["x-modelyard-route"] == "alias->m;fallback"  # the target that served
    assert len(busy.calls) == 1
    assert router.failed == ["busy", "gone"]  # the router hears which targets failed
    assert provider.active == 0  # every lease released


async def test_principal_priority_and_usage_and_permission(llm: FakeLLM) -> None:
    from modelyard.gateway.base import PRINCIPAL_SCOPE_KEY, USAGE_SCOPE_KEY, RequestUsage

    seen: list[RequestUsage] = []
    principal = Principal(tenant="t", priority=10, allowed_models=frozenset({"m"}))
    inner = build_app(FakeProvider({"m": llm, "x": llm}), ModelyardConfig())

    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        if scope["type"] == "http":
            scope[PRINCIPAL_SCOPE_KEY] = principal
            scope[USAGE_SCOPE_KEY] = usage = RequestUsage()
            seen.append(usage)
        await inner(scope, receive, send)

    async with make_client(app) as c:
        r = await c.post("/v1/chat/completions", json={**CHAT, "priority": 2, "max_tokens": 3})
        assert r.status_code == 200
        assert llm.calls[-1].priority == 12
        assert (seen[0].model, seen[0].prompt_tokens, seen[0].completion_tokens) == ("m", 8, 3)
        r = await c.post("/v1/chat/completions", json={**CHAT, "model": "x"})
        assert r.status_code == 403
