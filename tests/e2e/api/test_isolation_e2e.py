"""No request can hurt another, through HTTP against a real `modelyard serve` (gateway on):

- four long greedy streams of one tenant run while another tenant sends poison: a prompt outside
  the vocabulary (400 at the edge), or one that passes every check and fails in the runner (the
  engine's fault drill): only that request fails, and the four streams end with exactly the
  tokens of a run without the poison;
- dynamic batching: one undecodable image among 16 valid ones, and one text that makes its
  batch's backend call raise: only those requests fail, the others get their own outputs.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import re
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import numpy as np
import pytest
from hardening_server import BATCH_FAIL_TEXT, MAX_N_TOKENS, POISON_TOKEN, HardeningServer

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]  # server start

PROMPTS = [f"List the numbers from {10 * i} to {10 * i + 40}, one per line:" for i in range(4)]
GREEDY = {"model": "chat", "temperature": 0, "max_tokens": MAX_N_TOKENS, "ignore_eos": True}


async def stream_text(
    client: httpx.AsyncClient, prompt: str, headers: dict[str, str], started: asyncio.Event
) -> str:
    """One streamed completion's text; sets `started` at its first chunk."""
    body = {**GREEDY, "prompt": prompt, "stream": True}
    pieces: list[str] = []
    finish = None
    async with client.stream("POST", "/v1/completions", json=body, headers=headers) as r:
        assert r.status_code == 200, await r.aread()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            assert "error" not in event, event
            started.set()
            pieces.append(event["choices"][0]["text"])
            finish = event["choices"][0]["finish_reason"] or finish
    assert finish == "length"
    return "".join(pieces)


async def four_streams(
    server: HardeningServer, during: Callable[[httpx.AsyncClient], Awaitable[Any]] | None = None
) -> tuple[list[str], Any]:
    """Alice's four streams; `during(client)` runs (as bob) once all four have started."""
    async with httpx.AsyncClient(base_url=server.url, timeout=300) as client:
        started = [asyncio.Event() for _ in PROMPTS]
        streams = [
            asyncio.create_task(stream_text(client, p, server.headers("alice"), e))
            for p, e in zip(PROMPTS, started, strict=True)
        ]
        result = None
        if during is not None:
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 120)
            result = await during(client)
            assert not all(s.done() for s in streams), "the poison came after the streams"
        return list(await asyncio.gather(*streams)), result


@pytest.fixture(scope="module")
def baseline(hardening: HardeningServer) -> list[str]:
    """The four streams' texts without any poison."""
    texts, _ = asyncio.run(four_streams(hardening))
    assert all(texts)
    return texts


