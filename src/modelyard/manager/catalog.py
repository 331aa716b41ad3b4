"""The catalog: which models exist, where their weights come from, and how to serve them.

`load_catalog(path)` reads a YAML or JSON file (None = the embedded default catalog,
`default_catalog.yaml` next to this module). Two shapes load:

- ours: `{"models": [ModelSpec fields...]}` (or a bare list of them);
- the textbook's `models.json`: a list of `{id, name, type, framework, version, description}`
  (type -> kind, framework -> backend).

A source is a local folder or file, `package:<python package>/<file inside it>`, or a
package-provided model key (e.g. `efficientnet-lite0`). Sources come from the operator's catalog
only; nothing a request sends is ever used as a path.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from modelyard.manager.base import ModelKind, ModelNotFoundError

DEFAULT_CATALOG_PATH = Path(__file__).with_name("default_catalog.yaml")

# The textbook's `type` / `framework` words, mapped to our kinds and backends.
_TEXTBOOK_KINDS = {
    "text-classification": ModelKind.TEXT_CLASSIFICATION,
    "sentiment-analysis": ModelKind.TEXT_CLASSIFICATION,
    "classification": ModelKind.TEXT_CLASSIFICATION,
    "image-classification": ModelKind.IMAGE_CLASSIFICATION,
    "embedding": ModelKind.EMBEDDING,
    "feature-extraction": ModelKind.EMBEDDING,
    "zero-shot-classification": ModelKind.ZERO_SHOT_CLASSIFICATION,
    "text-generation": ModelKind.COMPLETION,
    "chat": ModelKind.CHAT,
    "tensor": ModelKind.TENSOR,
}
_TEXTBOOK_BACKENDS = {
    "transformers": "transformers",
    "huggingface": "transformers",
    "pytorch": "transformers",
    "torchvision": "torchvision",
    "onnx": "onnx",
    "onnxruntime": "onnx",
    "triton": "triton",
}


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


class Catalog:
    """The models a manager may load, looked up by id, name or alias."""

    def __init__(self, specs: list[ModelSpec]) -> None:
        self._specs: dict[str, ModelSpec] = {}
        self._names: dict[str, str] = {}
        for spec in specs:
            if spec.id in self._specs:
                raise ValueError(f"duplicate model id {spec.id!r}")
            self._specs[spec.id] = spec
        for spec in specs:
            for name in spec.names:
                owner = self._names.setdefault(name, spec.id)
                if owner != spec.id:
                    raise ValueError(f"name {name!r} used by both {owner!r} and {spec.id!r}")
        for spec in specs:
            self._specs[spec.id] = self._with_draft_source(spec)

    def _with_draft_source(self, spec: ModelSpec) -> ModelSpec:
        """An LLM whose `draft` option names another catalog LLM gets that model's source as
        the `draft_source` option (ngram and self need no model)."""
        draft = spec.options.get("draft")
        if draft is None or draft in ("ngram", "self") or not spec.kind.is_llm:
            return spec
        draft_spec = self._specs.get(self._names.get(str(draft), ""))
        if draft_spec is None or not draft_spec.kind.is_llm or draft_spec.id == spec.id:
            raise ValueError(f"{spec.id}: draft {draft!r} is not another LLM of the catalog")
        options = {**spec.options, "draft_source": draft_spec.source}
        return dataclasses.replace(spec, options=options)

    def resolve(self, name: str) -> ModelSpec:
        """The spec for an id, name or alias; ModelNotFoundError otherwise."""
        model_id = self._names.get(name)
        if model_id is None:
            raise ModelNotFoundError(f"model {name!r} not found")
        return self._specs[model_id]

    def __iter__(self) -> Iterator[ModelSpec]:
        return iter(self._specs.values())

    def __len__(self) -> int:
        return len(self._specs)

    def __contains__(self, name: object) -> bool:
        return name in self._names


def spec_from_dict(raw: Mapping[str, Any]) -> ModelSpec:
    """One entry of either catalog shape -> ModelSpec (ValueError on a bad entry)."""
    data = dict(raw)
    if "type" in data or "framework" in data:
        data = _from_textbook(data)
    unknown = set(data) - set(ModelSpec.__dataclass_fields__)
    if unknown:
        raise ValueError(f"{data.get('id')!r}: unknown catalog fields {sorted(unknown)}")
    try:
        data["kind"] = ModelKind(data.get("kind", ModelKind.TENSOR))
    except ValueError as exc:
        raise ValueError(f"{data.get('id')!r}: unknown kind {data.get('kind')!r}") from exc
    data["aliases"] = tuple(data.get("aliases") or ())
    data["batching"] = BatchingConfig(**(data.get("batching") or {}))
    data["options"] = dict(data.get("options") or {})
    if "id" in data:
        data["id"] = str(data["id"])
    if "version" in data:
        data["version"] = str(data["version"])
    return ModelSpec(**data)


def _from_textbook(data: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in data.items() if k not in ("type", "framework")}
    kind = str(data.get("type", "tensor")).lower()
    framework = str(data.get("framework", "transformers")).lower()
    out["kind"] = _TEXTBOOK_KINDS.get(kind, ModelKind.TENSOR)
    out["backend"] = _TEXTBOOK_BACKENDS.get(framework, framework)
    out.setdefault("source", data.get("name") or data.get("id"))
    return out


def parse_catalog(raw: Any) -> Catalog:
    """A parsed YAML/JSON document (either shape) -> Catalog."""
    entries = raw.get("models") if isinstance(raw, Mapping) else raw
    if not isinstance(entries, list):
        raise ValueError("a catalog is a list of models or a mapping with a 'models' list")
    return Catalog([spec_from_dict(entry) for entry in entries])


def load_catalog(path: str | None) -> Catalog:
    """Read a YAML or JSON catalog file; None = the embedded default catalog."""
    file = DEFAULT_CATALOG_PATH if path is None else Path(path)
    text = file.read_text(encoding="utf-8")
    raw = json.loads(text) if file.suffix == ".json" else yaml.safe_load(text)
    return parse_catalog(raw)


def package_dir(package: str) -> Path:
    """An installed package's folder, found without importing it (some packages import heavy
    dependencies in __init__)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {package!r} is not installed")
    return Path(next(iter(spec.submodule_search_locations)))


def resolve_source(source: str) -> Path:
    """`package:<pkg>/<file>` or a local path -> an existing path (FileNotFoundError if not)."""
    if source.startswith("package:"):
        package, _, inner = source.removeprefix("package:").partition("/")
        path = package_dir(package) / inner
    else:
        path = Path(os.path.expanduser(source))
    if not path.exists():
        raise FileNotFoundError(f"model source {source!r} does not exist ({path})")
    return path


def cache_dir() -> Path:
    """Where derived artifacts (ONNX exports) are cached: $MODELYARD_CACHE_DIR or
    ~/.cache/modelyard (the same root as the GGUF conversions)."""
    root = os.environ.get("MODELYARD_CACHE_DIR") or os.path.expanduser("~/.cache/modelyard")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path
