"""LoRA adapters as provider entries: the table both providers (manager, Ray) resolve them from.

An adapter is addressed like a model: its name is an entry of its own (listed with its base as
`parent`, as vLLM lists them; on allow-lists by that name; a route target). A lease of an adapter
holds its BASE model and hands out the base's engine client with the adapter set on every
request (`LoRARequest` in the engine request); the engine loads the adapter's weights from the
folder on first use, so the table survives the base being unloaded and reloaded.

Adapters come from the catalog (`lora_modules` on an LLM entry, registered at provider start
through the same `add`) and from the admin-only `POST /v1/load_lora_adapter` (api/routes/lora.py,
which checks the folder first: api/lora.py).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import TYPE_CHECKING

from modelyard.engine.client.prefixes import EnginePrefixes
from modelyard.engine.client.protocol import (
    ChatMessageDict,
    EngineCapabilities,
    LLMClient,
    MissingCapabilityError,
    RequestOutput,
    Tokenizer,
)
from modelyard.engine.messages import LoRARequest, SchedulerStats
from modelyard.engine.sampling_params import SamplingParams
from modelyard.manager.base import Adapter, Lease, ModelNotFoundError
from modelyard.model_spec import ModelSpec

if TYPE_CHECKING:
    from modelyard.manager.catalog import Catalog


class AdapterTable:
    """Registered adapters by name (see the module docstring)."""

    def __init__(self) -> None:
        self._adapters: dict[str, Adapter] = {}
        self._ids = itertools.count(1)

    @classmethod
    def of_catalog(cls, specs: Iterable[ModelSpec]) -> AdapterTable:
        """The adapters the catalog's LLM entries declare (`lora_modules`)."""
        from modelyard.manager.loaders import lora_modules_of

        table = cls()
        for spec in specs:
            if spec.kind.is_llm:
                for name, folder in lora_modules_of(spec).items():
                    table.add(name, spec.id, folder)
        return table

    def add(self, name: str, base: str, folder: str) -> Adapter:
        """Register; ValueError if the name is taken (the provider also checks its models)."""
        if not name or name in self._adapters:
            raise ValueError(f"the LoRA adapter {name!r} has already been loaded")
        adapter = Adapter(base, LoRARequest(name=name, path=folder, adapter_id=next(self._ids)))
        self._adapters[name] = adapter
        return adapter

    def add_beside(self, catalog: Catalog, name: str, base: str, folder: str) -> Adapter:
        """Register an adapter of `base` (any of its names) beside the catalog's models:
        ValueError if a model or an adapter has the name, ModelNotFoundError for an unknown
        base. What both providers' `add_adapter` do."""
        if name in catalog:
            raise ValueError(f"the LoRA adapter {name!r} has already been loaded")
        return self.add(name, catalog.resolve(base).id, folder)

    def remove(self, name: str) -> Adapter:
        """Unregister; ModelNotFoundError if unknown."""
        adapter = self._adapters.pop(name, None)
        if adapter is None:
            raise ModelNotFoundError(f"the LoRA adapter {name!r} is not loaded")
        return adapter

    def get(self, name: str) -> Adapter | None:
        return self._adapters.get(name)

    def all(self) -> list[Adapter]:
        return list(self._adapters.values())

    def describe(self) -> list[dict[str, str]]:
        """The listing's `adapters`: id and parent (the folder stays server-side)."""
        return [{"id": a.name, "parent": a.base} for a in self._adapters.values()]


def adapter_spec(adapter: Adapter, base: ModelSpec) -> ModelSpec:
    """An adapter's entry: its base's, under the adapter's name."""
    name = adapter.name
    return dataclasses.replace(base, id=name, name=name, aliases=(), pin=False, preload=False)


def adapter_lease(adapter: Adapter, base: Lease) -> Lease:
    """The base model's lease, its engine running the adapter; MissingCapabilityError (400)
    when the base's engine serves no LoRA."""
    llm = base.llm
    if not llm.capabilities.lora:
        raise MissingCapabilityError(adapter.base, "LoRA adapters")
    return Lease(adapter.name, base.kind, AdapterClient(llm, adapter.lora))


class AdapterClient:
    """An engine client whose requests all run with one adapter. It pins no prefixes: a pin
    holds the base model's KV, which an adapter's requests do not share."""

    def __init__(self, llm: LLMClient, lora: LoRARequest) -> None:
        self.base = llm
        self.lora = lora

    @property
    def capabilities(self) -> EngineCapabilities:
        return dataclasses.replace(self.base.capabilities, pins=False)

    @property
    def model_name(self) -> str:
        return self.lora.name

    @property
    def max_model_len(self) -> int:
        return self.base.max_model_len

    @property
    def tokenizer(self) -> Tokenizer:
        return self.base.tokenizer

    @property
    def prefixes(self) -> EnginePrefixes:
        raise MissingCapabilityError(self.lora.name, "pinned prefixes")

    @property
    def holds_pinned_prefixes(self) -> bool:
        return self.base.holds_pinned_prefixes

    @property
    def pid(self) -> int | None:
        return self.base.pid

    def apply_chat_template(
        self, messages: Sequence[ChatMessageDict], tools: Sequence[ChatMessageDict] | None = None
    ) -> list[int]:
        return self.base.apply_chat_template(messages, tools)

    def generate(
        self,
        prompt: str | Sequence[int],
        params: SamplingParams,
        request_id: str,
        *,
        priority: int = 0,
        lora: LoRARequest | None = None,
    ) -> AsyncIterator[RequestOutput]:
        return self.base.generate(prompt, params, request_id, priority=priority, lora=self.lora)

    async def abort(self, request_id: str) -> None:
        await self.base.abort(request_id)

    async def drop_loras(self, names: list[str]) -> None:
        await self.base.drop_loras(names)

    def stats(self) -> SchedulerStats:
        return self.base.stats()

    @property
    def is_alive(self) -> bool:
        return self.base.is_alive

    async def shutdown(self) -> None:
        """The base engine outlives its adapters: nothing to do."""
