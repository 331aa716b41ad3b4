"""Optional engine features are declared (`EngineCapabilities`), and a route on a model whose
engine lacks one answers a 400 in the OpenAI envelope naming the feature: a LoRA adapter on an
engine without LoRA, a pin on an engine without pins (and on an adapter: pins hold the base's
KV). The model listings say what each LLM's engine serves (`capabilities`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from api_helpers import make_client

from fakes.llm import FakeLLM
from fakes.models import FakeProvider
from modelyard.api.app import build_app
from modelyard.config import ModelyardConfig
from modelyard.engine.client.protocol import EngineCapabilities

pytestmark = pytest.mark.unit


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    plain = FakeLLM(name="plain", capabilities=EngineCapabilities())  # neither LoRA nor pins
    full = EngineCapabilities(lora=True, structured_output=True, tools=True)
    provider = FakeProvider({"plain": plain, "lora": FakeLLM(name="lora", capabilities=full)})
    provider.add_adapter("on-plain", "plain", "/adapters/a")
    provider.add_adapter("on-lora", "lora", "/adapters/b")
    async with make_client(build_app(provider, ModelyardConfig())) as c:
        yield c


def assert_names_feature(response: httpx.Response, feature: str) -> None:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert feature in error["message"]
    assert error["param"] == "model"
    assert error["code"] == "unsupported_feature"


async def test_an_adapter_on_an_engine_without_lora_is_a_400(client: httpx.AsyncClient) -> None:
    body = {"model": "on-plain", "prompt": "abc", "max_tokens": 2}
    response = await client.post("/v1/completions", json=body)
    assert_names_feature(response, "LoRA adapters")
    body["model"] = "on-lora"
    assert (await client.post("/v1/completions", json=body)).status_code == 200


@pytest.mark.parametrize("model", ["plain", "on-lora"])
async def test_a_pin_on_an_engine_without_pins_is_a_400(
    client: httpx.AsyncClient, model: str
) -> None:
    response = await client.post("/v1/prefixes", json={"model": model, "text": "abcdabcd"})
    assert_names_feature(response, "pinned prefixes")


async def test_a_named_prefix_on_an_engine_without_pins_is_a_400(
    client: httpx.AsyncClient,
) -> None:
    body = {"model": "plain", "prompt": "abc", "max_tokens": 2, "prefix_id": "p1"}
    assert_names_feature(await client.post("/v1/completions", json=body), "pinned prefixes")


def test_capabilities_are_off_unless_declared() -> None:
    assert EngineCapabilities() == EngineCapabilities(
        lora=False, pins=False, speculation=False, structured_output=False, tools=False
    )


async def test_loading_an_adapter_where_no_model_serves_lora_is_a_400(
    client: httpx.AsyncClient,
) -> None:
    body = {"lora_name": "new", "lora_path": "/adapters/new"}
    response = await client.post("/v1/load_lora_adapter", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "unsupported_feature"
    assert "serves LoRA adapters" in response.json()["error"]["message"]


async def test_v1_models_lists_each_llm_s_capabilities(client: httpx.AsyncClient) -> None:
    """Each entry's `capabilities` are its engine's (an adapter's: its base's); the OpenAI
    fields stay as they are."""
    data = {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}
    none = {"chat": True, "tools": False, "structured_output": False}
    assert data["plain"]["capabilities"] == none
    assert data["on-plain"]["capabilities"] == none
    assert data["on-plain"]["parent"] == "plain"
    full = {"chat": True, "tools": True, "structured_output": True}
    assert data["lora"]["capabilities"] == data["on-lora"]["capabilities"] == full
    assert {k: data["lora"][k] for k in ("object", "owned_by")} == {
        "object": "model",
        "owned_by": "modelyard",
    }
    models = (await client.get("/models")).json()["models"]
    assert {m["id"]: m["capabilities"] for m in models}["plain"] == none
