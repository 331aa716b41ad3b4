"""LoRA adapters at the HTTP edge, with fakes: catalog-declared adapters are model ids listed
with their base as parent; a request for one leases the base and passes the adapter to the
engine; unknown adapters 404; unload/load answer vLLM's messages and errors; admins only once
auth is on."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from api_fakes import FakeLLM, FakeProvider, make_client

from modelyard.api.app import build_app
from modelyard.config import ModelyardConfig
from modelyard.gateway.base import PRINCIPAL_SCOPE_KEY, Principal
from modelyard.manager.base import ModelKind
from modelyard.manager.catalog import Catalog, ModelSpec
from modelyard.manager.entries import State

pytestmark = pytest.mark.unit


class CatalogProvider(FakeProvider):
    """The fake provider with a catalog whose LLM declares two adapters."""

    def __init__(self, llm: FakeLLM) -> None:
        super().__init__({"base": llm})
        options = {"lora_modules": {"finance": "/adapters/finance", "legal": "/adapters/legal"}}
        spec = ModelSpec(id="base", kind=ModelKind.CHAT, backend="llm", source="x", options=options)
        self.catalog = Catalog([spec])

    def state(self, name: str) -> State:
        return State.LOADED


@pytest.fixture
async def setup() -> AsyncIterator[tuple[httpx.AsyncClient, FakeLLM, Any]]:
    llm = FakeLLM(name="base")
    app = build_app(CatalogProvider(llm), ModelyardConfig())
    async with make_client(app) as client:
        yield client, llm, app


async def test_adapters_are_models_with_their_base_as_parent(
    setup: tuple[httpx.AsyncClient, FakeLLM, Any],
) -> None:
    client, _, _ = setup
    data = (await client.get("/v1/models")).json()["data"]
    parents = {m["id"]: m.get("parent") for m in data}
    assert parents == {"base": None, "finance": "base", "legal": "base"}


async def test_a_request_for_an_adapter_runs_the_base_with_it(
    setup: tuple[httpx.AsyncClient, FakeLLM, Any],
) -> None:
    client, llm, _ = setup
    body = {"model": "finance", "prompt": "abc", "max_tokens": 3}
    response = await client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "finance"
    (call,) = llm.calls
    assert call.lora is not None
    assert (call.lora.name, call.lora.path) == ("finance", "/adapters/finance")
    await client.post("/v1/completions", json={**body, "model": "base"})
    assert llm.calls[-1].lora is None
    missing = await client.post("/v1/completions", json={**body, "model": "nope"})
    assert missing.status_code == 404
    assert missing.json()["error"]["param"] == "model"


async def test_unload_and_load_errors(setup: tuple[httpx.AsyncClient, FakeLLM, Any]) -> None:
    client, llm, _ = setup
    response = await client.post("/v1/unload_lora_adapter", json={"lora_name": "legal"})
    assert response.status_code == 200
    assert response.text == "Success: LoRA adapter 'legal' removed successfully."
    assert llm.dropped_loras == ["legal"]
    again = await client.post("/v1/unload_lora_adapter", json={"lora_name": "legal"})
    assert again.status_code == 404
    gone = await client.post("/v1/completions", json={"model": "legal", "prompt": "a"})
    assert gone.status_code == 404
    taken = {"lora_name": "finance", "lora_path": "/elsewhere"}
    assert (await client.post("/v1/load_lora_adapter", json=taken)).status_code == 400
    base_name = {"lora_name": "base", "lora_path": "/elsewhere"}
    assert (await client.post("/v1/load_lora_adapter", json=base_name)).status_code == 400
    unknown_base = {"lora_name": "new", "lora_path": "/x", "base_model": "nope"}
    assert (await client.post("/v1/load_lora_adapter", json=unknown_base)).status_code == 404
    bad = await client.post("/v1/load_lora_adapter", json={"lora_name": "new", "lora_path": "/x"})
    assert bad.status_code == 400
    assert "adapter_config.json" in bad.json()["error"]["message"]


@pytest.mark.parametrize(("admin", "status"), [(False, 403), (True, 404)])
async def test_only_admins_once_auth_is_on(admin: bool, status: int) -> None:
    app = build_app(CatalogProvider(FakeLLM(name="base")), ModelyardConfig())

    async def with_principal(scope: Any, receive: Any, send: Any) -> None:
        scope[PRINCIPAL_SCOPE_KEY] = Principal(tenant="t", key_id="k", is_admin=admin)
        await app(scope, receive, send)

    async with make_client(with_principal) as client:
        response = await client.post("/v1/unload_lora_adapter", json={"lora_name": "missing"})
    assert response.status_code == status
