"""Every model route through the one request path, in process (fake models, real routes and
gateway): allow-lists, routing and its header, quotas, typed leases, scopes, listings."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from api_helpers import make_client, path_app

from fakes.models import CatalogProvider, FakePredictor, MemoryKeys
from modelyard.model_spec import ModelKind, ModelSpec

pytestmark = pytest.mark.unit

SPECS = [
    ModelSpec(id="chat-m", aliases=("chat-alias",), kind=ModelKind.CHAT, backend="llm"),
    ModelSpec(id="emb-a", aliases=("minilm",), kind=ModelKind.EMBEDDING),
    ModelSpec(id="emb-b", kind=ModelKind.EMBEDDING),
    ModelSpec(id="emb-broken", kind=ModelKind.EMBEDDING),
    ModelSpec(id="cls", kind=ModelKind.ZERO_SHOT_CLASSIFICATION),
    ModelSpec(id="tensor", kind=ModelKind.TENSOR, backend="onnx"),
]
GATEWAY = {
    "tenants": {"acme": {"models": ["chat-m", "emb-a", "cls", "tensor"]}, "ops": {}},
    "routes": {
        "seed": 3,
        "models": {
            "embed": {
                "target": "emb-a",
                "aliases": ["text-embedder"],
                "fallbacks": ["emb-b"],
                "tenants": {"beta": "emb-b"},
            },
            "embed-safe": {"target": "emb-broken", "fallbacks": ["emb-b"]},
        },
    },
}


@dataclass
class Env:
    client: httpx.AsyncClient
    provider: CatalogProvider
    keys: MemoryKeys


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    provider = CatalogProvider(SPECS)
    keys = MemoryKeys()
    async with make_client(path_app(provider, keys, GATEWAY)) as client:
        yield Env(client, provider, keys)


def route_calls(model: str) -> list[tuple[str, dict[str, Any]]]:
    """(path, JSON body) of every model route asking for `model`."""
    text = {"max_tokens": 2}
    return [
        ("/v1/chat/completions", {"model": model, "messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/completions", {"model": model, "prompt": "hi", **text}),
        ("/basic_generate", {"model": model, "prompt": "hi", **text}),
        ("/generate", {"model": model, "prompts": ["hi", "yo"], **text}),
        ("/generate_stream", {"model": model, "prompt": "hi", **text}),
    ]


def predictor_calls(model: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("/v1/embeddings", {"model": model, "input": ["a", "bc"]}),
        ("/predict", {"model_id": model, "input_data": ["a", "bc"]}),
        (
            f"/v2/models/{model}/infer",
            {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["a", "bc"]}]},
        ),
    ]


def _error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    if response.request.url.path.startswith("/v2/"):
        assert isinstance(error, str)  # KServe envelope
        return error
    assert set(error) == {"message", "type", "param", "code"}
    return str(error["code"])


async def test_every_model_route_authorizes_and_names_what_served(env: Env) -> None:
    acme = env.keys.bearer("acme")
    unknown = {"authorization": "Bearer my-" + "x" * 43}
    allowed = [(c, "chat-m") for c in route_calls("chat-m")]
    allowed += [(c, "emb-a") for c in predictor_calls("emb-a")]
    for (path, body), model in allowed:
        assert _error(await env.client.post(path, json=body), 401), path
        assert _error(await env.client.post(path, json=body, headers=unknown), 401), path
        ok = await env.client.post(path, json=body, headers=acme)
        assert ok.status_code == 200, (path, ok.text)
        assert ok.headers["x-modelyard-route"] == f"{model}->{model};direct", path
    for path, body in route_calls("other-llm") + predictor_calls("emb-b"):
        refused = await env.client.post(path, json=body, headers=acme)
        assert "model_not_allowed" in _error(refused, 403) or "not allowed" in refused.text
    assert "emb-b" not in env.provider.leased  # refused before any lease
    # a decoy `model` in a v2 body does not matter: the URL names the model
    decoy = {"model": "emb-a", **predictor_calls("emb-b")[2][1]}
    refused = await env.client.post("/v2/models/emb-b/infer", json=decoy, headers=acme)
    assert "emb-b" in _error(refused, 403)


async def test_allow_lists_accept_what_a_name_resolves_to(env: Env) -> None:
    acme = env.keys.bearer("acme")  # chat-m, emb-a by id
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    by_alias = await env.client.post(
        "/v1/chat/completions", json={"model": "chat-alias", **chat}, headers=acme
    )
    assert by_alias.status_code == 200
    assert by_alias.headers["x-modelyard-route"] == "chat-alias->chat-m;direct"
    emb = {"input": "abc"}
    assert (
        await env.client.post("/v1/embeddings", json={"model": "minilm", **emb}, headers=acme)
    ).status_code == 200
    # a key allowed the route `embed` may use its alias; the catalog ids behind it it may not
    routed = env.keys.bearer("acme", models=("embed",))
    via_alias = await env.client.post(
        "/v1/embeddings", json={"model": "text-embedder", **emb}, headers=routed
    )
    assert via_alias.status_code == 200
    assert via_alias.headers["x-modelyard-route"] == "text-embedder->emb-a;alias"
    direct = await env.client.post("/v1/embeddings", json={"model": "emb-a", **emb}, headers=routed)
    assert _error(direct, 403) == "model_not_allowed"


async def test_routing_on_predictor_routes_fallback_override_and_usage(env: Env) -> None:
    ops, beta = env.keys.bearer("ops"), env.keys.bearer("beta")
    env.provider.failing.add("emb-broken")
    body = {"model": "embed-safe", "input": ["a", "bb", "ccc"]}
    fell_back = await env.client.post("/v1/embeddings", json=body, headers=ops)
    assert fell_back.status_code == 200, fell_back.text
    assert fell_back.json()["model"] == "emb-b"
    assert fell_back.headers["x-modelyard-route"] == "embed-safe->emb-b;fallback"
    override = await env.client.post(
        "/predict", json={"model_id": "embed", "input_data": "x"}, headers=beta
    )
    assert override.headers["x-modelyard-route"] == "embed->emb-b;tenant-override"
    admin = env.keys.bearer("root", admin=True)
    usage = (await env.client.get("/admin/usage", headers=admin)).json()["tenants"]
    assert usage["ops"]["models"]["emb-b"]["policies"] == {"fallback": 1}
    assert usage["ops"]["models"]["emb-b"]["items"] == 3
    assert usage["beta"]["models"]["emb-b"]["policies"] == {"tenant-override": 1}
    metrics = (await env.client.get("/metrics", headers=admin)).text
    line = 'modelyard:tenant_model_requests_total{model="emb-b",policy="fallback",tenant="ops"}'
    assert line in metrics


async def test_a_model_of_the_wrong_kind_is_400_and_never_leased(env: Env) -> None:
    ops = env.keys.bearer("ops")
    chat = {"model": "emb-a", "messages": [{"role": "user", "content": "hi"}]}
    refused = await env.client.post("/v1/chat/completions", json=chat, headers=ops)
    assert _error(refused, 400) == "wrong_model_kind"
    assert refused.json()["error"]["param"] == "model"
    llm_on_v2 = await env.client.post(
        "/v2/models/chat-m/infer", json=predictor_calls("x")[2][1], headers=ops
    )
    assert "text-generation" not in _error(llm_on_v2, 400)
    not_embedding = await env.client.post(
        "/v1/embeddings", json={"model": "cls", "input": "x"}, headers=ops
    )
    assert "serves embedding models" in not_embedding.json()["error"]["message"]
    assert env.provider.leased == []


async def test_items_per_minute_on_embeddings(env: Env) -> None:
    limited = env.keys.bearer("ops", ipm=10)
    body = {"model": "emb-a", "input": ["a", "b", "c", "d"]}
    first, second, third = [
        await env.client.post("/v1/embeddings", json=body, headers=limited) for _ in range(3)
    ]
    assert [first.status_code, second.status_code] == [200, 200]
    assert first.headers["x-ratelimit-remaining"] == "6"
    assert _error(third, 429) == "rate_limit_exceeded"
    assert third.headers["x-ratelimit-limit"] == "10"
    assert third.headers["retry-after"] == "12"  # 2 of 4 missing at 10 per minute
    assert "x-modelyard-route" in third.headers  # routed before it was refused
    # a chat request of the same key charges no items: not refused by ipm
    chat = {"model": "chat-m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    assert (
        await env.client.post("/v1/chat/completions", json=chat, headers=limited)
    ).status_code == 200


async def test_concurrency_slots_come_back_after_errors_and_streams(env: Env) -> None:
    one = env.keys.bearer("ops", max_concurrent=1)
    wrong = {"model": "cls", "input": "x"}
    for _ in range(3):  # refused after admission: the slot must come back each time
        assert (await env.client.post("/v1/embeddings", json=wrong, headers=one)).status_code == 400
    stream = {"model": "chat-m", "prompt": "hello", "max_tokens": 3, "stream": True}
    for _ in range(2):
        answer = await env.client.post("/v1/completions", json=stream, headers=one)
        assert answer.status_code == 200
        assert answer.headers["x-modelyard-route"] == "chat-m->chat-m;direct"
    assert env.provider.active == 0


async def test_model_control_needs_the_admin_scope(env: Env) -> None:
    tenant, admin = env.keys.bearer("acme"), env.keys.bearer("ops", admin=True)
    env.provider.loaded.add("emb-a")
    for action in ("unload", "load"):
        refused = await env.client.post(f"/v2/repository/models/emb-a/{action}", headers=tenant)
        assert "admin" in _error(refused, 403)
    assert env.provider.control == []
    assert "emb-a" in env.provider.loaded  # still loaded
    done = await env.client.post("/v2/repository/models/emb-a/unload", headers=admin)
    assert done.status_code == 200
    assert env.provider.control == [("unload", "emb-a")]
    for path in ("/admin/usage", "/metrics"):
        assert _error(await env.client.get(path, headers=tenant), 403) == "admin_required"
        assert (await env.client.get(path, headers=admin)).status_code == 200
    stats = await env.client.get("/debug/engine_stats", params={"model": "chat-m"}, headers=tenant)
    assert stats.status_code == 403


async def test_listings_show_a_tenant_only_its_models(env: Env) -> None:
    acme, admin = env.keys.bearer("acme"), env.keys.bearer("ops", admin=True)
    env.provider.loaded.update({"emb-a", "emb-b"})
    env.provider.failing.add("emb-b")
    mine = (await env.client.get("/models", headers=acme)).json()
    assert set(mine["available_models"]) == {"chat-m", "emb-a", "cls", "tensor"}
    assert mine["available_models"]["emb-a"]["type"] == "embedding"
    assert mine["loaded_models"] == {"emb-a": "emb-a"}
    text = json.dumps(mine)
    for hidden in ("pid", "memory", "budget", "4242", "/secret"):
        assert hidden not in text
    everything = (await env.client.get("/models", headers=admin)).json()
    assert set(everything["available_models"]) == {s.id for s in SPECS}
    assert everything["memory"]["budget_bytes"] == 10_000
    assert next(m for m in everything["models"] if m["id"] == "emb-a")["pid"] == 4242
    listed = (await env.client.get("/v1/models", headers=acme)).json()["data"]
    assert [m["id"] for m in listed] == ["chat-m", "emb-a", "cls", "tensor"]
    routed = env.keys.bearer("acme", models=("embed",))
    assert [
        m["id"] for m in (await env.client.get("/v1/models", headers=routed)).json()["data"]
    ] == ["embed"]
    index = (await env.client.post("/v2/repository/index", headers=acme)).json()
    assert {m["name"] for m in index} == {"chat-m", "emb-a", "cls", "tensor"}
    assert all("reason" not in m for m in index)
    full = (await env.client.post("/v2/repository/index", headers=admin)).json()
    assert next(m for m in full if m["name"] == "emb-b")["reason"].startswith("/secret")
    for path in ("/v2/models/emb-b", "/v2/models/emb-b/ready"):
        assert (await env.client.get(path, headers=acme)).status_code == 403


async def test_routes_without_a_model_pay_at_the_door(env: Env) -> None:
    two = env.keys.bearer("ops", rpm=2)
    codes = [(await env.client.get("/v1/models", headers=two)).status_code for _ in range(3)]
    assert codes == [200, 200, 429]


async def test_predict_checks_named_tensors_against_the_metadata(env: Env) -> None:
    acme = env.keys.bearer("acme")
    textbook = {"x": {"shape": [2], "data": [1.5, 2.5], "dtype": "float32"}}
    ok = await env.client.post(
        "/predict", json={"model_id": "tensor", "input_data": textbook}, headers=acme
    )
    assert ok.status_code == 200, ok.text
    predictor = env.provider.models["tensor"]
    assert isinstance(predictor, FakePredictor)
    assert predictor.calls[-1] == [{"x": {"shape": [1, 2], "datatype": "FP32", "data": [1.5, 2.5]}}]
    wrong = {"data_0": {"shape": [2], "data": [1.0, 2.0], "dtype": "float32"}}
    refused = await env.client.post(
        "/predict", json={"model_id": "tensor", "input_data": wrong}, headers=acme
    )
    assert refused.status_code == 400
    assert "inputs must be exactly ['x']" in refused.json()["error"]["message"]
