"""LoRA adapters at the HTTP edge, with fake models behind the real routes, gateway and request
path (auth on): catalog-declared adapters are model ids listed with their base as parent and
allowed by their own name; a request for one leases the base and passes the adapter to the
engine; a tenant override can make an adapter a tenant's default; unknown adapters 404;
load/unload answer vLLM's messages and errors, for admins only."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from api_helpers import make_client, path_app

from fakes.llm import FakeLLM
from fakes.models import CatalogProvider, MemoryKeys
from modelyard.manager.base import ModelKind
from modelyard.manager.catalog import Catalog, ModelSpec

pytestmark = pytest.mark.unit

LORA_MODULES = {"finance": "/adapters/finance", "legal": "/adapters/legal"}
SPECS = [
    ModelSpec(
        id="base",
        kind=ModelKind.CHAT,
        backend="llm",
        source="x",
        options={"lora_modules": LORA_MODULES, "max_loras": 2},
    ),
    ModelSpec(id="emb", kind=ModelKind.EMBEDDING),
]
GATEWAY = {
    "tenants": {"bank": {"models": ["chat", "finance"]}, "acme": {"models": ["base", "chat"]}},
    "routes": {"models": {"chat": {"target": "base", "tenants": {"bank": "finance"}}}},
}


class LoRAProvider(CatalogProvider):
    """The request-path fake provider, with the catalog the LoRA registry reads."""

    def __init__(self) -> None:
        super().__init__(SPECS)
        self.catalog = Catalog(SPECS)


@dataclass
class Env:
    client: httpx.AsyncClient
    llm: FakeLLM
    keys: MemoryKeys


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    provider, keys = LoRAProvider(), MemoryKeys()
    async with make_client(path_app(provider, keys, GATEWAY)) as client:
        llm = provider.models["base"]
        assert isinstance(llm, FakeLLM)
        yield Env(client, llm, keys)


def completion(model: str) -> dict[str, object]:
    return {"model": model, "prompt": "abc", "max_tokens": 3}


async def test_adapters_are_models_with_their_base_as_parent(env: Env) -> None:
    admin = env.keys.bearer("ops", admin=True)
    data = (await env.client.get("/v1/models", headers=admin)).json()["data"]
    parents = {m["id"]: m.get("parent") for m in data}
    assert {k: parents[k] for k in ("base", "finance", "legal")} == {
        "base": None,
        "finance": "base",
        "legal": "base",
    }
    bank = (await env.client.get("/v1/models", headers=env.keys.bearer("bank"))).json()["data"]
    assert {m["id"] for m in bank} == {"chat", "finance"}  # adapters by their own name


async def test_a_request_for_an_adapter_runs_the_base_with_it(env: Env) -> None:
    bank, acme = env.keys.bearer("bank"), env.keys.bearer("acme")
    response = await env.client.post("/v1/completions", json=completion("finance"), headers=bank)
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "finance"
    lora = env.llm.calls[-1].lora
    assert lora is not None
    assert (lora.name, lora.path) == ("finance", "/adapters/finance")
    refused = await env.client.post("/v1/completions", json=completion("legal"), headers=bank)
    assert refused.status_code == 403  # allowed the base's adapters only by name
    assert (
        await env.client.post("/v1/completions", json=completion("base"), headers=acme)
    ).status_code == 200
    assert env.llm.calls[-1].lora is None
    admin = env.keys.bearer("ops", admin=True)
    missing = await env.client.post("/v1/completions", json=completion("nope"), headers=admin)
    assert missing.status_code == 404


async def test_a_tenant_override_makes_an_adapter_the_tenants_default(env: Env) -> None:
    for tenant, expected in (("bank", "finance"), ("acme", None)):
        headers = env.keys.bearer(tenant)
        response = await env.client.post(
            "/v1/completions", json=completion("chat"), headers=headers
        )
        assert response.status_code == 200, response.text
        lora = env.llm.calls[-1].lora
        assert (lora.name if lora else None) == expected
    embeddings = await env.client.post(
        "/v1/embeddings", json={"model": "finance", "input": ["a"]}, headers=env.keys.bearer("bank")
    )
    assert embeddings.status_code == 400  # an adapter is an LLM


async def test_load_and_unload_are_for_admins(env: Env) -> None:
    tenant, admin = env.keys.bearer("acme"), env.keys.bearer("ops", admin=True)
    refused = await env.client.post(
        "/v1/unload_lora_adapter", json={"lora_name": "legal"}, headers=tenant
    )
    assert refused.status_code == 403
    await env.client.post("/v1/completions", json=completion("base"), headers=admin)  # loads it
    response = await env.client.post(
        "/v1/unload_lora_adapter", json={"lora_name": "legal"}, headers=admin
    )
    assert response.status_code == 200
    assert response.text == "Success: LoRA adapter 'legal' removed successfully."
    assert env.llm.dropped_loras == ["legal"]
    again = await env.client.post(
        "/v1/unload_lora_adapter", json={"lora_name": "legal"}, headers=admin
    )
    assert again.status_code == 404
    gone = await env.client.post("/v1/completions", json=completion("legal"), headers=admin)
    assert gone.status_code == 404


@pytest.mark.parametrize(
    ("body", "status", "text"),
    [
        ({"lora_name": "finance", "lora_path": "/x"}, 400, "already been loaded"),
        ({"lora_name": "base", "lora_path": "/x"}, 400, "already been loaded"),
        ({"lora_name": "new", "lora_path": "/x", "base_model": "nope"}, 404, "not found"),
        ({"lora_name": "new", "lora_path": "/x", "base_model": "emb"}, 400, "serves no LoRA"),
        ({"lora_name": "new", "lora_path": "/x"}, 400, "adapter_config.json"),
    ],
)
async def test_load_errors(env: Env, body: dict[str, str], status: int, text: str) -> None:
    admin = env.keys.bearer("ops", admin=True)
    response = await env.client.post("/v1/load_lora_adapter", json=body, headers=admin)
    assert response.status_code == status, response.text
    assert text in response.json()["error"]["message"]
