"""Fake model providers and what they lease, for tests that run no model: `FakeProvider` (fake
LLMs by name), `CatalogProvider` (a catalog of fake LLMs and predictors, with aliases, failures
and load/unload), `GatewayModels` (any name is a model, for the gateway tests), `fake_lease`,
`FakePredictor`, and an in-memory key store `MemoryKeys`. Each provider implements the whole
`ModelProvider` protocol (`_conforms` below is checked by mypy when run on tests)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fakes.llm import FakeLLM
from modelyard.engine.messages import SchedulerStats
from modelyard.gateway.keys import KeyRecord, hash_key, new_record
from modelyard.manager.adapters import AdapterTable, adapter_lease, adapter_spec
from modelyard.manager.base import (
    Adapter,
    Lease,
    ModelLoadError,
    ModelNotFoundError,
    ModelProvider,
    ModelUnavailableError,
)
from modelyard.model_spec import ModelKind, ModelSpec

TENSOR_METADATA = {
    "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}],
    "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}],
}


@dataclass
class FakePredictor:
    """Answers per kind: embeddings [len(text), 1.0], labels, or the tensor `x` as `y`."""

    kind: ModelKind
    calls: list[list[Any]] = field(default_factory=list)

    async def predict(self, inputs: Any, options: dict[str, Any] | None = None) -> Any:
        self.calls.append(list(inputs))
        if self.kind == ModelKind.EMBEDDING:
            vectors = [[float(len(text)), 1.0] for text in inputs]
            if options and options.get("usage"):
                return [{"embedding": v, "tokens": 1} for v in vectors]
            return vectors
        if self.kind == ModelKind.TENSOR:
            return [{"y": item["x"]} for item in inputs]
        return [[{"label": "sports", "score": 1.0}] for _ in inputs]


def fake_lease(spec: ModelSpec, model: FakeLLM | FakePredictor | None = None) -> Lease:
    """The provider's `Lease` of `spec`'s model (None where the test runs no model)."""
    metadata = TENSOR_METADATA if spec.kind == ModelKind.TENSOR else {}
    return Lease(spec.id, spec.kind, model, metadata)  # type: ignore[arg-type]


class FakeProviderBase:
    """What every fake provider shares: the protocol's listing, control and LoRA adapters (the
    real `AdapterTable`, so adapters resolve as in the manager). Subclasses give `spec_of`,
    `lease_model` and `catalog_entries`."""

    ready = True

    def __init__(self) -> None:
        self.adapter_table = AdapterTable.of_catalog(self.catalog_entries())
        self.control: list[tuple[str, str]] = []  # (load|unload, model id)
        self.loaded: set[str] = set()
        self.closed = False

    def catalog_entries(self) -> list[ModelSpec]:
        raise NotImplementedError

    def spec_of(self, name: str) -> ModelSpec:
        raise NotImplementedError

    def lease_model(self, spec: ModelSpec) -> contextlib.AbstractAsyncContextManager[Lease]:
        raise NotImplementedError

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        self.closed = True

    @contextlib.asynccontextmanager
    async def lease(self, name: str) -> AsyncIterator[Lease]:
        adapter = self.adapter_table.get(name)
        async with self.lease_model(self.spec_of(adapter.base if adapter else name)) as lease:
            yield adapter_lease(adapter, lease) if adapter else lease

    def spec(self, name: str) -> ModelSpec:
        adapter = self.adapter_table.get(name)
        if adapter is not None:
            return adapter_spec(adapter, self.spec_of(adapter.base))
        return self.spec_of(name)

    def state(self, name: str) -> str:
        return "loaded" if self.spec_of(name).id in self.loaded else "unloaded"

    def metadata(self, name: str) -> dict[str, Any] | None:
        return None

    async def load(self, name: str) -> None:
        self.control.append(("load", self.spec_of(name).id))
        self.loaded.add(self.spec_of(name).id)

    async def unload(self, name: str) -> None:
        self.control.append(("unload", self.spec_of(name).id))
        self.loaded.discard(self.spec_of(name).id)

    def describe(self) -> dict[str, Any]:
        return {"available_models": [], "loaded_models": [], "adapters": []}

    def engine_stats(self) -> dict[str, SchedulerStats]:
        return {}

    def adapters(self) -> list[Adapter]:
        return self.adapter_table.all()

    def add_adapter(self, name: str, base: str, folder: str) -> Adapter:
        if any(name in (s.id, s.name, *s.aliases) for s in self.catalog_entries()):
            raise ValueError(f"the LoRA adapter {name!r} has already been loaded")
        return self.adapter_table.add(name, self.spec_of(base).id, folder)

    async def remove_adapter(self, name: str) -> Adapter:
        adapter = self.adapter_table.remove(name)
        engine = self.engine_of(adapter.base)
        if engine is not None and adapter.base in self.loaded:
            await engine.drop_loras([name])
        return adapter

    def engine_of(self, model_id: str) -> FakeLLM | None:
        return None


class FakeProvider(FakeProviderBase):
    """Fake LLMs by name (chat models, no aliases); `unavailable` ones answer 503."""

    def __init__(self, models: dict[str, FakeLLM], unavailable: set[str] | None = None) -> None:
        self.models = models
        self.unavailable = unavailable or set()
        self.leased: list[str] = []
        self.active = 0
        super().__init__()

    def catalog_entries(self) -> list[ModelSpec]:
        return [ModelSpec(id=name, kind=ModelKind.CHAT, backend="llm") for name in self.models]

    def spec_of(self, name: str) -> ModelSpec:
        if name not in self.models:
            raise ModelNotFoundError(f"model {name!r} not found")
        return ModelSpec(id=name, kind=ModelKind.CHAT, backend="llm")

    @contextlib.asynccontextmanager
    async def lease_model(self, spec: ModelSpec) -> AsyncIterator[Lease]:
        if spec.id in self.unavailable:
            raise ModelUnavailableError("no memory", retry_after_s=3.0)
        self.leased.append(spec.id)
        self.loaded.add(spec.id)
        self.active += 1
        try:
            yield fake_lease(spec, self.models[spec.id])
        finally:
            self.active -= 1

    def engine_stats(self) -> dict[str, SchedulerStats]:
        return {name: llm.stats() for name, llm in self.models.items()}

    def engine_of(self, model_id: str) -> FakeLLM | None:
        return self.models.get(model_id)

    def describe(self) -> dict[str, Any]:
        return {
            "available_models": [
                {"id": k, "capabilities": m.capabilities.listed(chat=True)}
                for k, m in self.models.items()
            ],
            "loaded_models": [],
            "adapters": self.adapter_table.describe(),
        }


class CatalogProvider(FakeProviderBase):
    """Models by id with aliases; `failing` ones raise ModelLoadError on lease."""

    def __init__(self, specs: list[ModelSpec]) -> None:
        self.specs = {s.id: s for s in specs}
        self.models: dict[str, FakeLLM | FakePredictor] = {
            s.id: FakeLLM(name=s.id) if s.kind.is_llm else FakePredictor(s.kind) for s in specs
        }
        self.failing: set[str] = set()
        self.leased: list[str] = []
        self.active = 0
        super().__init__()

    def catalog_entries(self) -> list[ModelSpec]:
        return list(self.specs.values())

    def spec_of(self, name: str) -> ModelSpec:
        for spec in self.specs.values():
            if name in (spec.id, spec.name, *spec.aliases):
                return spec
        raise ModelNotFoundError(f"model {name!r} not found")

    @contextlib.asynccontextmanager
    async def lease_model(self, spec: ModelSpec) -> AsyncIterator[Lease]:
        if spec.id in self.failing:
            raise ModelLoadError(f"{spec.id}: weights not found")
        self.leased.append(spec.id)
        self.loaded.add(spec.id)
        self.active += 1
        try:
            yield fake_lease(spec, self.models[spec.id])
        finally:
            self.active -= 1

    def engine_stats(self) -> dict[str, SchedulerStats]:
        return {k: m.stats() for k, m in self.models.items() if isinstance(m, FakeLLM)}

    def engine_of(self, model_id: str) -> FakeLLM | None:
        model = self.models.get(model_id)
        return model if isinstance(model, FakeLLM) else None

    def describe(self) -> dict[str, Any]:
        available = [
            {
                "id": s.id,
                "name": s.name or s.id,
                "aliases": list(s.aliases),
                "kind": str(s.kind),
                "backend": s.backend,
                "version": s.version,
                "description": "",
                "state": self.state(s.id),
                "last_error": "/secret/path/weights missing" if s.id in self.failing else None,
            }
            for s in self.specs.values()
        ]
        loaded = [
            {"id": i, "memory_bytes": 1000, "pid": 4242, "active_leases": 0} for i in self.loaded
        ]
        memory = {"budget_bytes": 10_000, "used_bytes": 1000 * len(self.loaded)}
        return {
            "available_models": available,
            "loaded_models": loaded,
            "memory": memory,
            "adapters": self.adapter_table.describe(),
        }


class GatewayModels(FakeProviderBase):
    """A provider whose every model is a chat LLM, except names starting with `embed`."""

    def __init__(self, down: set[str]) -> None:
        self.down = down  # models whose load fails
        super().__init__()

    def catalog_entries(self) -> list[ModelSpec]:
        return []

    def spec_of(self, name: str) -> ModelSpec:
        kind = ModelKind.EMBEDDING if name.startswith("embed") else ModelKind.CHAT
        return ModelSpec(id=name, kind=kind)

    @contextlib.asynccontextmanager
    async def lease_model(self, spec: ModelSpec) -> AsyncIterator[Lease]:
        if spec.id in self.down:
            raise ModelLoadError(f"{spec.id} is down")
        yield fake_lease(spec)


class MemoryKeys:
    """In-memory KeyStore."""

    def __init__(self) -> None:
        self.records: dict[str, KeyRecord] = {}

    def add(self, record: KeyRecord) -> None:
        self.records[record.key_hash] = record

    def find(self, key: str) -> KeyRecord | None:
        return self.records.get(hash_key(key))

    def list(self) -> list[KeyRecord]:
        return list(self.records.values())

    def revoke(self, key_id: str) -> bool:
        return False

    def has_keys(self) -> bool:
        return bool(self.records)

    def bearer(self, tenant: str, **settings: Any) -> dict[str, str]:
        key, record = new_record(tenant, **settings)
        self.add(record)
        return {"authorization": f"Bearer {key}"}


def _conforms(a: FakeProvider, b: CatalogProvider, c: GatewayModels) -> list[ModelProvider]:
    """Each fake implements the whole provider protocol (mypy checks this when run on tests)."""
    return [a, b, c]
