"""Configuration of one LLM engine: small frozen dataclasses, one per component.

Each component receives only its own config. Limits are declared on the fields and checked on
construction (config_parse.check_fields): ValueError, never assert. `EngineConfig.from_options`
is the one way from flat options (a catalog entry's `options`, `modelyard.LLM(...)` keywords) to
an EngineConfig, so every default lives here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from modelyard.cache_dir import cache_dir_from_environment
from modelyard.config_parse import ConfigError, check_fields, from_mapping, setting
from modelyard.runner.kernel_config import KernelConfig

Dtype = Literal["float32", "bfloat16"]
Implementation = Literal["auto", "native", "generic"]
Switch = Literal["auto", "on", "off"]
SpecMethod = Literal["ngram", "draft", "self_draft"]


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
    gguf_blocks: Switch = "auto"
    """on: a model given as a GGUF file keeps the file's quantized blocks for its linear
    layers instead of its float32 conversion's weights (runner.gguf_weights); auto: as
    MODELYARD_WEIGHTS says (gguf: on)."""
    cache_dir: str = setting(factory=cache_dir_from_environment)
    """Where a GGUF file's conversion goes (under converted/): by default MODELYARD_CACHE_DIR,
    else ~/.cache/modelyard, read when the config is built (modelyard.cache_dir)."""

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
    """Most of the KV cache that pinned prefixes (engine/core/prefixes.py) may hold together."""

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
class SpeculativeConfig:
    """Speculative decoding of one model (engine.core.spec_decode states the policy)."""

    method: SpecMethod
    """ngram = prompt lookup (no model); draft = a second model sharing the tokenizer;
    self_draft = the target's own first `draft_layers` layers and its head."""
    num_speculative_tokens: int = setting(4, ge=1)
    """Most tokens proposed per request and step (k)."""
    draft_model: str | None = None
    """method=draft: the draft's weights (a ModelConfig.model source)."""
    draft_layers: int = setting(8, ge=1)
    """method=self_draft: how many of the target's layers the draft runs."""
    prompt_lookup_min: int = setting(2, ge=1)
    """method=ngram: shortest suffix n-gram matched against the earlier tokens."""
    prompt_lookup_max: int = setting(4, ge=1)
    """method=ngram: longest suffix n-gram tried first."""
    long_output_tokens: int = setting(64, ge=0)
    """A request speculates by default when its max_tokens is None or at least this (the
    request's `speculate` overrides)."""
    disable_by_batch_size: int = setting(8, ge=1)
    """No request speculates in a step that starts with more running requests than this."""
    adaptive: bool = True
    """Each request's k follows how much of its drafts the target accepts (engine.core.spec_decode,
    rule 5); False: every draft may take num_speculative_tokens."""

    def __post_init__(self) -> None:
        check_fields(self)
        if self.method == "draft" and not self.draft_model:
            raise ConfigError("draft_model", "is needed by the speculative method 'draft'")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ConfigError("prompt_lookup_min", "must be <= prompt_lookup_max")

    @classmethod
    def from_options(cls, options: Mapping[str, Any], where: str) -> SpeculativeConfig | None:
        """The catalog's flat speculative options (`SPECULATIVE_OPTIONS`): None without
        `draft`. `draft` is ngram, self, or another catalog LLM (whose source the catalog put
        in `draft_source`)."""
        draft = options.get("draft")
        if draft is None:
            return None
        method: SpecMethod = {"ngram": "ngram", "self": "self_draft"}.get(str(draft), "draft")  # type: ignore[assignment]
        if method == "draft" and "draft_source" not in options:
            raise ConfigError(f"{where}.draft", f"{draft!r} is not a catalog LLM")
        values = {
            field: options[key] for key, field in SPECULATIVE_OPTIONS.items() if key in options
        }
        values["method"] = method
        values["draft_model"] = options.get("draft_source") if method == "draft" else None
        return from_mapping(cls, values, where)


#: catalog option -> SpeculativeConfig field (`draft` and `draft_source` are read separately)
SPECULATIVE_OPTIONS = {
    "num_speculative_tokens": "num_speculative_tokens",
    "draft_layers": "draft_layers",
    "prompt_lookup_min": "prompt_lookup_min",
    "prompt_lookup_max": "prompt_lookup_max",
    "speculative_long_output_tokens": "long_output_tokens",
    "speculative_disable_by_batch_size": "disable_by_batch_size",
    "speculative_adaptive": "adaptive",
}


