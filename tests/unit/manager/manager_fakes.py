"""Fakes for manager unit tests: an in-process loader whose models report a fixed size."""

from __future__ import annotations

import asyncio
from typing import Any

from modelyard.manager.catalog import Catalog
from modelyard.model_spec import ModelKind, ModelSpec

MB = 1024 * 1024


class FakeModel:
    def __init__(self, spec: ModelSpec, size: int) -> None:
        self.spec = spec
        self.size = size
        self.kind = spec.kind
        self.pid = None
        self.metadata: dict[str, Any] = {}
        self.alive = True
        self.stopped = False
        self.holds_pins = False  # an LLM engine holding pinned prefixes

    @property
    def is_alive(self) -> bool:
        return self.alive and not self.stopped

    def memory_bytes(self) -> int | None:
        return self.size

    async def predict(self, inputs: Any, options: dict[str, Any] | None = None) -> Any:
        return [f"{self.spec.id}:{x}" for x in inputs]

    async def stop(self) -> None:
        self.stopped = True


class FakeLoader:
    """Loads instantly (or after `delay`), records every load, fails models in `failing`."""

    def __init__(self, size: int = 100 * MB, delay: float = 0.0) -> None:
        self.size = size
        self.delay = delay
        self.loads: list[str] = []
        self.failing: set[str] = set()
        self.models: dict[str, FakeModel] = {}
        self.sizes: dict[str, int] = {}

    async def load(self, spec: ModelSpec) -> FakeModel:
        self.loads.append(spec.id)
        if self.delay:
            await asyncio.sleep(self.delay)
        if spec.id in self.failing:
            raise RuntimeError(f"cannot load {spec.id}")
        model = FakeModel(spec, self.sizes.get(spec.id, self.size))
        self.models[spec.id] = model
        return model


def make_catalog(*ids: str, **overrides: Any) -> Catalog:
    specs = []
    for model_id in ids:
        fields: dict[str, Any] = {
            "id": model_id,
            "kind": ModelKind.EMBEDDING,
            "backend": "echo",
            "memory_estimate_bytes": 100 * MB,
        }
        fields.update(overrides.get(model_id, {}))
        specs.append(ModelSpec(**fields))
    return Catalog(specs)
