"""The Ray provider behind the same ASGI app and routes as local mode, over a fake LLM deployment
(ray_fakes.py): LoRA adapters run on the replicas and unload from all of them; pinned prefixes
are made, listed, used and released on the replica the prefix router sends the prefix to."""

from __future__ import annotations

import pickle
from collections.abc import AsyncIterator

import httpx
import pytest

pytest.importorskip("ray.serve", reason="the `ray` extra is not installed")

from ray_fakes import BLOCK, FakeDeployment

from modelyard.api.app import build_app
from modelyard.config import ModelyardConfig
from modelyard.engine import constraints
from modelyard.manager.catalog import Catalog
from modelyard.model_spec import ModelKind, ModelSpec
from modelyard.scale.provider import RayProvider

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

SPEC = ModelSpec(
    id="m",
    kind=ModelKind.COMPLETION,
    backend="llm",
    source="m.gguf",
    options={"lora_modules": {"finance": "/adapters/finance"}, "max_loras": 2},
)


@pytest.fixture
def deployment() -> FakeDeployment:
    return FakeDeployment("r1", "r2")


@pytest.fixture
async def client(deployment: FakeDeployment) -> AsyncIterator[httpx.AsyncClient]:
    provider = RayProvider(Catalog([SPEC]), {"m": deployment}, None)
    await provider.start()
    app = build_app(provider, ModelyardConfig())
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
        yield c


async def complete(client: httpx.AsyncClient, model: str, prompt: str) -> httpx.Response:
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
    return await client.post("/v1/completions", json=body)


async def test_an_adapter_runs_on_the_replicas_and_unloads_from_every_one(
    client: httpx.AsyncClient, deployment: FakeDeployment
) -> None:
    answer = await complete(client, "finance", "a question")
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["text"] == "[finance]"
    replica = deployment.replicas[deployment.routed[-1]]
    lora = replica.calls[-1].lora
    assert lora is not None
    assert (lora.name, lora.path) == ("finance", "/adapters/finance")
    assert (await complete(client, "m", "a question")).json()["choices"][0]["text"] == "[base]"
    for question in ("another", "a third question, longer than a block"):
        assert (await complete(client, "finance", question)).status_code == 200
        assert deployment.routed[-1] == replica.name  # where the adapter is loaded
    unload = await client.post("/v1/unload_lora_adapter", json={"lora_name": "finance"})
    assert unload.status_code == 200, unload.text
    assert [r.dropped for r in deployment.replicas.values()] == [[["finance"]], [["finance"]]]
    assert (await complete(client, "finance", "gone?")).status_code == 404


async def test_a_pin_lives_on_the_replica_its_prefix_is_routed_to(
    client: httpx.AsyncClient, deployment: FakeDeployment
) -> None:
    knowledge = "K" * (3 * BLOCK + 2)
    pinned = await client.post("/v1/prefixes", json={"model": "m", "text": knowledge})
    assert pinned.status_code == 200, pinned.text
    body = pinned.json()
    assert (body["num_tokens"], body["num_pinned_tokens"]) == (14, 12)
    owner = deployment.replicas[deployment.routed[-1]]
    assert list(owner.pinned) == [body["id"]]
    listing = (await client.get("/v1/prefixes")).json()
    assert [p["id"] for p in listing["data"]] == [body["id"]]
    assert listing["models"]["m"]["pinned_blocks"] == 3
    for question in ("one?", "two?", "three?"):
        answer = await complete(client, "m", knowledge + question)
        assert answer.status_code == 200, answer.text
        assert deployment.routed[-1] == owner.name
        assert answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 12
    deleted = await client.delete(f"/v1/prefixes/{body['id']}")
    assert deleted.status_code == 200, deleted.text
    assert [r.unpinned for r in deployment.replicas.values() if r is not owner] == [[]]
    assert owner.unpinned == [body["id"]]  # the broadcast reached the pin's replica
    assert (await client.get("/v1/prefixes")).json()["data"] == []


async def test_a_cache_salt_reaches_the_replica_with_the_pin_and_the_request(
    client: httpx.AsyncClient, deployment: FakeDeployment
) -> None:
    knowledge = "S" * (2 * BLOCK)
    body = {"model": "m", "text": knowledge, "cache_salt": "team-a"}
    pinned = await client.post("/v1/prefixes", json=body)
    assert pinned.status_code == 200, pinned.text
    owner = deployment.replicas[deployment.routed[-1]]
    salt = owner.pin_commands[-1].cache_salt  # as the gateway composed it
    assert salt is not None
    assert "team-a" in salt
    request = {"model": "m", "prompt": knowledge + "?", "max_tokens": 1, "cache_salt": "team-a"}
    assert (await client.post("/v1/completions", json=request)).status_code == 200
    assert deployment.routed[-1] == owner.name
    assert owner.calls[-1].params.cache_salt == salt  # the same salt: the pinned KV serves it


async def test_a_constraint_reaches_the_replica_in_the_pickled_call(
    client: httpx.AsyncClient, deployment: FakeDeployment
) -> None:
    """Structured output over Ray: the route checks the schema in the ingress, the call (as Ray
    pickles it) carries the constraint the replica's engine compiles; the listing says so."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    body = {"model": "m", "prompt": "where?", "max_tokens": 1, "response_format": fmt}
    answer = await client.post("/v1/completions", json=body)
    assert answer.status_code == 200, answer.text
    call = deployment.replicas[deployment.routed[-1]].calls[-1]
    assert call.params.constraint == constraints.json_schema(schema)
    assert pickle.loads(pickle.dumps(call)) == call
    bad = {**body, "response_format": {**fmt, "json_schema": {"schema": {"type": "nope"}}}}
    refused = await client.post("/v1/completions", json=bad)
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["param"] == "response_format"
    listed = {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}
    assert listed["m"]["capabilities"]["structured_output"] is True
