"""Fake model providers and what they lease, for tests that run no model: `FakeProvider` (fake
LLMs by name), `CatalogProvider` (a catalog of fake LLMs and predictors, with aliases, failures
and load/unload), `GatewayModels` (any name is a model, for the gateway tests), one `FakeLease`,
`FakePredictor`, and an in-memory key store `MemoryKeys`."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fakes.llm import FakeLLM
from modelyard.engine.messages import SchedulerStats
from modelyard.gateway.keys import KeyRecord, hash_key, new_record
from modelyard.manager.base import ModelLoadError, ModelNotFoundError, ModelUnavailableError
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


@dataclass
class FakeLease:
    """A lease of `spec`'s model: an LLM or a predictor (asking for the other kind raises
    TypeError, as the manager's lease does), or None where the test runs no model."""

    spec: ModelSpec
    model: FakeLLM | FakePredictor | None = None

    @property
    def model_id(self) -> str:
        return self.spec.id

    @property
    def kind(self) -> ModelKind:
        return self.spec.kind

    @property
    def llm(self) -> Any:
        if isinstance(self.model, FakePredictor):
            raise TypeError("not an LLM")
        return self.model

    @property
    def predictor(self) -> Any:
        if isinstance(self.model, FakeLLM):
            raise TypeError("an LLM")
        return self.model

    @property
    def metadata(self) -> dict[str, Any]:
        return TENSOR_METADATA if self.spec.kind == ModelKind.TENSOR else {}


class FakeProvider:
    def __init__(self, models: dict[str, FakeLLM], unavailable: set[str] | None = None) -> None:
        self.models = models
        self.unavailable = unavailable or set()
        self.leased: list[str] = []
        self.active = 0
        self.closed = False

    @contextlib.asynccontextmanager
    async def lease(self, name: str) -> AsyncIterator[FakeLease]:
        if name not in self.models:
            raise ModelNotFoundError(f"model {name!r} not found")
        if name in self.unavailable:
            raise ModelUnavailableError("no memory", retry_after_s=3.0)
        self.leased.append(name)
        self.active += 1
        try:
            yield FakeLease(self.spec(name), self.models[name])
        finally:
            self.active -= 1

    def spec(self, name: str) -> ModelSpec:
        if name not in self.models:
            raise ModelNotFoundError(f"model {name!r} not found")
        return ModelSpec(id=name, kind=ModelKind.CHAT, backend="llm")

    def engine_stats(self) -> dict[str, SchedulerStats]:
        return {name: llm.stats() for name, llm in self.models.items()}

    def describe(self) -> dict[str, Any]:
        return {"available_models": [{"id": k} for k in self.models], "loaded_models": []}

    async def close(self) -> None:
        self.closed = True


class CatalogProvider:
    """Models by id with aliases; `failing` ones raise ModelLoadError on lease."""

    def __init__(self, specs: list[ModelSpec]) -> None:
        self.specs = {s.id: s for s in specs}
        self.models: dict[str, FakeLLM | FakePredictor] = {
            s.id: FakeLLM(name=s.id) if s.kind.is_llm else FakePredictor(s.kind) for s in specs
        }
        self.failing: set[str] = set()
        self.leased: list[str] = []
        self.loaded: set[str] = set()
        self.active = 0
        self.control: list[tuple[str, str]] = []  # (load|unload, model id)

    def spec(self, name: str) -> ModelSpec:
        for spec in self.specs.values():
            if name in (spec.id, spec.name, *spec.aliases):
                return spec
        raise ModelNotFoundError(f"model {name!r} not found")

    @contextlib.asynccontextmanager
    async def lease(self, name: str) -> AsyncIterator[FakeLease]:
        spec = self.spec(name)
        if spec.id in self.failing:
            raise ModelLoadError(f"{spec.id}: weights not found")
        self.leased.append(spec.id)
        self.loaded.add(spec.id)
        self.active += 1
        try:
            yield FakeLease(spec, self.models[spec.id])
        finally:
            self.active -= 1

    async def load(self, name: str) -> None:
        self.control.append(("load", self.spec(name).id))
        self.loaded.add(self.spec(name).id)

    async def unload(self, name: str) -> None:
        self.control.append(("unload", self.spec(name).id))
        self.loaded.discard(self.spec(name).id)

    def state(self, name: str) -> str:
        return "loaded" if self.spec(name).id in self.loaded else "unloaded"

    def metadata(self, name: str) -> dict[str, Any] | None:
        return None

    def engine_stats(self) -> dict[str, SchedulerStats]:
        return {k: m.stats() for k, m in self.models.items() if isinstance(m, FakeLLM)}

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
        return {"available_models": available, "loaded_models": loaded, "memory": memory}

    async def close(self) -> None:
        return None


class GatewayModels:
    """A provider whose every model is a chat LLM, except names starting with `embed`."""

    def __init__(self, down: set[str]) -> None:
        self.down = down  # models whose load fails

    def spec(self, name: str) -> ModelSpec:
        kind = ModelKind.EMBEDDING if name.startswith("embed") else ModelKind.CHAT
        return ModelSpec(id=name, kind=kind)

    @contextlib.asynccontextmanager
    async def lease(self, name: str) -> AsyncIterator[FakeLease]:
        if name in self.down:
            raise ModelLoadError(f"{name} is down")
        yield FakeLease(self.spec(name))

    def describe(self) -> dict[str, Any]:
        return {"available_models": [], "loaded_models": []}

    async def close(self) -> None:
        return None


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
