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

from modelyard.engine.protocol import LLMClient
from modelyard.manager.base import ModelKind, ModelLoadError, Predictor
from modelyard.manager.catalog import ModelSpec, resolve_source
from modelyard.manager.worker_process import WorkerProcess

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
        kv = int(spec.options.get("kv_cache_bytes", 512 * _MIB))
        factor = 6 if spec.source.endswith(".gguf") else 1
        draft = str(spec.options.get("draft_source", ""))
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
        pid = getattr(self.llm, "pid", None)
        return pid if isinstance(pid, int) else None

    @property
    def is_alive(self) -> bool:
        return bool(self.llm.is_alive)

    def memory_bytes(self) -> int | None:
        if self.pid is not None:
            try:
                return int(psutil.Process(self.pid).memory_info().rss)
            except psutil.Error:
                return None
        return None

    async def stop(self) -> None:
        await self.llm.shutdown()


# speculative decoding: `draft` turns it on (ngram | self | the id of another catalog LLM that
# shares the tokenizer; the catalog adds that model's source as `draft_source`)
_SPECULATIVE_OPTIONS = (
    "draft",
    "draft_source",
    "num_speculative_tokens",
    "draft_layers",
    "prompt_lookup_min",
    "prompt_lookup_max",
    "speculative_long_output_tokens",
    "speculative_disable_by_batch_size",
)
# LoRA adapters: any of these turns them on; lora_modules declares adapters {name: folder}
_LORA_OPTIONS = (
    "lora_modules",
    "max_loras",
    "max_lora_rank",
    "max_cpu_loras",
    "max_cpu_lora_bytes",
)
_ENGINE_OPTIONS = frozenset(
    {
        "dtype",
        "max_model_len",
        "implementation",
        "num_threads",
        "kv_cache_bytes",
        "num_blocks",
        "block_size",
        "enable_prefix_caching",
        "max_num_seqs",
        "max_num_batched_tokens",
        "max_waiting_requests",
        "max_waiting_prompt_tokens",
        *_SPECULATIVE_OPTIONS,
        *_LORA_OPTIONS,
    }
)


def engine_config_for(spec: ModelSpec) -> Any:
    """The engine options of an LLM catalog entry -> EngineConfig (ValueError if unknown)."""
    from modelyard.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig

    opts = spec.options
    unknown = sorted(set(opts) - _ENGINE_OPTIONS)
    if unknown:
        raise ValueError(
            f"{spec.id}: unknown engine options {unknown}; known: {sorted(_ENGINE_OPTIONS)}"
        )
    model = ModelConfig(
        model=spec.source,
        dtype=opts.get("dtype", "float32"),
        max_model_len=opts.get("max_model_len"),
        implementation=opts.get("implementation", "auto"),
        num_threads=opts.get("num_threads"),
    )
    cache = CacheConfig(
        kv_cache_bytes=int(opts.get("kv_cache_bytes", 512 * _MIB)),
        num_blocks=opts.get("num_blocks"),
        block_size=int(opts.get("block_size", 16)),
        enable_prefix_caching=bool(opts.get("enable_prefix_caching", True)),
    )
    scheduler = SchedulerConfig(
        max_num_seqs=int(opts.get("max_num_seqs", 64)),
        max_num_batched_tokens=int(opts.get("max_num_batched_tokens", 2048)),
    )
    return EngineConfig(
        model=model,
        cache=cache,
        scheduler=scheduler,
        speculative=speculative_config_for(spec),
        lora=lora_config_for(spec),
    )


def lora_config_for(spec: ModelSpec) -> Any:
    """The LoRA options of an LLM entry -> LoRAConfig, or None when it serves no adapters."""
    from modelyard.engine.config import LoRAConfig

    opts = spec.options
    if not any(key in opts for key in _LORA_OPTIONS):
        return None
    sizes = {key: int(opts[key]) for key in _LORA_OPTIONS[1:] if key in opts}
    return LoRAConfig(**sizes)


def lora_modules_of(spec: ModelSpec) -> dict[str, str]:
    """The adapters an LLM entry declares: {adapter name: PEFT folder}."""
    modules = spec.options.get("lora_modules") or {}
    if not isinstance(modules, dict):
        raise ValueError(f"{spec.id}: lora_modules must map adapter names to folders")
    return {str(name): str(path) for name, path in modules.items()}


def speculative_config_for(spec: ModelSpec) -> Any:
    """The `draft` options of an LLM entry -> SpeculativeConfig, or None without `draft`."""
    from modelyard.engine.config import SpecMethod, SpeculativeConfig

    opts = spec.options
    draft = opts.get("draft")
    if draft is None:
        return None
    methods: dict[str, SpecMethod] = {"ngram": "ngram", "self": "self_draft"}
    method = methods.get(str(draft), "draft")
    if method == "draft" and "draft_source" not in opts:
        raise ValueError(f"{spec.id}: draft {draft!r} is not a catalog model")
    renamed = {
        "num_speculative_tokens": "num_speculative_tokens",
        "draft_layers": "draft_layers",
        "prompt_lookup_min": "prompt_lookup_min",
        "prompt_lookup_max": "prompt_lookup_max",
        "speculative_long_output_tokens": "long_output_tokens",
        "speculative_disable_by_batch_size": "disable_by_batch_size",
    }
    values = {field: int(opts[key]) for key, field in renamed.items() if key in opts}
    source = opts.get("draft_source") if method == "draft" else None
    return SpeculativeConfig(method=method, draft_model=source, **values)


def admission_limits_for(spec: ModelSpec) -> dict[str, int]:
    """The API-side bounded waiting queue of an LLM entry (AsyncLLM.start keywords)."""
    return {
        key: int(spec.options[key])
        for key in ("max_waiting_requests", "max_waiting_prompt_tokens")
        if key in spec.options
    }


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
            async_llm = importlib.import_module("modelyard.engine.async_llm")
        except ImportError as exc:
            raise ModelLoadError(f"{spec.id}: the LLM engine is not available: {exc}") from exc
        llm = await async_llm.AsyncLLM.start(
            engine_config_for(spec), model_name=spec.id, **admission_limits_for(spec)
        )
        return LLMModel(llm=llm, metadata={}, kind=spec.kind)


def predictor_of(model: LoadedModel) -> Predictor:
    if isinstance(model, LLMModel):
        raise TypeError("an LLM has no predictor; use lease.llm")
    predictor: Predictor = model  # type: ignore[assignment]
    return predictor


__all__ = ["LLMModel", "LoadedModel", "ModelLoader", "ProcessLoader", "estimate_bytes"]
