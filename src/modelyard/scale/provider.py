"""`RayProvider`: the ingress's `ModelProvider`, over Ray Serve deployment handles.

The ingress runs the same ASGI app as single-node mode; only the provider differs. A lease of an
LLM yields a `RayLLMClient` (llm_client.py: tokenizes in the ingress, streams `RequestOutput`s
from a replica of the model's deployment, which the request router picks; LoRA adapters and
pinned prefixes as in local mode); a lease of another model yields a `RayPredictor` (a call to
the multiplexed pool with the model id). LoRA adapters are entries of the same `AdapterTable` as
local mode's (manager/adapters.py): a lease of one is its base's client running the adapter.
Errors from Ray come back as the errors the routes already map (calls.py).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

from modelyard.engine.messages import SchedulerStats
from modelyard.manager.adapters import AdapterTable, adapter_lease, adapter_spec
from modelyard.manager.base import Adapter, Lease, ModelProvider, ModelUnavailableError
from modelyard.manager.catalog import Catalog
from modelyard.model_spec import ModelKind, ModelSpec
from modelyard.scale.calls import reraise_local
from modelyard.scale.llm_client import RayLLMClient


class RayPredictor:
    """A non-LLM model of the multiplexed pool."""

    def __init__(self, pool: Any, model_id: str) -> None:
        self._pool = pool.options(multiplexed_model_id=model_id)

    async def predict(self, inputs: Any, options: dict[str, Any] | None = None) -> Any:
        try:
            return await self._pool.predict.remote(inputs, options)
        except Exception as exc:
            reraise_local(exc, llm=False)

    async def metadata(self) -> dict[str, Any]:
        """The model's KServe tensor metadata, from the replica that holds it."""
        try:
            return dict(await self._pool.metadata.remote())
        except Exception as exc:
            reraise_local(exc, llm=False)

    async def load(self) -> None:
        try:
            await self._pool.load.remote()
        except Exception as exc:
            reraise_local(exc, llm=False)

    async def unload(self) -> None:
        try:
            await self._pool.unload.remote()
        except Exception as exc:
            reraise_local(exc, llm=False)


class RayProvider:
    """`ModelProvider` of the ingress (see the module docstring)."""

    def __init__(self, catalog: Catalog, llm_handles: Mapping[str, Any], pool: Any) -> None:
        self.catalog = catalog
        self._llm_handles = dict(llm_handles)
        self._pool = pool
        self._llms: dict[str, RayLLMClient] = {}
        self._loaded: set[str] = set()  # pool models this ingress has seen loaded
        self._metadata: dict[str, dict[str, Any]] = {}
        self._adapters = AdapterTable.of_catalog(catalog)
        self.ready = False

    async def start(self) -> None:
        """Ask one replica of every LLM for its tokenizer and limits; then ready."""
        for model_id, handle in self._llm_handles.items():
            try:
                info = await handle.describe.remote()
            except Exception as exc:
                reraise_local(exc, llm=True)
            self._llms[model_id] = RayLLMClient(handle, info)
        self.ready = True

    async def close(self) -> None:
        await asyncio.gather(*(llm.shutdown() for llm in self._llms.values()))

    @contextlib.asynccontextmanager
    async def lease(self, name: str) -> AsyncIterator[Lease]:
        adapter = self._adapters.get(name)
        if adapter is not None:
            yield adapter_lease(adapter, await self._lease(adapter.base))
        else:
            yield await self._lease(name)

    async def _lease(self, name: str) -> Lease:
        spec = self.catalog.resolve(name)
        if spec.kind.is_llm:
            llm = self._llms.get(spec.id)
            if llm is None:
                raise ModelUnavailableError(f"{spec.id} is not ready yet", retry_after_s=2.0)
            return Lease(spec.id, spec.kind, llm)
        predictor = self._predictor(spec)
        if spec.kind == ModelKind.TENSOR and spec.id not in self._metadata:
            self._metadata[spec.id] = await predictor.metadata()
        self._loaded.add(spec.id)
        return Lease(spec.id, spec.kind, predictor, self._metadata.get(spec.id, {}))

    async def load(self, name: str) -> None:
        spec = self.catalog.resolve(name)
        if not spec.kind.is_llm:
            await self._predictor(spec).load()
            self._loaded.add(spec.id)

    async def unload(self, name: str) -> None:
        spec = self.catalog.resolve(name)
        if not spec.kind.is_llm:
            await self._predictor(spec).unload()
            self._loaded.discard(spec.id)

    def spec(self, name: str) -> ModelSpec:
        adapter = self._adapters.get(name)
        if adapter is not None:
            return adapter_spec(adapter, self.catalog.resolve(adapter.base))
        return self.catalog.resolve(name)

    def catalog_entries(self) -> list[ModelSpec]:
        return list(self.catalog)

    def state(self, name: str) -> str:
        adapter = self._adapters.get(name)
        spec = self.catalog.resolve(adapter.base if adapter else name)
        loaded = spec.id in self._llms or spec.id in self._loaded
        return "loaded" if loaded else "unloaded"

    def metadata(self, name: str) -> dict[str, Any] | None:
        return self._metadata.get(self.catalog.resolve(name).id)

    def describe(self) -> dict[str, Any]:
        available = [_describe_spec(spec, self.state(spec.id)) for spec in self.catalog]
        return {
            "models": available,
            "available_models": available,
            "loaded_models": [m for m in available if m["state"] == "loaded"],
            "adapters": self._adapters.describe(),
            "ready": self.ready,
            "backend": "ray",
        }

    def engine_stats(self) -> dict[str, SchedulerStats]:
        """None here: engine stats live in each replica (Ray's metrics export)."""
        return {}

    def adapters(self) -> list[Adapter]:
        return self._adapters.all()

    def add_adapter(self, name: str, base: str, folder: str) -> Adapter:
        return self._adapters.add_beside(self.catalog, name, base, folder)

    async def remove_adapter(self, name: str) -> Adapter:
        """Unregister; every replica of the base's deployment frees the adapter."""
        adapter = self._adapters.remove(name)
        llm = self._llms.get(adapter.base)
        if llm is not None:
            await llm.drop_loras([name])
        return adapter

    def _predictor(self, spec: ModelSpec) -> RayPredictor:
        if self._pool is None:
            raise ModelUnavailableError(f"{spec.id}: no model pool is deployed", 5.0)
        return RayPredictor(self._pool, spec.id)


def _describe_spec(spec: ModelSpec, state: str) -> dict[str, Any]:
    """As the local manager lists an entry; an LLM's `capabilities` are its deployment's."""
    described: dict[str, Any] = {
        "id": spec.id,
        "name": spec.name,
        "aliases": list(spec.aliases),
        "kind": str(spec.kind),
        "backend": spec.backend,
        "version": spec.version,
        "description": spec.description,
        "pin": spec.pin,
        "state": state,
        "last_error": None,
    }
    if spec.kind.is_llm:
        chat = spec.kind is ModelKind.CHAT
        described["capabilities"] = RayLLMClient.capabilities.listed(chat=chat)
    return described


def _conforms(provider: RayProvider) -> ModelProvider:
    """mypy checks here that the Ray provider implements the whole provider protocol."""
    return provider
