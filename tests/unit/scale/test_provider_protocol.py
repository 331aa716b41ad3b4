"""The LoRA admin routes and adapter leases behave the same over both providers: the local
manager (fake engines) and the Ray provider (a fake deployment, ray_fakes.py). Each test runs
once per provider: load an adapter, list it, run it, unload it (its base's engine frees it),
and get a 404 for an adapter that is not loaded."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("ray.serve", reason="the `ray` extra is not installed")

from ray_fakes import FakeDeployment

from fakes.llm import FakeLLM
from modelyard.api.app import build_app
from modelyard.api.routes import lora as lora_routes
from modelyard.config import ModelyardConfig
from modelyard.manager.base import ModelProvider
from modelyard.manager.catalog import Catalog
from modelyard.manager.config import ManagerConfig
from modelyard.manager.loaders import LLMModel
from modelyard.manager.manager import Manager
from modelyard.model_spec import ModelKind, ModelSpec
from modelyard.scale.provider import RayProvider

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

SPEC = ModelSpec(
    id="m",
    kind=ModelKind.COMPLETION,
    backend="llm",
    source="m.gguf",
    memory_estimate_bytes=1024,
    options={"lora_modules": {"finance": "/adapters/finance"}, "max_loras": 2},
)


@dataclass
class Served:
    """A provider behind the app, and what its base engine's adapter drops were."""

    client: httpx.AsyncClient
    provider: ModelProvider
    dropped: Callable[[], list[str]]


class OneLLMLoader:
    """The manager's loader: one fake engine, kept for the test to inspect."""

    def __init__(self) -> None:
        self.llm = FakeLLM(name="m")

    async def load(self, spec: ModelSpec) -> Any:
        return LLMModel(llm=self.llm, metadata={}, kind=spec.kind)


async def local_provider() -> tuple[ModelProvider, Callable[[], list[str]]]:
    loader = OneLLMLoader()
    config = ManagerConfig(memory_budget_bytes=1 << 30, measure_memory=False)
    manager = Manager(Catalog([SPEC]), config, loader=loader)
    return manager, lambda: loader.llm.dropped_loras


async def ray_provider() -> tuple[ModelProvider, Callable[[], list[str]]]:
    deployment = FakeDeployment("r1", "r2")
    provider = RayProvider(Catalog([SPEC]), {"m": deployment}, None)
    await provider.start()

    def dropped() -> list[str]:
        return sorted({n for r in deployment.replicas.values() for d in r.dropped for n in d})

    return provider, dropped


@pytest.fixture(params=["local", "ray"])
async def served(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Served]:
    # the folder check reads a real PEFT folder against the base's config: tested in
    # tests/unit/api/test_lora_admin.py; here any folder passes
    monkeypatch.setattr(lora_routes, "check_adapter", lambda name, path, *_: Path(path))
    make = local_provider if request.param == "local" else ray_provider
    provider, dropped = await make()
    app = build_app(provider, ModelyardConfig(), close_provider=False)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield Served(client, provider, dropped)
    await provider.close()


async def complete(client: httpx.AsyncClient, model: str) -> httpx.Response:
    body = {"model": model, "prompt": "abc", "max_tokens": 1, "temperature": 0}
    return await client.post("/v1/completions", json=body)


async def test_catalog_adapters_are_entries_of_the_provider(served: Served) -> None:
    assert [a.name for a in served.provider.adapters()] == ["finance"]
    assert served.provider.spec("finance").id == "finance"
    assert served.provider.describe()["adapters"] == [{"id": "finance", "parent": "m"}]
    listed = (await served.client.get("/v1/models")).json()["data"]
    assert {"id": "finance", "parent": "m"}.items() <= listed[-1].items()


async def test_load_run_and_unload_an_adapter(served: Served) -> None:
    body = {"lora_name": "legal", "lora_path": "/adapters/legal", "base_model": "m"}
    loaded = await served.client.post("/v1/load_lora_adapter", json=body)
    assert loaded.status_code == 200, loaded.text
    assert "legal" in [a.name for a in served.provider.adapters()]
    ran = await complete(served.client, "legal")
    assert ran.status_code == 200, ran.text
    async with served.provider.lease("legal") as lease:
        assert lease.model_id == "legal"
        assert lease.llm.model_name == "legal"
    again = await served.client.post("/v1/load_lora_adapter", json=body)
    assert again.status_code == 400
    assert "already been loaded" in again.json()["error"]["message"]

    gone = await served.client.post("/v1/unload_lora_adapter", json={"lora_name": "legal"})
    assert gone.status_code == 200, gone.text
    assert served.dropped() == ["legal"]
    assert (await complete(served.client, "legal")).status_code == 404
    missing = await served.client.post("/v1/unload_lora_adapter", json={"lora_name": "legal"})
    assert missing.status_code == 404


async def test_a_model_name_cannot_become_an_adapter(served: Served) -> None:
    body = {"lora_name": "m", "lora_path": "/adapters/x"}
    response = await served.client.post("/v1/load_lora_adapter", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "lora_name"
