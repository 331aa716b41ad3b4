"""The catalog: which models exist, where their weights come from, and how to serve them.

`load_catalog(path)` reads a YAML or JSON file (None = the embedded default catalog,
`default_catalog.yaml` next to this module). Two shapes load:

- ours: `{"models": [ModelSpec fields...]}` (or a bare list of them);
- the textbook's `models.json`: a list of `{id, name, type, framework, version, description}`
  (type -> kind, framework -> backend).

An entry's fields are `modelyard.model_spec.ModelSpec`; its source is resolved by
`modelyard.sources` (or is a package-provided model key such as `efficientnet-lite0`). Its
`options` are parsed here, once, into the typed section of its kind (`spec.llm`, an
`EngineConfig`; `spec.backend_options`, per backend): a bad one is a ConfigError with the dotted
path of the entry, e.g. `catalog.models[2].options.kv_cache_bytes: must be >= 1, not 0`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from modelyard.config_parse import ConfigError, from_mapping
from modelyard.manager.base import ModelNotFoundError
from modelyard.model_spec import ModelKind, ModelSpec
from modelyard.sources import has_chat_template, resolve_source

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
        the `draft_source` option, and so its engine config (ngram and self need no model)."""
        draft = spec.options.get("draft")
        if not spec.kind.is_llm or spec.llm is not None or draft in (None, "ngram", "self"):
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


def spec_from_dict(raw: Mapping[str, Any], where: str = "catalog.models[0]") -> ModelSpec:
    """One entry of either catalog shape -> ModelSpec, its options typed (ConfigError, a
    ValueError, on a bad entry: `where` is its dotted path, the problem names its id)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(where, f"a catalog entry is a mapping, not {type(raw).__name__}")
    data = dict(raw)
    if "type" in data or "framework" in data:
        data = _from_textbook(data)
    try:
        return from_mapping(ModelSpec, data, where)
    except ConfigError as exc:
        raise ConfigError(exc.path, f"{exc.problem} (model {data.get('id')!r})") from None


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
    return Catalog(
        [spec_from_dict(entry, f"catalog.models[{i}]") for i, entry in enumerate(entries)]
    )


def load_catalog(path: str | None) -> Catalog:
    """Read a YAML or JSON catalog file; None = the embedded default catalog."""
    file = DEFAULT_CATALOG_PATH if path is None else Path(path)
    text = file.read_text(encoding="utf-8")
    raw = json.loads(text) if file.suffix == ".json" else yaml.safe_load(text)
    return parse_catalog(raw)


def serving_catalog(path: str | None, overrides: Mapping[str, Any], *, preload: bool) -> Catalog:
    """The catalog with engine `overrides` applied to every LLM (and preload cleared if asked)."""
    specs = []
    for spec in load_catalog(path):
        changes: dict[str, Any] = {}
        if spec.kind.is_llm and overrides:
            changes["options"] = {**dict(spec.options), **overrides}
        if not preload:
            changes["preload"] = False
        specs.append(dataclasses.replace(spec, **changes) if changes else spec)
    return Catalog(specs)


def single_model_catalog(
    source: str, overrides: Mapping[str, Any], *, name: str | None, preload: bool
) -> Catalog:
    """A catalog of one LLM (`modelyard serve PATH`): id `name`, else the source's stem; kind
    chat when its tokenizer has a chat template, else completion; engine `overrides` applied.
    The path comes from the operator's command line: requests name the model by id only."""
    path = resolve_source(source)
    entry = {
        "id": name or path.stem,
        "kind": ModelKind.CHAT if has_chat_template(path) else ModelKind.COMPLETION,
        "backend": "llm",
        "source": str(path.resolve()),
        "preload": preload,
        "options": dict(overrides),
    }
    return Catalog([spec_from_dict(entry, "model")])
