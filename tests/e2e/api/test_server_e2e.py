"""End-to-end: a real `modelyard serve` process with SmolLM2-135M-Instruct, over real sockets."""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from e2e_server import E2E_MODEL, ServerProcess, start_server, stop_server

pytestmark = pytest.mark.e2e

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
PROMPTS = [f"Write one sentence about the number {i}." for i in range(8)]


def _client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


async def _engine_stats(client: httpx.AsyncClient) -> dict[str, Any]:
    r = await client.get("/debug/engine_stats", params={"model": E2E_MODEL})
    stats: dict[str, Any] = r.json()["stats"]
    return stats


def test_openai_client_chat_and_completions(server: ServerProcess) -> None:
    client = _client(server)
    chat = client.chat.completions.create(
        model=E2E_MODEL,
        messages=QUESTION,
        max_tokens=12,
        temperature=0,  # type: ignore[arg-type]
    )
    assert "Paris" in (chat.choices[0].message.content or "")  # MODELS.md reference answer
    assert chat.usage is not None
    assert chat.usage.completion_tokens >= 1
    completion = client.completions.create(
        model="smollm2", prompt=["Once upon a time", "The sky is"], max_tokens=4, n=2
    )
    assert [c.index for c in completion.choices] == [0, 1, 2, 3]
    assert completion.usage is not None
    assert 4 <= completion.usage.completion_tokens <= 16
    assert [m.id for m in client.models.list().data] == [E2E_MODEL]


def test_openai_client_stream_arrives_before_the_end(server: ServerProcess) -> None:
    stream = _client(server).chat.completions.create(
        model=E2E_MODEL,
        messages=QUESTION,
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    arrivals: list[float] = []
    text = []
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                arrivals.append(time.monotonic())
                text.append(choice.delta.content)
    assert usage is not None
    assert usage.completion_tokens == 24
    # after EOS (ignored) a token may be a special one whose text is empty: no content chunk
    assert len(arrivals) >= 12
    # tokens are flushed as made: they arrive spread over the generation, not in one burst
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    assert sum(gap > 0.001 for gap in gaps) >= 10
    assert "".join(text)


async def test_textbook_endpoints(server: ServerProcess) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
        assert (await c.get("/health")).json() == {"status": "ok"}
        greedy = {"temperature": 0, "max_tokens": 12}
        one = await c.post("/basic_generate", json={"prompt": PROMPTS[0], **greedy})
        assert one.status_code == 200
        many = await c.post("/generate", json={"prompts": PROMPTS[:3], **greedy})
        texts = many.json()["generated_texts"]
        assert len(texts) == 3
        assert texts[0] == one.json()["generated_text"]  # order kept, greedy is reproducible
        events = []
        async with c.stream("POST", "/generate_stream", json={"prompt": PROMPTS[1], **greedy}) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
        final = events[-1]
        assert final["done"] is True
        assert "".join(e["token"] for e in events[:-1]) == final["generated_text"] == texts[1]
        r = await c.post("/generate_vllm", json={"prompts": ["hi"]})
        assert r.status_code == 503
        assert "vllm" in r.json()["error"]["message"]
        r = await c.post("/v1/chat/completions", json={"model": "nope", "messages": QUESTION})
        assert r.status_code == 404
        r = await c.post("/v1/completions", json={"model": E2E_MODEL, "prompt": "x" * 9000})
        assert r.status_code == 400


async def test_disconnect_aborts_the_request_and_frees_the_engine(server: ServerProcess) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as c:
        baseline = await _engine_stats(c)
        body = {
            "model": E2E_MODEL,
            "prompt": "Count from one to a thousand: one, two,",
            "max_tokens": 1000,  # with the prompt, all of the 1024-token context
            "ignore_eos": True,  # so it cannot end early: ~1000 decode steps, far past 5 s here
            "stream": True,
        }
        async with c.stream("POST", "/v1/completions", json=body) as r:
            seen = 0
            async for line in r.aiter_lines():
                seen += line.startswith("data: ")
                if seen >= 3:
                    break
            live = await _engine_stats(c)
        disconnected = time.monotonic()
        stats = live
        while time.monotonic() - disconnected < 5.0:
            stats = await _engine_stats(c)
            if stats["num_aborted"] > baseline["num_aborted"] and stats["num_running"] == 0:
                break
            await asyncio.sleep(0.05)
        assert live["num_running"] == 1  # it was running when the client left
        assert stats["num_aborted"] == baseline["num_aborted"] + 1  # aborted, not finished
        assert stats["num_running"] == stats["num_waiting"] == 0
        assert stats["num_free_blocks"] == baseline["num_free_blocks"]


async def test_sixteen_mixed_clients_without_cross_talk(server: ServerProcess) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=300) as c:
        options = {"temperature": 0, "max_tokens": 8}
        reference = (await c.post("/generate", json={"prompts": PROMPTS, **options})).json()

        async def batch(i: int) -> list[str]:
            prompts = [PROMPTS[i], PROMPTS[(i + 1) % 8]]
            r = await c.post("/generate", json={"prompts": prompts, **options})
            texts: list[str] = r.json()["generated_texts"]
            return texts

        async def stream(i: int) -> tuple[str, str, str]:
            tokens, final = [], {}
            body = {"prompt": PROMPTS[i], **options}
            async with c.stream("POST", "/generate_stream", json=body) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        event = json.loads(line[6:])
                        if "token" in event:
                            tokens.append(event["token"])
                        else:
                            final = event
            return "".join(tokens), final["generated_text"], final["sequence_id"]

        results = await asyncio.gather(
            *(batch(i) for i in range(8)), *(stream(i) for i in range(8))
        )
    expected = reference["generated_texts"]
    for i, texts in enumerate(results[:8]):
        assert texts == [expected[i], expected[(i + 1) % 8]]
    streams = results[8:]
    for i, (joined, final_text, _) in enumerate(streams):  # type: ignore[misc]
        assert joined == final_text == expected[i]
    assert len({sequence_id for _, _, sequence_id in streams}) == 8  # type: ignore[misc]


