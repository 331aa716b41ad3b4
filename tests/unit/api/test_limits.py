"""The edge limits (api/limits.py): JSON bodies checked before any parser recurses into them,
the request-size limits, and the error fields they name. Over the in-process app and fakes."""

from __future__ import annotations

import dataclasses
import time

import httpx
import pytest
from api_helpers import make_client

from fakes.models import FakeProvider
from modelyard.api.app import build_app
from modelyard.api.limits import json_body_problem
from modelyard.config import ModelyardConfig, ServerConfig

pytestmark = pytest.mark.unit

JSON = {"content-type": "application/json"}
CHAT_PREFIX = b'{"model": "m", "messages": [{"role": "user", "content": "'


def deep(levels: int) -> bytes:
    return b"[" * levels + b"]" * levels


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", deep(100_000)),
        ("/v1/completions", b'{"model": "m", "prompt": ' + deep(100_000) + b"}"),
        ("/predict", b'{"model_id": "m", "input_data": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5000),
        ("/generate", deep(3000)),
        ("/v2/models/m/infer", deep(100_000)),
    ],
)
async def test_deep_nesting_is_400_before_anything_parses_it(
    client: httpx.AsyncClient, path: str, body: bytes
) -> None:
    r = await client.post(path, content=body, headers=JSON)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    message = error if path.startswith("/v2/") else error["message"]
    assert "server.max_json_depth" in message
    if not path.startswith("/v2/"):
        assert error["type"] == "invalid_request_error"


async def test_nesting_within_the_limit_reaches_the_route(client: httpx.AsyncClient) -> None:
    nested = b'x"}], "stop": ' + deep(60) + b"}"
    r = await client.post("/v1/chat/completions", content=CHAT_PREFIX + nested, headers=JSON)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "stop"  # pydantic's answer: the guard let it through


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        (rb"\ud800", False),  # a lone high surrogate
        (rb"\udc00", False),  # a lone low surrogate
        (rb"ab\ud83dx\ude00", False),  # a pair broken by a character
        (rb"\ud83d\ude00", True),  # a pair: one emoji
        (rb"\\ud800", True),  # an escaped backslash, then the text "ud800"
        (rb"\\\ud83d\ude00", True),  # a backslash, then an emoji
        (rb"\\\ud800", False),  # a backslash, then a lone surrogate
    ],
)
async def test_lone_surrogates_are_400(client: httpx.AsyncClient, text: bytes, ok: bool) -> None:
    body = CHAT_PREFIX + text + b'"}], "max_tokens": 3}'
    r = await client.post("/v1/chat/completions", content=body, headers=JSON)
    if ok:
        assert r.status_code == 200, r.text
    else:
        assert r.status_code == 400
        assert "surrogate" in r.json()["error"]["message"]


async def test_nan_and_infinity_are_400_but_not_inside_strings(client: httpx.AsyncClient) -> None:
    for literal in (b"NaN", b"Infinity", b"-Infinity"):
        body = b'{"model": "m", "prompt": "ab", "temperature": ' + literal + b"}"
        r = await client.post("/v1/completions", content=body, headers=JSON)
        assert r.status_code == 400
        assert "NaN or Infinity" in r.json()["error"]["message"]
    body = b'{"model": "m", "prompt": "NaN and Infinity", "max_tokens": 3}'
    assert (await client.post("/v1/completions", content=body, headers=JSON)).status_code == 200


async def test_a_body_that_is_not_utf8_is_400(client: httpx.AsyncClient) -> None:
    body = CHAT_PREFIX + b"\xed\xa0\x80" + b'"}]}'  # a surrogate encoded in UTF-8
    r = await client.post("/v1/chat/completions", content=body, headers=JSON)
    assert r.status_code == 400
    assert "UTF-8" in r.json()["error"]["message"]


async def test_element_count_and_completion_limits_follow_the_config(
    provider: FakeProvider,
) -> None:
    server = ServerConfig(max_json_elements=100, max_n=3, max_n_tokens=40)
    app = build_app(provider, ModelyardConfig(server=server))
    async with make_client(app) as client:
        many = {"model": "m", "prompt": "ab", "stop_token_ids": list(range(150))}
        r = await client.post("/v1/completions", json=many)
        assert r.status_code == 400
        assert "server.max_json_elements" in r.json()["error"]["message"]
        for body, param, code in (
            ({"model": "m", "prompt": ["a", "b"], "n": 2}, "n", "too_many_completions"),
            ({"model": "m", "prompt": "ab", "n": 3, "max_tokens": 14}, "max_tokens", None),
        ):
            r = await client.post("/v1/completions", json=body)
            assert r.status_code == 400, r.text
            assert r.json()["error"]["param"] == param
            assert code is None or r.json()["error"]["code"] == code
        ok = {"model": "m", "prompt": "ab", "n": 3, "max_tokens": 13}
        assert (await client.post("/v1/completions", json=ok)).status_code == 200


async def test_a_context_overflow_names_the_routes_prompt_field(client: httpx.AsyncClient) -> None:
    long = "x" * 60
    for path, body, param in (
        ("/v1/completions", {"model": "m", "prompt": long, "max_tokens": 10}, "prompt"),
        (
            "/v1/chat/completions",
            {"model": "m", "messages": [{"role": "user", "content": long}], "max_tokens": 10},
            "messages",
        ),
        ("/generate", {"model": "m", "prompts": [long]}, "prompts"),
    ):
        r = await client.post(path, json=body)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param
        assert r.json()["error"]["code"] == "context_length_exceeded"


def test_the_json_checks_take_linear_time_on_hostile_bodies() -> None:
    size = 4 * 1024 * 1024
    bodies = [
        b'"\\"' * (size // 3),  # one string that never ends, full of escaped quotes
        b'"' * size,  # empty strings, and one left open
        b"\\" * size + b"u",  # a run of backslashes
        b"\\ud800" * (size // 6),  # surrogates everywhere
        b"[" * size,  # depth
    ]
    for body in bodies:
        start = time.perf_counter()
        json_body_problem(body, 64, 1_000_000)
        assert time.perf_counter() - start < 5.0, body[:20]


def test_defaults_are_documented_limits() -> None:
    names = {f.name for f in dataclasses.fields(ServerConfig)}
    assert {"max_json_depth", "max_json_elements", "max_n", "max_n_tokens"} <= names
    with pytest.raises(ValueError, match="max_n"):
        ServerConfig(max_n=0)


async def test_generate_vllm_meets_the_same_limits(provider: FakeProvider) -> None:
    class EchoVLLM:
        async def generate(self, prompts: list[str], params: object) -> list[str]:
            return list(prompts)

    server = ServerConfig(max_n=4)
    app = build_app(provider, ModelyardConfig(server=server), vllm=EchoVLLM())
    async with make_client(app) as client:
        r = await client.post("/generate_vllm", json={"prompts": ["a"] * 5})
        assert r.status_code == 400
        assert r.json()["error"]["param"] == "n"
        r = await client.post("/generate_vllm", json={"prompts": ["a"] * 4})
        assert r.json() == {"generated_texts": ["a"] * 4}


async def test_any_model_name_is_a_404_with_a_valid_route_header(client: httpx.AsyncClient) -> None:
    for name in ("nopeд", "a\r\nx-injected: 1", "\U000fdc62"):
        r = await client.post("/v1/completions", json={"model": name, "prompt": "x"})
        assert r.status_code == 404, r.text
        assert r.headers["x-modelyard-route"].isascii()
        assert "x-injected" not in r.headers
