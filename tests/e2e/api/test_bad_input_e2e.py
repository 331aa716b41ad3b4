"""Every input that used to get a 500 gets its 4xx, in the route's own envelope and naming the
field, from a real `modelyard serve` with the gateway on; the connection stays open."""

from __future__ import annotations

import struct
from typing import Any

import httpx
import pytest
from hardening_server import HardeningServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]  # the server may start here

CHAT = {"model": "chat", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
COMPLETION = {"model": "chat", "prompt": "Hi", "max_tokens": 4}
JSON = {"content-type": "application/json"}
TEXT_TENSOR = {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["hello"]}


def binary_infer(payload: bytes) -> dict[str, Any]:
    header = (
        b'{"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", '
        b'"parameters": {"binary_data_size": %d}}]}' % len(payload)
    )
    return {
        "content": header + payload,
        "headers": {"inference-header-content-length": str(len(header)), **JSON},
    }


# (id, path, request keyword arguments, status, the OpenAI `param` or None for KServe)
CASES: list[tuple[str, str, dict[str, Any], int, str | None]] = [
    (
        "seed-beyond-64-bits",
        "/v1/completions",
        {"json": {**COMPLETION, "seed": 2**64}},
        400,
        "seed",
    ),
    (
        "priority-1e20",
        "/v1/chat/completions",
        {"json": {**CHAT, "priority": 1e20}},
        400,
        "priority",
    ),
    (
        "top-k-beyond-32-bits",
        "/v1/completions",
        {"json": {**COMPLETION, "top_k": 2**40}},
        400,
        "top_k",
    ),
    (
        "lone-surrogate",
        "/v1/completions",
        {"content": b'{"model": "chat", "prompt": "a\\ud800b", "max_tokens": 4}', "headers": JSON},
        400,
        None,
    ),
    (
        "max-completion-tokens-0",
        "/v1/chat/completions",
        {"json": {**CHAT, "max_completion_tokens": 0}},
        400,
        "max_completion_tokens",
    ),
    ("n-1000", "/v1/completions", {"json": {**COMPLETION, "n": 1000}}, 400, "n"),
    (
        "n-times-max-tokens",
        "/v1/completions",
        {"json": {**COMPLETION, "n": 4, "max_tokens": 30}},
        400,
        "max_tokens",
    ),
    (
        "context-overflow-names-prompt",
        "/v1/completions",
        {"json": {**COMPLETION, "prompt": "word " * 600, "max_tokens": 4}},
        400,
        "prompt",
    ),
    (
        "pinned-prefix-token-id-out-of-vocab",
        "/v1/prefixes",
        {"json": {"model": "chat", "token_ids": [1, 49152]}},
        400,
        "token_ids",
    ),
    (
        "image-not-base64-names-input-data",
        "/predict",
        {"json": {"model_id": "efficientnet-lite0", "input_data": 5}},
        400,
        "input_data",
    ),
    (
        "v2-parameters-not-an-object",
        "/v2/models/echo-embed/infer",
        {"json": {"inputs": [TEXT_TENSOR], "parameters": [1]}},
        400,
        None,
    ),
    (
        "v2-bytes-length-prefix-truncated",
        "/v2/models/echo-embed/infer",
        binary_infer(struct.pack("<I", 5) + b"ab"),
        400,
        None,
    ),
    ("v2-bytes-prefix-cut", "/v2/models/echo-embed/infer", binary_infer(b"\x05\x00"), 400, None),
]


@pytest.mark.parametrize(
    ("path", "kwargs", "status", "param"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_bad_input_is_a_4xx_in_the_routes_envelope(
    hardening: HardeningServer, path: str, kwargs: dict[str, Any], status: int, param: str | None
) -> None:
    headers = {**hardening.headers("alice"), **kwargs.pop("headers", {})}
    with httpx.Client(base_url=hardening.url, timeout=120) as client:
        r = client.post(path, headers=headers, **kwargs)
        assert r.status_code == status, r.text
        assert r.headers.get("connection") != "close"
        error = r.json()["error"]
        if path.startswith("/v2/"):
            assert isinstance(error, str)
        else:
            assert error["type"] == "invalid_request_error"
            assert error["param"] == param
        assert client.get("/health").status_code == 200  # the same connection still serves


def test_deep_nesting_is_400_before_anything_parses_it(hardening: HardeningServer) -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    for path in ("/v1/chat/completions", "/predict", "/v2/models/echo-embed/infer"):
        r = httpx.post(hardening.url + path, content=deep, headers=JSON)
        assert r.status_code == 401  # no key: the gateway answers first, nothing is parsed
        headers = {**JSON, **hardening.headers("alice")}
        r = httpx.post(hardening.url + path, content=deep, headers=headers)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        message = error if path.startswith("/v2/") else error["message"]
        assert "server.max_json_depth" in message
