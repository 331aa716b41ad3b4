"""What one catalog entry says about a model: its kind, where its weights come from, how it is
served. A leaf module: the manager (control plane), the backends (inside worker processes) and the
API routes all read these types, and it imports none of them."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class ModelKind(enum.StrEnum):
    CHAT = "chat"  # LLM with a chat template (/v1/chat/completions and /v1/completions)
    COMPLETION = "completion"  # LLM without a chat template (/v1/completions)
    EMBEDDING = "embedding"
    TEXT_CLASSIFICATION = "text-classification"
    ZERO_SHOT_CLASSIFICATION = "zero-shot-classification"
    IMAGE_CLASSIFICATION = "image-classification"
    TENSOR = "tensor"  # generic named tensors in and out (ONNX, Triton)

    @property
    def is_llm(self) -> bool:
        return self in (ModelKind.CHAT, ModelKind.COMPLETION)


@dataclass(frozen=True, kw_only=True)
class BatchingConfig:
    """Dynamic batching of a non-LLM model's requests inside its worker."""

    max_batch_size: int = 8  # most items joined into one backend call
    max_queue_delay_ms: float = 5.0  # longest an item waits for others to join its batch

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError("max_batch_size must be >= 1")
        if self.max_queue_delay_ms < 0:
            raise ValueError("max_queue_delay_ms must be >= 0")


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """One catalog entry."""

    id: str  # unique, URL-safe identifier (what /predict's model_id and /v2/models/{name} use)
    name: str = ""  # human-readable name, also accepted in requests ("" = the id)
    aliases: tuple[str, ...] = ()  # other names accepted in requests
    kind: ModelKind = ModelKind.TENSOR  # what the model does; fixes the request/response shape
    backend: str = "transformers"  # which backend serves it (backends.create_backend picks it)
    source: str = ""  # local folder/file, GGUF file, `package:<pkg>/<file>`, or a model key
    version: str = "1"  # reported by /models and the KServe metadata
    description: str = ""  # free text for /models
    memory_estimate_bytes: int | None = None  # overrides the estimate from the source's size
    pin: bool = False  # never evicted (and loaded at start)
    keep_alive_s: float | None = None  # unload after this long idle (None = manager default)
    batching: BatchingConfig = field(default_factory=BatchingConfig)  # dynamic batching
    preload: bool = False  # load at manager start (the server reports ready after)
    options: Mapping[str, Any] = field(default_factory=dict)  # backend / engine options

    def __post_init__(self) -> None:
        if not self.id or "/" in self.id or self.id.strip() != self.id:
            raise ValueError(f"model id must be non-empty, without '/' or spaces: {self.id!r}")
        if not self.name:
            object.__setattr__(self, "name", self.id)
        if self.memory_estimate_bytes is not None and self.memory_estimate_bytes <= 0:
            raise ValueError(f"{self.id}: memory_estimate_bytes must be positive")
        if self.keep_alive_s is not None and self.keep_alive_s <= 0:
            raise ValueError(f"{self.id}: keep_alive_s must be positive")

    @property
    def names(self) -> tuple[str, ...]:
        """Every name a request may use for this model."""
        return (self.id, self.name, *self.aliases)
