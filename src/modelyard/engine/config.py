"""Configuration of one LLM engine: small frozen dataclasses, one per component.

Each component receives only its own config. Limits are declared on the fields and checked on
construction (config_parse.check_fields): ValueError, never assert. `EngineConfig.from_options`
is the one way from flat options (a catalog entry's `options`, `modelyard.LLM(...)` keywords) to
an EngineConfig, so every default lives here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from modelyard.config_parse import ConfigError, check_fields, from_mapping, setting

Dtype = Literal["float32", "bfloat16"]
Implementation = Literal["auto", "native", "generic"]


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    model: str
    """A local HF folder (config.json + safetensors), a .gguf file, or
    `package:<python package>/<file inside it>` (resolved by runner.loader)."""
    dtype: Dtype = "float32"
    max_model_len: int | None = setting(None, ge=16)
    """Context length; None takes the model's own (capped at 8192 on CPU)."""
    implementation: Implementation = "auto"
    """native = our paged Llama-family forward; generic = any AutoModelForCausalLM (slower);
    auto = native when the architecture is supported."""
    num_threads: int | None = setting(None, ge=1)
    """torch intra-op threads in the worker; None keeps torch's default (all cores)."""

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.model:
            raise ConfigError("model", "must not be empty")


@dataclass(frozen=True, kw_only=True)
class CacheConfig:
    block_size: int = setting(16, ge=1)
    """Tokens per KV block (a power of two)."""
    kv_cache_bytes: int = setting(512 * 1024**2, ge=1)
    """Memory for the KV cache; the runner turns it into a number of blocks for the model."""
    num_blocks: int | None = setting(None, ge=1)
    """Overrides kv_cache_bytes (tests use tiny values to force preemption)."""
    enable_prefix_caching: bool = True
    max_pinned_fraction: float = 0.5
    """Most of the KV cache that pinned prefixes (engine/pins.py) may hold together."""

    def __post_init__(self) -> None:
        check_fields(self)
        if self.block_size & (self.block_size - 1):
            raise ConfigError("block_size", "must be a power of two")
        if not 0.0 <= self.max_pinned_fraction < 1.0:
            raise ConfigError("max_pinned_fraction", "must be in [0, 1)")


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    max_num_seqs: int = setting(64, ge=1)
    """Most requests running in one step."""
    max_num_batched_tokens: int = setting(2048, ge=1)
    """Token budget per step (decodes count one each; prefill chunks fill the rest)."""
    enable_chunked_prefill: bool = True

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True, kw_only=True)
class AdmissionConfig:
    """The bounded waiting queue in the API process, in front of the engine (AsyncLLM)."""

    max_waiting_requests: int = setting(256, ge=1)
    """Calls accepted and not yet scheduled; more get EngineOverloadedError (429)."""
    max_waiting_prompt_tokens: int = setting(256 * 1024, ge=1)
    """Their prompt tokens together."""

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    model: ModelConfig
    cache: CacheConfig = setting(factory=CacheConfig)
    scheduler: SchedulerConfig = setting(factory=SchedulerConfig)
    admission: AdmissionConfig = setting(factory=AdmissionConfig)

    @classmethod
    def from_options(
        cls, model: str, options: Mapping[str, Any], where: str = "engine options"
    ) -> EngineConfig:
        """Flat options (`dtype`, `kv_cache_bytes`, `max_num_seqs`, ...: any field of the four
        sections) sorted into their sections; ConfigError for an unknown or invalid one."""
        sections = {
            "cache": CacheConfig,
            "scheduler": SchedulerConfig,
            "admission": AdmissionConfig,
        }
        owner = {f.name: name for name, c in sections.items() for f in fields(c)}
        owner.update({f.name: "model" for f in fields(ModelConfig) if f.name != "model"})
        unknown = sorted(set(options) - set(owner))
        if unknown:
            raise ConfigError(where, f"unknown key(s) {unknown} (known: {sorted(owner)})")
        parts: dict[str, dict[str, Any]] = {name: {} for name in ("model", *sections)}
        for key, value in options.items():
            parts[owner[key]][key] = value
        return cls(
            model=from_mapping(ModelConfig, {"model": model, **parts["model"]}, where),
            **{name: from_mapping(c, parts[name], where) for name, c in sections.items()},
        )
