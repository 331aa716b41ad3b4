"""The LoRA adapters this server knows: adapter name -> base model, PEFT folder, registration.

An adapter is addressed like a model: its name is a model id (listed by /v1/models with its base
as `parent`, as vLLM lists them, and on allow-lists by that name), a route target, a tenant
override's target. `AdapterProvider` wraps the model provider the request path leases from: a
lease of an adapter leases its BASE model and hands out the base's engine with the adapter set
on every request (`LoRARequest` in the engine request); the engine loads the adapter's weights
from the folder on first use, so the registry survives the base model being unloaded and
reloaded.

Adapters come from the catalog (`lora_modules: {name: folder}` on an LLM entry) and from the
admin-only `POST /v1/load_lora_adapter` (api.routes.lora). The folder is never a client's
choice outside those admin calls, and there `check_adapter` keeps it under `server.lora_root`
(when set) and reads it as the engine will before it is registered.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from modelyard.engine.client.protocol import (
    LLMClient,
    LoRAClient,
    RequestOutput,
    Tokenizer,
    serves_lora,
)
from modelyard.engine.messages import LoRARequest, SchedulerStats
from modelyard.engine.sampling_params import SamplingParams
from modelyard.manager.base import Lease, ModelLoadError, ModelProvider, Predictor
from modelyard.model_spec import ModelKind, ModelSpec


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


def check_adapter(name: str, path: str, root: str | None, base: ModelSpec, max_rank: int) -> Path:
    """The folder `path` names, resolved (symlinks and `..`), once it is known to lie under
    `root` (server.lora_root, when set) and to hold an adapter that fits the base model, read as
    the engine will (runner.lora.adapter). ValueError naming what is wrong; ModelLoadError when
    the base's own config cannot be read. Blocking: run it in a thread."""
    import torch

    from modelyard.runner.loader import resolve_model
    from modelyard.runner.lora.adapter import BaseShapes, adapter_files, read_adapter

    folder = adapter_folder(path, root)
    adapter_files(folder, name)  # before the base: a folder without them is the request's fault
    try:
        config = resolve_model(base.source).config
    except (ValueError, OSError) as exc:
        raise ModelLoadError(f"{base.id}: its config cannot be read: {exc}") from exc
    lora = LoRARequest(name=name, path=str(folder), adapter_id=0)
    read_adapter(lora, BaseShapes.of(config), max_rank, torch.float32)
    return folder


def adapter_folder(path: str, root: str | None) -> Path:
    """`path` resolved; with a `root`, the folder and its adapter files must resolve inside it
    (ValueError otherwise)."""
    from modelyard.runner.lora.adapter import ADAPTER_FILES

    if not path:
        raise ValueError("lora_path must not be empty")
    try:
        folder = Path(path).resolve()
        inside = root is None or all(
            file.resolve().is_relative_to(Path(root).resolve())
            for file in (folder, *(folder / name for name in ADAPTER_FILES))
        )
    except (OSError, RuntimeError, ValueError) as exc:  # a symlink loop, a NUL byte...
        raise ValueError(f"lora_path {path!r} cannot be resolved: {exc}") from exc
    if not inside:
        raise ValueError(f"lora_path {path!r} lies outside the server's lora_root {root!r}")
    return folder


class AdapterProvider:
    """The model provider, with every registered adapter as a model of its own (see the module
    docstring); anything else goes to the wrapped provider."""

    def __init__(self, provider: ModelProvider, registry: LoRARegistry) -> None:
        self.provider = provider
        self.registry = registry

    @asynccontextmanager
    async def lease(self, name: str) -> AsyncIterator[Lease]:
        adapter = self.registry.get(name)
        if adapter is None:
            async with self.provider.lease(name) as lease:
                yield lease
            return
        async with self.provider.lease(adapter.base) as lease:
            yield AdapterLease(adapter, lease)

    def spec(self, name: str) -> ModelSpec:
        """An adapter's entry is its base's, under the adapter's name (ModelNotFoundError for
        names neither knows)."""
        adapter = self.registry.get(name)
        if adapter is None:
            return self.provider.spec(name)
        base = self.provider.spec(adapter.base)
        return dataclasses.replace(base, id=name, name=name, aliases=(), pin=False, preload=False)

    def describe(self) -> dict[str, Any]:
        return self.provider.describe()

    async def close(self) -> None:
        await self.provider.close()


class AdapterLease:
    """A lease of an adapter: the base model's lease, its engine running the adapter."""

    def __init__(self, adapter: Adapter, base: Lease) -> None:
        self.adapter = adapter
        self.base = base

    @property
    def model_id(self) -> str:
        return self.adapter.lora.name

    @property
    def kind(self) -> ModelKind:
        return self.base.kind

    @property
    def llm(self) -> LLMClient:
        llm = self.base.llm
        if not serves_lora(llm):
            raise ModelLoadError(f"{self.adapter.base} runs on an engine without LoRA adapters")
        return AdapterClient(cast(LoRAClient, llm), self.adapter.lora)

    @property
    def predictor(self) -> Predictor:
        raise TypeError(f"{self.model_id} is a LoRA adapter of an LLM")

    @property
    def metadata(self) -> dict[str, Any]:
        return {}


class AdapterClient:
    """An engine client whose requests all run with one adapter."""

    def __init__(self, llm: LoRAClient, lora: LoRARequest) -> None:
        self.base = llm
        self.lora = lora

    @property
    def model_name(self) -> str:
        return self.lora.name

    @property
    def max_model_len(self) -> int:
        return self.base.max_model_len

    @property
    def tokenizer(self) -> Tokenizer:
        return self.base.tokenizer

    def apply_chat_template(self, messages: Sequence[dict[str, str]]) -> list[int]:
        return self.base.apply_chat_template(messages)

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
