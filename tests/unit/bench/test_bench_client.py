from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from modelyard.bench.client import EndpointConfig, RequestResult, send
from modelyard.bench.workloads import RequestSpec

pytestmark = pytest.mark.unit

SPEC = RequestSpec(prompt="hello world", prompt_tokens=2, max_tokens=8)


def sse(chunks: list[tuple[float, dict[str, object] | str]]) -> AsyncIterator[bytes]:
    async def gen() -> AsyncIterator[bytes]:
        for delay, chunk in chunks:
            await asyncio.sleep(delay)
            data = chunk if isinstance(chunk, str) else json.dumps(chunk)
            yield f"data: {data}\n\n".encode()

    return gen()


def delta(text: str, usage: int | None = None) -> dict[str, object]:
    c: dict[str, object] = {"choices": [{"index": 0, "delta": {"content": text}}]}
    if usage is not None:
        c["usage"] = {"prompt_tokens": 5, "completion_tokens": usage}
    return c


async def run(handler: httpx.MockTransport, **cfg: Any) -> RequestResult:
    endpoint = EndpointConfig(**{"base_url": "http://fake", "model": "m", **cfg})
    async with httpx.AsyncClient(transport=handler) as client:
        return await send(client, endpoint, SPEC, time.perf_counter())


async def test_ttft_itl_and_chunks_carrying_several_tokens_are_spread() -> None:
    script = [
        (0.05, delta("a", 1)),
        (0.04, delta("bcd", 4)),  # 3 tokens in one chunk after 40 ms: 3 gaps of ~13 ms
        (0.02, delta("e", 5)),
        (0.0, {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 5}}),
        (0.0, "[DONE]"),
    ]
    seen: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, content=sse(script))

    r = await run(httpx.MockTransport(handler), continuous_usage=True)
    assert seen[0]["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert seen[0]["messages"] == [{"role": "user", "content": "hello world"}]
    assert r.ok
    assert r.error is None
    assert r.ttft == pytest.approx(0.05, abs=0.03)
    itl = r.itl
    assert len(itl) == 4
    assert itl[0] == itl[1] == itl[2] == pytest.approx(0.04 / 3, abs=0.01)
    assert itl[3] == pytest.approx(0.02, abs=0.015)
    assert r.output_tokens == 5
    assert r.usage_reported
    assert r.prompt_tokens == 5


async def test_without_usage_tokens_are_counted_by_chunks() -> None:
    script = [(0.0, delta("a")), (0.0, delta("")), (0.0, delta("b")), (0.0, "[DONE]")]
    transport = httpx.MockTransport(lambda req: httpx.Response(200, content=sse(script)))
    r = await run(transport, endpoint="completions", include_usage=False)
    assert r.ok
    assert r.output_tokens == 2
    assert not r.usage_reported
    assert len(r.itl) == 1


@pytest.mark.parametrize(
    ("handler", "kind"),
    [
        (lambda req: httpx.Response(500, text="boom"), "http_500"),
        (lambda req: httpx.Response(429, json={"error": "slow down"}), "http_429"),
        (lambda req: (_ for _ in ()).throw(httpx.ReadTimeout("t", request=req)), "timeout"),
        (
            lambda req: (_ for _ in ()).throw(httpx.ConnectError("refused", request=req)),
            "connection",
        ),
        (lambda req: httpx.Response(200, content=b"data: {not json\n\n"), "malformed_stream"),
        (lambda req: httpx.Response(200, content=b'data: {"choices": []}\n\n'), "malformed_stream"),
    ],
)
async def test_server_failures_become_error_kinds(handler: object, kind: str) -> None:
    r = await run(httpx.MockTransport(handler))  # type: ignore[arg-type]
    assert not r.ok
    assert r.error == kind


async def test_predict_and_kserve_bodies_and_urls() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"predictions": [1]})

    r1 = await run(httpx.MockTransport(handler), endpoint="predict", base_url="http://fake/v1")
    r2 = await run(httpx.MockTransport(handler), endpoint="kserve")
    assert r1.ok
    assert r2.ok
    assert str(seen[0].url) == "http://fake/predict"
    assert json.loads(seen[0].content) == {"model_id": "m", "input_data": "hello world"}
    assert str(seen[1].url) == "http://fake/v2/models/m/infer"
    assert json.loads(seen[1].content)["inputs"][0]["data"] == ["hello world"]
