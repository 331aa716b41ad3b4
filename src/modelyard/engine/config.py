"""Configuration of one LLM engine: small frozen dataclasses, one per component.

Each component receives only its own config. Validation raises ValueError (never assert).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Dtype = Literal["float32", "bfloat16"]
Implementation = Literal["auto", "native", "generic"]
SpecMethod = Literal["ngram", "draft", "self_draft"]


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    model: str
    """A local HF folder (config.json + safetensors), a .gguf file, or
    `package:<python package>/<file inside it>` (resolved by runner.loader)."""
    dtype: Dtype = "float32"
    max_model_len: int | None = None
    """Context length; None takes the model's own (capped at 8192 on CPU)."""
    implementation: Implementation = "auto"
    """native = our paged Llama-family forward; generic = any AutoModelForCausalLM (slower);
    auto = native when the architecture is supported."""
    num_threads: int | None = None
    """torch intra-op threads in the worker; None keeps torch's default (all cores)."""
    device: str = "cpu"

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model must not be empty")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"dtype must be float32 or bfloat16, got {self.dtype!r}")
        if self.max_model_len is not None and self.max_model_len < 16:
            raise ValueError("max_model_len must be >= 16")
        if self.implementation not in ("auto", "native", "generic"):
            raise ValueError(
                f"implementation must be auto, native or generic: {self.implementation!r}"
            )


@dataclass(frozen=True, kw_only=True)
class CacheConfig:
    block_size: int = 16
    """Tokens per KV block."""
    kv_cache_bytes: int = 512 * 1024**2
    """Memory for the KV cache; the runner turns it into a number of blocks for the model."""
    num_blocks: int | None = None
    """Overrides kv_cache_bytes (tests use tiny values to force preemption)."""
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ValueError("block_size must be a positive power of two")
        if self.kv_cache_bytes <= 0:
            raise ValueError("kv_cache_bytes must be positive")
        if self.num_blocks is not None and self.num_blocks < 1:
            raise ValueError("num_blocks must be >= 1")


@dataclass(frozen=True, kw_only=True)
class SchedulerConfig:
    max_num_seqs: int = 64
    """Most requests running in one step."""
    max_num_batched_tokens: int = 2048
    """Token budget per step (decodes count one each; prefill chunks fill the rest)."""
    enable_chunked_prefill: bool = True

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be >= 1")


@dataclass(frozen=True, kw_only=True)
class SpeculativeConfig:
    """Speculative decoding of one model (engine.spec_decode states the policy)."""

    method: SpecMethod
    """ngram = prompt lookup (no model); draft = a second model sharing the tokenizer;
    self_draft = the target's own first `draft_layers` layers and its head."""
    num_speculative_tokens: int = 4
    """Most tokens proposed per request and step (k)."""
    draft_model: str | None = None
    """method=draft: the draft's weights (a ModelConfig.model source)."""
    draft_layers: int = 8
    """method=self_draft: how many of the target's layers the draft runs."""
    prompt_lookup_min: int = 2
    """method=ngram: shortest suffix n-gram matched against the earlier tokens."""
    prompt_lookup_max: int = 4
    """method=ngram: longest suffix n-gram tried first."""
    long_output_tokens: int = 64
    """A request speculates by default when its max_tokens is None or at least this (the
    request's `speculate` overrides)."""
    disable_by_batch_size: int = 8
    """No request speculates in a step that starts with more running requests than this."""

    def __post_init__(self) -> None:
        if self.method not in ("ngram", "draft", "self_draft"):
            raise ValueError(
                f"speculative method must be ngram, draft or self_draft, not {self.method}"
            )
        if self.num_speculative_tokens < 1:
            raise ValueError("num_speculative_tokens must be >= 1")
        if self.method == "draft" and not self.draft_model:
            raise ValueError("speculative method 'draft' needs draft_model")
        if self.draft_layers < 1:
            raise ValueError("draft_layers must be >= 1")
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError("need 1 <= prompt_lookup_min <= prompt_lookup_max")
        if self.long_output_tokens < 0:
            raise ValueError("long_output_tokens must be >= 0")
        if self.disable_by_batch_size < 1:
            raise ValueError("disable_by_batch_size must be >= 1")


@dataclass(frozen=True, kw_only=True)
class LoRAConfig:
    """Serving LoRA adapters on this model (runner.lora states the mechanism)."""

    max_loras: int = 4
    """Most different adapters in one step (each has a slot in the stacked LoRA weights)."""
    max_lora_rank: int = 16
    """Largest rank an adapter may have (the width of a slot)."""
    max_cpu_loras: int = 16
    """Most adapters kept loaded in memory (least recently used ones are dropped)."""
    max_cpu_lora_bytes: int = 1024**3
    """Memory for the loaded adapters' weights; least recently used ones are dropped first."""

    def __post_init__(self) -> None:
        if self.max_loras < 1:
            raise ValueError("max_loras must be >= 1")
        if self.max_lora_rank < 1:
            raise ValueError("max_lora_rank must be >= 1")
        if self.max_cpu_loras < self.max_loras:
            raise ValueError("max_cpu_loras must be >= max_loras")
        if self.max_cpu_lora_bytes < 1:
            raise ValueError("max_cpu_lora_bytes must be positive")


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    model: ModelConfig
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    speculative: SpeculativeConfig | None = None
    """None: no speculative decoding."""
    lora: LoRAConfig | None = None
    """None: requests may not name a LoRA adapter."""
