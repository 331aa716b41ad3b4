"""The manager over HTTP against a real `modelyard serve` process (tiny models, budget for the
pinned model plus two others)."""

from __future__ import annotations

import asyncio
import base64
import io
import random
import time
from typing import Any

import httpx
import numpy as np
import pytest
from manager_server import SCALES

pytestmark = pytest.mark.e2e


def tensor(values: list[float]) -> dict[str, Any]:
    return {"x": {"shape": [len(values)], "datatype": "FP32", "data": values}}


def loaded(url: str) -> set[str]:
    return set(httpx.get(f"{url}/models").json()["loaded_models"])


def reset(url: str) -> None:
    for name in loaded(url) - {"pinned"}:
        assert httpx.post(f"{url}/v2/repository/models/{name}/unload").status_code == 200


def png_bytes() -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (300, 260), (200, 30, 30)).save(buffer, format="PNG")
    return buffer.getvalue()


def predict(url: str, model: str, data: Any, **extra: Any) -> httpx.Response:
    return httpx.post(
        f"{url}/predict", json={"model_id": model, "input_data": data, **extra}, timeout=60
    )


def test_textbook_lru_scenario_and_pin(server_url: str) -> None:
    reset(server_url)
    for name in ("a", "b", "a", "c"):
        answer = predict(server_url, name, tensor([1.0]))
        assert answer.status_code == 200, answer.text
        assert answer.json()["predictions"][0]["y"]["data"] == [SCALES[name] + 1.0]
    assert loaded(server_url) == {"pinned", "a", "c"}  # b was the least recently used
    described = httpx.get(f"{server_url}/models").json()
    # the textbook's shape: objects keyed by model id
    assert set(described["available_models"]) >= {"a", "b", "c", "d", "pinned"}
    assert described["available_models"]["a"]["framework"] == "onnx"
    assert described["loaded_models"]["pinned"] == described["available_models"]["pinned"]["name"]
    pinned = next(m for m in described["models"] if m["id"] == "pinned")
    assert pinned["loads"] == 1  # loaded at start, never evicted (auth off: all details)


def test_predict_takes_the_textbooks_named_tensors(server_url: str) -> None:
    values = [1.0, -2.0, 0.5]
    textbook = {"x": {"shape": [3], "data": values, "dtype": "float32"}}
    answer = predict(server_url, "a", textbook)
    assert answer.status_code == 200, answer.text
    assert answer.json()["predictions"][0]["y"]["data"] == [SCALES["a"] * v + 1 for v in values]
    for bad, says in (
        ({"data_0": {"shape": [3], "data": values, "dtype": "float32"}}, "exactly ['x']"),
        ({"x": {"shape": [3, 1], "data": values, "dtype": "float32"}}, "shape [3, 1]"),
        ({"x": {"shape": [4], "data": values, "dtype": "float32"}}, "x: data does not match"),
        ({"x": {"shape": [3], "data": values, "dtype": "int64"}}, "takes FP32, got INT64"),
    ):
        refused = predict(server_url, "a", bad)
        assert refused.status_code == 400, refused.text
        assert says in refused.json()["error"]["message"]


def test_single_flight_twenty_concurrent_cold_requests(server_url: str) -> None:
    reset(server_url)
    before = httpx.get(f"{server_url}/models").json()["stats"]["loads"]

    async def burst() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            body = {"model_id": "d", "input_data": tensor([2.0])}
            return await asyncio.gather(
                *(client.post(f"{server_url}/predict", json=body) for _ in range(20))
            )

    answers = asyncio.run(burst())
    assert [a.status_code for a in answers] == [200] * 20
    assert httpx.get(f"{server_url}/models").json()["stats"]["loads"] - before == 1


def test_soak_500_random_requests_over_4_models_budget_for_2(server_url: str) -> None:
    rng = random.Random(7)
    plan = [(rng.choice(list(SCALES)), rng.uniform(-5, 5)) for _ in range(500)]

    async def run() -> list[tuple[str, float, httpx.Response]]:
        limit = asyncio.Semaphore(8)
        async with httpx.AsyncClient(timeout=120) as client:

            async def one(name: str, x: float) -> tuple[str, float, httpx.Response]:
                async with limit:
                    body = {"model_id": name, "input_data": tensor([x])}
                    return name, x, await client.post(f"{server_url}/predict", json=body)

            return await asyncio.gather(*(one(n, x) for n, x in plan))

    started = time.monotonic()
    results = asyncio.run(run())
    failures = [r.text for _, _, r in results if r.status_code != 200]
    assert failures == []
    for name, x, answer in results:
        (y,) = answer.json()["predictions"][0]["y"]["data"]
        assert y == pytest.approx(SCALES[name] * np.float32(x) + 1.0, rel=1e-5)
    assert len(loaded(server_url) - {"pinned"}) <= 2
    assert time.monotonic() - started < 120


