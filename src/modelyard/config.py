"""The server's top-level configuration and its loader.

One YAML file (all sections optional) read by `load_config(path)`:

```yaml
server:        # ServerConfig: HTTP edge (this module)
  host: 127.0.0.1
  port: 8000
  request_timeout_s: 300
engine:        # EngineDefaults: engine limits applied to every LLM the manager loads
  dtype: float32
  max_num_seqs: 64
manager: {}    # passed as a mapping to the manager part (its own config parses it)
gateway: {}    # passed as a mapping to the gateway part (its own config parses it)
ray: {}        # passed as a mapping to `serve --ray` (scale/config.py parses it)
```

Config objects are frozen dataclasses validated with ValueError. Command-line options override
file values through `dataclasses.replace` (see api/cli.py); nothing below reads the environment.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

import yaml


@dataclass(frozen=True, kw_only=True)
class TextbookConfig:
    """Defaults of the textbook endpoints (/basic_generate, /generate, /generate_stream)."""

    model: str = "smollm2-135m-instruct"  # model (id or alias) they use
    max_tokens: int = 50  # tokens generated when the request does not say
    temperature: float = 0.7  # sampling temperature when the request does not say
    vllm_enabled: bool = False  # serve /generate_vllm through the optional `vllm` package
    vllm_model: str | None = None  # HF folder for vLLM (None: /generate_vllm answers 503)

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("textbook.model must not be empty")
        if self.max_tokens < 1:
            raise ValueError("textbook.max_tokens must be >= 1")
        if not 0.0 <= self.temperature <= 100.0:
            raise ValueError("textbook.temperature must be in [0, 100]")


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """The HTTP edge: where it listens and the limits every request meets."""

    host: str = "127.0.0.1"  # bind address (keep 127.0.0.1 unless behind a proxy)
    port: int = 8000  # TCP port
    max_body_bytes: int = 8 * 1024 * 1024  # larger request bodies get 413
    request_timeout_s: float = 300.0  # per-request limit: 504 / error event, request aborted
    drain_timeout_s: float = 30.0  # on SIGTERM, wait this long for in-flight requests
    debug_endpoints: bool = True  # GET /debug/engine_stats (admins, or anyone when auth is off)
    textbook: TextbookConfig = field(default_factory=TextbookConfig)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError("server.port must be in [0, 65535]")
        if self.max_body_bytes < 1024:
            raise ValueError("server.max_body_bytes must be >= 1024")
        if self.request_timeout_s <= 0:
            raise ValueError("server.request_timeout_s must be > 0")
        if self.drain_timeout_s < 0:
            raise ValueError("server.drain_timeout_s must be >= 0")


@dataclass(frozen=True, kw_only=True)
class EngineDefaults:
    """Engine settings applied to every LLM the manager loads; None keeps the catalog's value."""

    dtype: str | None = None  # float32 | bfloat16
    max_num_seqs: int | None = None  # most requests running in one step
    max_num_batched_tokens: int | None = None  # token budget per step
    kv_cache_bytes: int | None = None  # memory for the KV cache per LLM

    def __post_init__(self) -> None:
        if self.dtype is not None and self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"engine.dtype must be float32 or bfloat16, got {self.dtype!r}")
        for name in ("max_num_seqs", "max_num_batched_tokens", "kv_cache_bytes"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"engine.{name} must be >= 1")

    def overrides(self) -> dict[str, Any]:
        """The fields that were set, by name."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


@dataclass(frozen=True, kw_only=True)
class ModelyardConfig:
    """Everything `modelyard serve` needs besides the catalog."""

    server: ServerConfig = field(default_factory=ServerConfig)
    engine: EngineDefaults = field(default_factory=EngineDefaults)
    manager: Mapping[str, Any] = field(default_factory=_empty)  # parsed by the manager part
    gateway: Mapping[str, Any] = field(default_factory=_empty)  # parsed by the gateway part
    ray: Mapping[str, Any] = field(default_factory=_empty)  # parsed by scale/config.py
    catalog: str | None = None  # catalog file; None: the embedded default catalog


T = TypeVar("T")

_SECTIONS = ("server", "engine", "manager", "gateway", "ray", "catalog")


def config_from_mapping(data: Mapping[str, Any]) -> ModelyardConfig:
    """Build and validate a ModelyardConfig from parsed YAML; unknown keys raise ValueError."""
    unknown = set(data) - set(_SECTIONS)
    if unknown:
        raise ValueError(f"unknown config section(s): {sorted(unknown)}; known: {_SECTIONS}")
    server_data = dict(_section(data, "server"))
    textbook = _build(TextbookConfig, _section(server_data, "textbook"), "server.textbook")
    server_data.pop("textbook", None)
    server = _build(ServerConfig, server_data, "server")
    server = dataclasses.replace(server, textbook=textbook)
    catalog = data.get("catalog")
    if catalog is not None and not isinstance(catalog, str):
        raise ValueError("catalog must be a file path")
    return ModelyardConfig(
        server=server,
        engine=_build(EngineDefaults, _section(data, "engine"), "engine"),
        manager=MappingProxyType(dict(_section(data, "manager"))),
        gateway=MappingProxyType(dict(_section(data, "gateway"))),
        ray=MappingProxyType(dict(_section(data, "ray"))),
        catalog=catalog,
    )


def load_config(path: str | Path | None) -> ModelyardConfig:
    """Read a YAML config file (None: all defaults). Raises ValueError on any invalid value."""
    if path is None:
        return ModelyardConfig()
    text = Path(path).read_text(encoding="utf-8")
    data = yaml.safe_load(text) or {}
    if not isinstance(data, Mapping):
        raise ValueError(f"{path}: the config must be a mapping of sections")
    return config_from_mapping(data)


def _section(data: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = data.get(name) or {}
    if not isinstance(value, Mapping):
        raise ValueError(f"config section {name!r} must be a mapping")
    return value


def _build(cls: type[T], data: Mapping[str, Any], where: str) -> T:
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = set(data) - names
    if unknown:
        raise ValueError(f"unknown key(s) in {where}: {sorted(unknown)}")
    try:
        return cls(**data)
    except TypeError as exc:
        raise ValueError(f"{where}: {exc}") from exc
