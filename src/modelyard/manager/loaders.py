"""How the manager starts a model: `ModelLoader.load(spec) -> LoadedModel`.

`ProcessLoader` is the real one: a batcher worker process per non-LLM model
(worker_process.py), the engine (`AsyncLLM`, itself a worker process) per LLM. Unit tests pass
an in-process fake loader with the same shape. Memory estimates (used before a model is loaded;
replaced by the measured RSS after) are computed here too.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import psutil

from modelyard.engine.client.protocol import LLMClient
from modelyard.engine.config import EngineConfig
from modelyard.manager.base import ModelLoadError, Predictor
from modelyard.manager.worker_process import WorkerProcess
from modelyard.model_spec import ModelKind, ModelSpec
from modelyard.sources import resolve_source

_MIB = 1024 * 1024
WORKER_OVERHEAD_BYTES = 300 * _MIB  # a Python worker with torch/onnxruntime imported
_PACKAGED_SIZES = {"efficientnet-lite0": 18 * _MIB}  # package-provided model keys


class LoadedModel(Protocol):
    """A started model as the manager holds it."""

    @property
    def kind(self) -> ModelKind: ...

    @property
    def pid(self) -> int | None: ...

    @property
    def is_alive(self) -> bool: ...

    @property
    def holds_pins(self) -> bool:
        """An LLM engine holding pinned prefixes (the manager then keeps it resident)."""
        ...

    metadata: dict[str, Any]  # KServe-style tensor metadata ({} for LLMs)

    def memory_bytes(self) -> int | None:
        """Measured resident memory now; None when it cannot be measured."""
        ...

    async def stop(self) -> None: ...


class ModelLoader(Protocol):
    async def load(self, spec: ModelSpec) -> LoadedModel:
        """Start the model; raise (anything) when it cannot load."""
        ...


def _source_bytes(source: str) -> int:
    if source in _PACKAGED_SIZES:
        return _PACKAGED_SIZES[source]
    if not source:
        return 0  # no weights (a backend that builds its model); never the working directory
    try:
        path = resolve_source(source)
    except (FileNotFoundError, ValueError):
        return 0
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def estimate_bytes(spec: ModelSpec) -> int:
    """The catalog override, else a size-based guess: worker overhead + weights (LLM GGUF
    weights are dequantized to fp32, about 6x a Q4 file, plus the KV cache)."""
    if spec.memory_estimate_bytes is not None:
        return spec.memory_estimate_bytes
    weights = _source_bytes(spec.source)
    if spec.kind.is_llm:
        engine = engine_config_for(spec)
        kv = engine.cache.kv_cache_bytes
        factor = 6 if spec.source.endswith(".gguf") else 1
        speculative = engine.speculative
        draft = speculative.draft_model or "" if speculative is not None else ""
        draft_weights = _source_bytes(draft) * (6 if draft.endswith(".gguf") else 1) if draft else 0
        return WORKER_OVERHEAD_BYTES + weights * factor + draft_weights + kv
    return WORKER_OVERHEAD_BYTES + int(weights * 1.5)


def default_budget_bytes(fraction: float = 0.6) -> int:
    """fraction of the memory available now."""
    return int(psutil.virtual_memory().available * fraction)


@dataclass
class LLMModel:
    """An LLM engine held by the manager (the engine runs its own worker process)."""

    llm: LLMClient
    metadata: dict[str, Any]
    kind: ModelKind

    @property
    def pid(self) -> int | None:
        return self.llm.pid

    @property
    def is_alive(self) -> bool:
        return bool(self.llm.is_alive)

    @property
    def holds_pins(self) -> bool:
        """Pinned prefixes (CAG) live in this engine: evicting it would drop them."""
        return self.llm.holds_pinned_prefixes

    def memory_bytes(self) -> int | None:
        if self.pid is not None:
            try:
                return int(psutil.Process(self.pid).memory_info().rss)
            except psutil.Error:
                return None
        return None

    async def stop(self) -> None:
        await self.llm.shutdown()


def engine_config_for(spec: ModelSpec) -> EngineConfig:
    """An LLM catalog entry's engine config (typed when the spec was built)."""
    if spec.llm is None:
        raise ValueError(f"{spec.id}: not an LLM, or its draft model is not resolved by a catalog")
    return spec.llm


def lora_modules_of(spec: ModelSpec) -> dict[str, str]:
    """The LoRA adapters an LLM entry declares: {adapter name: PEFT folder}."""
    lora = spec.llm.lora if spec.llm is not None else None
    return dict(lora.modules) if lora is not None else {}


class ProcessLoader:
    """The real loader: a worker process per model."""

    def __init__(
        self,
        start_method: str = "forkserver",
        preload: tuple[str, ...] = (),
        ready_timeout_s: float = 300.0,
    ) -> None:
        self.start_method = start_method
        self.preload = preload
        self.ready_timeout_s = ready_timeout_s

    async def load(self, spec: ModelSpec) -> LoadedModel:
        if spec.kind.is_llm:
            return await self._load_llm(spec)
        return await WorkerProcess.start(
            spec,
            start_method=self.start_method,
            preload=self.preload,
            ready_timeout_s=self.ready_timeout_s,
        )

    async def _load_llm(self, spec: ModelSpec) -> LoadedModel:
        try:
            async_llm = importlib.import_module("modelyard.engine.client.async_llm")
        except ImportError as exc:
            raise ModelLoadError(f"{spec.id}: the LLM engine is not available: {exc}") from exc
        llm = await async_llm.AsyncLLM.start(engine_config_for(spec), model_name=spec.id)
        return LLMModel(llm=llm, metadata={}, kind=spec.kind)


def predictor_of(model: LoadedModel) -> Predictor:
    if isinstance(model, LLMModel):
        raise TypeError("an LLM has no predictor; use lease.llm")
    predictor: Predictor = model  # type: ignore[assignment]
    return predictor


__all__ = ["LLMModel", "LoadedModel", "ModelLoader", "ProcessLoader", "estimate_bytes"]