def failed_requests(server: HardeningServer) -> float:
    metrics = httpx.get(f"{server.url}/metrics", headers=server.headers("admin")).text
    pattern = r'^modelyard:engine_failed_requests_total\{model="smollm2-135m-instruct"\} (\S+)$'
    match = re.search(pattern, metrics, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


async def test_an_out_of_vocabulary_prompt_is_400_and_the_streams_keep_their_tokens(
    hardening: HardeningServer, baseline: list[str]
) -> None:
    async def poison(client: httpx.AsyncClient) -> list[httpx.Response]:
        bob = hardening.headers("bob")
        bodies = [
            {**GREEDY, "prompt": [49152]},  # one past SmolLM2's vocabulary
            {**GREEDY, "prompt": [1, -1, 2]},
            {**GREEDY, "prompt": "Hi", "stop_token_ids": [10**6]},
        ]
        return [await client.post("/v1/completions", json=b, headers=bob) for b in bodies]

    texts, responses = await four_streams(hardening, poison)
    assert [r.status_code for r in responses] == [400, 400, 400]
    params = [r.json()["error"]["param"] for r in responses]
    assert params == ["prompt", "prompt", "stop_token_ids"]
    assert all("vocabulary" in r.json()["error"]["message"] for r in responses)
    assert texts == baseline


async def test_a_request_that_fails_in_the_runner_fails_alone(
    hardening: HardeningServer, baseline: list[str]
) -> None:
    before = failed_requests(hardening)

    async def poison(client: httpx.AsyncClient) -> tuple[httpx.Response, list[str]]:
        body = {**GREEDY, "prompt": [504, 3458, POISON_TOKEN, 28, 216]}
        bob = hardening.headers("bob")
        plain = await client.post("/v1/completions", json=body, headers=bob)
        events = []
        async with client.stream(
            "POST", "/v1/completions", json={**body, "stream": True}, headers=bob
        ) as r:
            assert r.status_code == 200
            events = [line async for line in r.aiter_lines() if line.startswith("data: ")]
        return plain, events

    texts, (plain, events) = await four_streams(hardening, poison)
    assert plain.status_code == 500
    error = plain.json()["error"]
    assert "this request failed in the engine" in error["message"]
    assert (error["type"], error["code"]) == ("internal_server_error", "request_failed")
    assert events[-1] == "data: [DONE]"
    assert "this request failed in the engine" in json.loads(events[-2][6:])["error"]["message"]
    assert texts == baseline  # its batch-mates went on, token for token
    assert failed_requests(hardening) == before + 2


def png(seed: int) -> str:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (48, 64, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def batch_sizes(server: HardeningServer, model: str) -> tuple[float, float]:
    """(sum, count) of the model's inference_batch_size histogram: each request served adds
    the size of the backend call that served it."""
    metrics = httpx.get(f"{server.url}/metrics", headers=server.headers("admin")).text
    values = []
    for suffix in ("sum", "count"):
        pattern = rf'^modelyard:inference_batch_size_{suffix}\{{model="{model}"\}} (\S+)$'
        match = re.search(pattern, metrics, re.MULTILINE)
        values.append(float(match.group(1)) if match else 0.0)
    return values[0], values[1]


async def predict_all(
    server: HardeningServer, model: str, inputs: list[Any]
) -> list[httpx.Response]:
    """One /predict per input, all at once (so the batcher joins them)."""
    async with httpx.AsyncClient(base_url=server.url, timeout=300) as client:
        return list(
            await asyncio.gather(
                *(
                    client.post(
                        "/predict",
                        json={"model_id": model, "input_data": item},
                        headers=server.headers("alice"),
                    )
                    for item in inputs
                )
            )
        )


async def test_one_undecodable_image_among_16_fails_alone(hardening: HardeningServer) -> None:
    model = "efficientnet-lite0"
    images = [png(seed) for seed in range(16)]
    alone = [(await predict_all(hardening, model, [image]))[0] for image in images[:4]]
    assert all(r.status_code == 200 for r in alone), alone[0].text
    sum_before, count_before = batch_sizes(hardening, model)
    garbage = base64.b64encode(b"\x89PNG\r\n\x1a\n this is no image").decode()
    responses = await predict_all(hardening, model, [*images[:8], garbage, *images[8:]])
    bad = responses.pop(8)
    assert bad.status_code == 400
    assert bad.json()["error"]["param"] == "input_data"
    assert "not a readable image" in bad.json()["error"]["message"]
    assert [r.status_code for r in responses] == [200] * 16
    for solo, batched in zip(alone, responses, strict=False):
        [solo_top] = solo.json()["predictions"]
        [batched_top] = batched.json()["predictions"]
        assert [p["label"] for p in batched_top] == [p["label"] for p in solo_top]
        assert [p["score"] for p in batched_top] == pytest.approx(
            [p["score"] for p in solo_top], abs=1e-4
        )
    sum_after, count_after = batch_sizes(hardening, model)
    assert count_after - count_before == 16  # every valid image ran, the bad one never did
    assert sum_after - sum_before > 16  # in shared batches


async def test_a_text_that_breaks_its_batch_fails_alone(hardening: HardeningServer) -> None:
    model = "echo-embed"
    texts = [f"text number {i}" + " word" * i for i in range(16)]
    await predict_all(hardening, model, ["warm up"])  # load the model first
    sum_before, count_before = batch_sizes(hardening, model)
    responses = await predict_all(hardening, model, [*texts[:5], BATCH_FAIL_TEXT, *texts[5:]])
    bad = responses.pop(5)
    assert bad.status_code == 500
    assert "this request failed in the model" in bad.json()["error"]["message"]
    assert bad.json()["error"]["code"] == "request_failed"
    assert [r.status_code for r in responses] == [200] * 16
    for text, response in zip(texts, responses, strict=True):
        assert response.json()["predictions"] == [[float(len(text)), float(len(text.split()))]]
    sum_after, count_after = batch_sizes(hardening, model)
    assert count_after - count_before == 16
    assert sum_after - sum_before > 16  # they shared batches (with the poison, at first)
