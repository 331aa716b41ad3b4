"""What one catalog entry says about a model: its kind, where its weights come from, how it is
served. A leaf module: the manager (control plane), the backends (inside worker processes) and the
API routes all read these types, and it imports none of them (only the config types: config_parse,
engine.config, backends.options).

An entry's `options` are parsed once, when the spec is built, into the typed section of its kind:
an LLM's `llm` (its whole `EngineConfig`), any other model's `backend_options` (the dataclass of
its backend, `backends.options`). Nothing reads `options` after that."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from modelyard.backends.options import options_class
from modelyard.config_parse import ConfigError, check_fields, from_mapping, setting
from modelyard.engine.config import EngineConfig


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

    max_batch_size: int = setting(8, ge=1)  # most items joined into one backend call
    # longest an item waits for others to join its batch
    max_queue_delay_ms: float = setting(5.0, ge=0)

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True, kw_only=True)
class ScalingConfig:
    """Replicas of this model when it runs on Ray Serve (`modelyard serve --ray`); single-node
    mode ignores it. With `max_replicas` set the deployment autoscales between `min_replicas`
    and `max_replicas` on ongoing requests per replica; otherwise it runs `num_replicas`."""

    num_replicas: int = setting(1, ge=1)  # fixed replica count (no autoscaling)
    min_replicas: int = setting(1, ge=0)  # autoscaling floor
    max_replicas: int | None = setting(None, ge=1)  # autoscaling ceiling (None: no autoscaling)
    target_ongoing_requests: float = setting(8.0, gt=0)  # autoscaling target per replica
    max_ongoing_requests: int = setting(64, ge=1)  # a replica accepts at most this many at once
    num_cpus: float = setting(1.0, ge=0)  # CPUs Ray reserves per replica
    # load above (below) target this long before a replica is added (removed)
    upscale_delay_s: float = setting(30.0, ge=0)
    downscale_delay_s: float = setting(600.0, ge=0)

    def __post_init__(self) -> None:
        check_fields(self)
        if self.max_replicas is not None and self.max_replicas < self.min_replicas:
            raise ConfigError("max_replicas", "must be >= min_replicas")


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
    # overrides the estimate from the source's size
    memory_estimate_bytes: int | None = setting(None, ge=1)
    pin: bool = False  # never evicted (and loaded at start)
    # unload after this long idle (None = manager default)
    keep_alive_s: float | None = setting(None, gt=0)
    batching: BatchingConfig = setting(factory=BatchingConfig)  # dynamic batching
    preload: bool = False  # load at manager start (the server reports ready after)
    # backend / engine options as the catalog writes them; parsed into `llm` / `backend_options`
    options: Mapping[str, Any] = setting(factory=dict)
    scaling: ScalingConfig = setting(factory=ScalingConfig)  # replicas on Ray Serve
    # an LLM's engine config, from its source and options (None for other kinds, for an LLM
    # without a source, and for one whose `draft` names another catalog model until the catalog
    # resolves it)
    llm: EngineConfig | None = field(default=None, init=False)
    # any other kind's options: the dataclass of its backend (backends.options; None for LLMs)
    backend_options: Any = field(default=None, init=False)

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.id or "/" in self.id or self.id.strip() != self.id:
            raise ConfigError("id", f"must be non-empty, without '/' or spaces: {self.id!r}")
        if not self.name:
            object.__setattr__(self, "name", self.id)
        if self.kind.is_llm:
            object.__setattr__(self, "llm", _engine_config(self.source, self.options))
        else:
            parsed: object = from_mapping(options_class(self.backend), self.options, "options")
            object.__setattr__(self, "backend_options", parsed)

    @property
    def names(self) -> tuple[str, ...]:
        """Every name a request may use for this model."""
        return (self.id, self.name, *self.aliases)


def _engine_config(source: str, options: Mapping[str, Any]) -> EngineConfig | None:
    """An LLM entry's engine config; None without a source (nothing to load: the loader refuses
    it), or while its `draft` names a catalog model whose source the catalog has not filled in
    (as `draft_source`) yet."""
    draft = options.get("draft")
    if not source or (draft not in (None, "ngram", "self") and "draft_source" not in options):
        return None
    return EngineConfig.from_options(source, options, "options")
