"""GGUF blocks through HTTP: the session's server (`gguf_blocks: auto`, on with the kernels;
float32 products, as e2e_server starts every server unless asked) keeps the packaged GGUF file's
Q4_1 / Q8_0 blocks and answers greedy chat requests (plain and streamed) with the same text as a
server whose catalog says `gguf_blocks: off`, which serves the same model dequantized to float32.
A server with int8 activations (MODELYARD_GGUF_DOT=q8, the product default) answers plain and
streamed alike, and right."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from e2e_server import CATALOG, E2E_MODEL, ServerProcess, start_server, stop_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

QUESTIONS = ["What is the capital of France?", "Write a haiku about rain."]


@pytest.fixture(scope="module")
def gguf_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("gguf-e2e")
    running = start_server(tmp, catalog_yaml=CATALOG + "      gguf_blocks: off\n")
    try:
        yield running
    finally:
        stop_server(running)


@pytest.fixture(scope="module")
def q8_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("gguf-q8")
    running = start_server(tmp, env={"MODELYARD_GGUF_DOT": "q8"})
    try:
        yield running
    finally:
        stop_server(running)


def answer(server: ServerProcess, question: str, stream: bool) -> str:
    body = {
        "model": E2E_MODEL,
        "messages": [{"role": "user", "content": question}],
        "temperature": 0,
        "max_tokens": 24,
        "stream": stream,
    }
    url = f"{server.url}/v1/chat/completions"
    if not stream:
        response = httpx.post(url, json=body, timeout=120)
        assert response.status_code == 200, response.text
        return str(response.json()["choices"][0]["message"]["content"])
    text = ""
    with httpx.stream("POST", url, json=body, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                choices = httpx.Response(200, content=line[6:]).json()["choices"]
                text += (choices[0]["delta"].get("content") or "") if choices else ""
    return text


def test_gguf_blocks_answer_as_the_float32_model(
    server: ServerProcess, gguf_server: ServerProcess
) -> None:
    float_server, blocks_server = gguf_server, server  # the first: gguf_blocks off
    assert "(products: float32)" in blocks_server.log()
    assert "linear layers on the quantized blocks of" not in float_server.log()
    for question in QUESTIONS:
        want = answer(float_server, question, stream=False)
        assert want
        assert answer(blocks_server, question, stream=False) == want
        assert answer(blocks_server, question, stream=True) == want
    assert "Paris" in answer(blocks_server, QUESTIONS[0], stream=False)


def test_int8_activations_answer_alike_plain_and_streamed(q8_server: ServerProcess) -> None:
    assert "(products: int8 activations)" in q8_server.log()
    for question in QUESTIONS:
        plain = answer(q8_server, question, stream=False)
        assert plain
        assert answer(q8_server, question, stream=True) == plain
    assert "Paris" in answer(q8_server, QUESTIONS[0], stream=False)