async def test_overload_burst_gets_429_and_accepted_requests_complete(
    server: ServerProcess,
) -> None:
    body = {"model": E2E_MODEL, "prompt": "Hello there", "max_tokens": 1}
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(base_url=server.url, timeout=300, limits=limits) as c:
        responses = await asyncio.gather(
            *(c.post("/v1/completions", json=body) for _ in range(160))  # queue bound: 32
        )
    statuses = [r.status_code for r in responses]
    rejected = [r for r in responses if r.status_code == 429]
    assert rejected, "the burst never hit the bounded waiting queue"
    assert all(r.headers.get("retry-after") for r in rejected)
    assert all(r.json()["error"]["type"] == "rate_limit_error" for r in rejected)
    assert set(statuses) <= {200, 429}
    accepted = [r for r in responses if r.status_code == 200]
    assert accepted
    assert all(r.json()["choices"][0]["finish_reason"] in ("length", "stop") for r in accepted)


def test_sigterm_drains_in_flight_requests(tmp_path: Path) -> None:
    drained = start_server(tmp_path, config="server: {drain_timeout_s: 60}\n")
    try:
        body = {
            "model": E2E_MODEL,
            "prompt": "Tell me a story.",
            "max_tokens": 32,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        events = []
        with httpx.stream("POST", drained.url + "/v1/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(line[6:])
                if len(events) == 2:
                    drained.process.send_signal(signal.SIGTERM)
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert chunks[-2]["choices"][0]["finish_reason"] == "length"
        assert chunks[-1]["usage"]["completion_tokens"] == 32  # finished after SIGTERM
        assert drained.process.wait(60) == 0
        with pytest.raises(httpx.ConnectError):
            httpx.get(drained.url + "/health", timeout=2)
    finally:
        stop_server(drained)