@dataclass(frozen=True, kw_only=True)
class LoRAConfig:
    """Serving LoRA adapters on this model (runner.lora.manager states the mechanism)."""

    max_loras: int = setting(4, ge=1)
    """Most different adapters in one step (each has a slot in the stacked LoRA weights)."""
    max_lora_rank: int = setting(16, ge=1)
    """Largest rank an adapter may have (the width of a slot)."""
    max_cpu_loras: int = setting(16, ge=1)
    """Most adapters kept loaded in memory (least recently used ones are dropped)."""
    max_cpu_lora_bytes: int = setting(1024**3, ge=1)
    """Memory for the loaded adapters' weights; least recently used ones are dropped first."""
    modules: Mapping[str, str] = setting(factory=dict, key="lora_modules")
    """The adapters the catalog declares ({adapter name: PEFT folder}); the API process
    registers them, the runner loads each on its first request."""

    def __post_init__(self) -> None:
        check_fields(self)
        if self.max_cpu_loras < self.max_loras:
            raise ConfigError("max_cpu_loras", "must be >= max_loras")

    @classmethod
    def from_options(cls, options: Mapping[str, Any], where: str) -> LoRAConfig | None:
        """The catalog's flat LoRA options (`LORA_OPTIONS`): None when there is none."""
        if not any(key in options for key in LORA_OPTIONS):
            return None
        return from_mapping(cls, {k: v for k, v in options.items() if k in LORA_OPTIONS}, where)


#: catalog options that turn LoRA on (LoRAConfig's fields; `lora_modules` is its `modules`)
LORA_OPTIONS = ("lora_modules", "max_loras", "max_lora_rank", "max_cpu_loras", "max_cpu_lora_bytes")
_EXTENSION_OPTIONS = frozenset({"draft", "draft_source", *SPECULATIVE_OPTIONS, *LORA_OPTIONS})


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    model: ModelConfig
    cache: CacheConfig = setting(factory=CacheConfig)
    scheduler: SchedulerConfig = setting(factory=SchedulerConfig)
    admission: AdmissionConfig = setting(factory=AdmissionConfig)
    speculative: SpeculativeConfig | None = None
    """None: no speculative decoding."""
    lora: LoRAConfig | None = None
    """None: requests may not name a LoRA adapter."""
    kernels: KernelConfig = setting(factory=lambda: kernels_from_environment())
    """The runner's kernel switches and instruction-set kind (runner.kernel_config), read from
    the `MODELYARD_*` environment of the process that builds this config, then carried to the
    engine worker: nothing below reads the environment."""

    @classmethod
    def from_options(
        cls,
        model: str,
        options: Mapping[str, Any],
        where: str = "engine options",
        kernels: KernelConfig | None = None,
    ) -> EngineConfig:
        """Flat options (`dtype`, `kv_cache_bytes`, `max_num_seqs`, ...: any field of the four
        sections, and the speculative and LoRA options) sorted into their sections;
        ConfigError for an unknown or invalid one."""
        sections = {
            "cache": CacheConfig,
            "scheduler": SchedulerConfig,
            "admission": AdmissionConfig,
        }
        owner = {f.name: name for name, c in sections.items() for f in fields(c)}
        owner.update({f.name: "model" for f in fields(ModelConfig) if f.name != "model"})
        unknown = sorted(set(options) - set(owner) - _EXTENSION_OPTIONS)
        if unknown:
            known = sorted({*owner, *_EXTENSION_OPTIONS} - {"draft_source"})
            raise ConfigError(where, f"unknown key(s) {unknown} (known: {known})")
        parts: dict[str, dict[str, Any]] = {name: {} for name in ("model", *sections)}
        for key, value in options.items():
            if key in owner:
                parts[owner[key]][key] = value
        return cls(
            model=from_mapping(ModelConfig, {"model": model, **parts["model"]}, where),
            **{name: from_mapping(c, parts[name], where) for name, c in sections.items()},
            speculative=SpeculativeConfig.from_options(options, where),
            lora=LoRAConfig.from_options(options, where),
            kernels=kernels_from_environment() if kernels is None else kernels,
        )


def kernels_from_environment() -> KernelConfig:
    """The runner's kernel switches from this process's `MODELYARD_*` environment
    (runner.kernel_config lists them): the one place they are read."""
    return KernelConfig.from_env(os.environ)