def test_keep_alive_expiry(server_url: str) -> None:
    assert predict(server_url, "ka", "hello").status_code == 200
    assert "ka" in loaded(server_url)
    deadline = time.monotonic() + 5
    while "ka" in loaded(server_url) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "ka" not in loaded(server_url)


def test_openai_embeddings(server_url: str) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{server_url}/v1", api_key="unused", max_retries=0)
    result = client.embeddings.create(model="echo-embedding", input=["one two", "three"])
    assert [d.embedding for d in result.data] == [[7.0, 2.0], [5.0, 1.0]]
    assert result.model == "emb"
    # the backend's count (the echo fake's tokens are characters), not the route's word count
    assert result.usage.prompt_tokens == result.usage.total_tokens == 7 + 5
    raw = httpx.post(
        f"{server_url}/v1/embeddings",
        json={"model": "emb", "input": "abc", "encoding_format": "base64"},
    ).json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    assert decoded.tolist() == [3.0, 1.0]
    wrong = httpx.post(f"{server_url}/v1/embeddings", json={"model": "clf", "input": "x"})
    assert wrong.status_code == 400
    assert wrong.json()["error"]["type"] == "invalid_request_error"
    missing = httpx.post(f"{server_url}/v1/embeddings", json={"model": "nope", "input": "x"})
    assert missing.status_code == 404


def test_images_base64_multipart_and_refusals(server_url: str) -> None:
    image = png_bytes()
    by_json = predict(server_url, "img", base64.b64encode(image).decode(), options={"top_k": 3})
    assert by_json.status_code == 200, by_json.text
    ranked = by_json.json()["predictions"][0]
    assert len(ranked) == 3
    assert ranked[0]["score"] >= ranked[1]["score"] >= ranked[2]["score"]
    upload = httpx.post(
        f"{server_url}/predict",
        data={"model_id": "img", "options": '{"top_k": 3}'},
        files={"file": ("red.png", image, "image/png")},
        timeout=60,
    )
    assert upload.status_code == 200, upload.text
    assert upload.json()["predictions"][0] == ranked  # same image, same answer
    for bad in ("/etc/passwd", "file:///etc/passwd", "../secret.png", "not base64 !!"):
        assert predict(server_url, "img", bad).status_code == 400, bad
    corrupt = base64.b64encode(b"\x89PNG but not really").decode()
    answer = predict(server_url, "img", corrupt)
    assert answer.status_code == 400
    assert "image" in answer.json()["error"]["message"]
    assert predict(server_url, "a", "text for a tensor model").status_code == 400
    assert predict(server_url, "no-such-model", "x").status_code == 404
    assert (
        predict(server_url, "clf", "apples", options={"labels": ["apple", "kiwi"]}).json()[
            "predictions"
        ][0][0]["label"]
        == "apple"
    )


def test_kserve_v2_with_tritonclient(server_url: str) -> None:
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server_url.removeprefix("http://"))
    try:
        assert client.is_server_live()
        assert client.is_server_ready()
        client.load_model("b")
        assert client.is_model_ready("b")
        metadata = client.get_model_metadata("b")
        assert metadata["inputs"][0]["name"] == "x"
        assert metadata["outputs"][0]["datatype"] == "FP32"
        x = np.array([1.0, -2.0, 0.5], dtype=np.float32)
        infer_input = httpclient.InferInput("x", [3], "FP32")
        infer_input.set_data_from_numpy(x)  # binary tensor extension (the client's default)
        result = client.infer("b", [infer_input])
        assert np.allclose(result.as_numpy("y"), x * SCALES["b"] + 1)
        client.unload_model("b")
        assert not client.is_model_ready("b")
        index = {m["name"]: m["state"] for m in client.get_model_repository_index()}
        assert index["b"] == "UNAVAILABLE"
        assert index["pinned"] == "READY"
    finally:
        client.close()
    missing = httpx.post(f"{server_url}/v2/models/nope/infer", json={"inputs": []})
    assert missing.status_code == 404
    assert isinstance(missing.json()["error"], str)
    bad = httpx.post(
        f"{server_url}/v2/models/a/infer",
        json={"inputs": [{"name": "wrong", "shape": [1], "datatype": "FP32", "data": [1]}]},
    )
    assert bad.status_code == 400
    assert isinstance(bad.json()["error"], str)
    texts = httpx.post(
        f"{server_url}/v2/models/emb/infer",
        json={
            "inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["ab", "abc d"]}]
        },
    )
    assert texts.json()["outputs"][0] == {
        "name": "embedding",
        "shape": [2, 2],
        "datatype": "FP32",
        "data": [2.0, 1.0, 5.0, 2.0],
    }
