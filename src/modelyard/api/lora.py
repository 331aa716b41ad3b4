"""The LoRA adapters this server knows: adapter name -> base model, PEFT folder, registration.

An adapter is addressed like a model: its name is a model id (listed by /v1/models with its base
as `parent`, as vLLM lists them), a route target, a tenant override's target. When a request's
target is an adapter, the generation leases the BASE model and runs with the adapter
(`LoRARequest` in the engine request); the engine loads the adapter's weights from the folder on
first use, so the registry survives the base model being unloaded and reloaded.

Adapters come from the catalog (`lora_modules: {name: folder}` on an LLM entry) and from the
admin-only `POST /v1/load_lora_adapter` (api.routes.lora). The folder is never a client's
choice outside those admin calls.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from modelyard.engine.messages import LoRARequest


@dataclass(frozen=True)
class Adapter:
    """One registered adapter."""

    base: str  # the base model's catalog id
    lora: LoRARequest  # name, folder and registration id, as the engine receives them


class LoRARegistry:
    """Registered adapters by name (see the module docstring)."""

    def __init__(self) -> None:
        self._adapters: dict[str, Adapter] = {}
        self._ids = itertools.count(1)

    @classmethod
    def from_provider(cls, provider: Any) -> LoRARegistry:
        """The adapters the provider's catalog declares (none when it has no catalog)."""
        from modelyard.manager.loaders import lora_modules_of

        registry = cls()
        for spec in getattr(provider, "catalog", None) or ():
            if spec.kind.is_llm:
                for name, path in lora_modules_of(spec).items():
                    registry.add(name, spec.id, path)
        return registry

    def add(self, name: str, base: str, path: str) -> Adapter:
        """Register; ValueError if the name is taken."""
        if name in self._adapters:
            raise ValueError(f"the LoRA adapter {name!r} has already been loaded")
        lora = LoRARequest(name=name, path=path, adapter_id=next(self._ids))
        adapter = Adapter(base, lora)
        self._adapters[name] = adapter
        return adapter

    def remove(self, name: str) -> Adapter:
        """Unregister; KeyError if unknown."""
        return self._adapters.pop(name)

    def get(self, name: str) -> Adapter | None:
        return self._adapters.get(name)

    def __iter__(self) -> Any:
        return iter(list(self._adapters.values()))
