"""The server's configuration: one typed tree, parsed once.

One YAML file (every section optional) read by `load_config(path)`:

```yaml
server:        # ServerConfig: the HTTP edge (this module)
  host: 127.0.0.1
  port: 8000
  request_timeout_s: 300
engine:        # EngineDefaults: engine limits applied to every LLM the manager loads
  dtype: float32
  max_num_seqs: 64
manager:       # manager.config.ManagerConfig: memory budget, worker lifecycle
  memory_budget_bytes: 4294967296
gateway:       # gateway.config.GatewayConfig: auth, tenants, quotas, routes
  auth: auto
ray:           # scale.config.RayConfig: `serve --ray` (replicas of the pool, the router)
  router: prefix
agent:         # AgentServerConfig: the knowledge agent behind POST /v1/agent/ask
  index: ~/.modelyard/agent/default
catalog: models.yaml   # the catalog file; absent: the embedded default catalog
```

Every section is a frozen dataclass; `config_parse.from_mapping` reads them all with one error
style (`server.port: must be <= 65535, not 70000`). Command-line options override file values
through `dataclasses.replace` (see api/cli.py). Of this tree only `ENVIRONMENT_SETTINGS`
(`MODELYARD_REDIS_URL`) come from the environment, read by `load_config`; nothing below reads it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from modelyard.agent.agent import AgentConfig
from modelyard.agent.cli import DEFAULT_INDEX
from modelyard.config_parse import ConfigError, check_fields, from_mapping, setting
from modelyard.engine.config import Dtype
from modelyard.gateway.config import GatewayConfig
from modelyard.manager.config import ManagerConfig
from modelyard.scale.config import RayConfig


@dataclass(frozen=True, kw_only=True)
class TextbookConfig:
    """Defaults of the textbook endpoints (/basic_generate, /generate, /generate_stream)."""

    model: str = "smollm2-135m-instruct"  # model (id or alias) they use
    max_tokens: int = setting(50, ge=1)  # tokens generated when the request does not say
    temperature: float = setting(0.7, ge=0, le=100)  # sampling temperature when not said
    vllm_enabled: bool = False  # serve /generate_vllm through the optional `vllm` package
    vllm_model: str | None = None  # HF folder for vLLM (None: /generate_vllm answers 503)

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.model:
            raise ConfigError("model", "must not be empty")


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """The HTTP edge: where it listens and the limits every request meets."""

    host: str = "127.0.0.1"  # bind address (keep 127.0.0.1 unless behind a proxy)
    port: int = setting(8000, ge=0, le=65535)  # TCP port
    max_body_bytes: int = setting(8 * 1024 * 1024, ge=1024)  # larger request bodies get 413
    # JSON bodies nesting deeper, or holding more values, get 400 (checked before parsing)
    max_json_depth: int = setting(64, ge=1)
    max_json_elements: int = setting(1_000_000, ge=1)
    max_n: int = setting(32, ge=1)  # completions one request may ask for: n x its prompts
    # those completions x max_tokens (unset: the context length)
    max_n_tokens: int = setting(262_144, ge=1)
    # per-request limit: 504 / error event, request aborted
    request_timeout_s: float = setting(300.0, gt=0)
    drain_timeout_s: float = setting(30.0, ge=0)  # on SIGTERM, wait this long for in-flight
    debug_endpoints: bool = True  # GET /debug/engine_stats (admins, or anyone when auth is off)
    # POST /v1/load_lora_adapter accepts only folders under it (symlinks, `..` resolved); None: any
    lora_root: str | None = None
    # POST /v1/responses with store: true keeps each response this long, per tenant
    responses_ttl_s: float = setting(3600.0, gt=0)
    responses_max_stored: int = setting(1000, ge=1)  # per tenant; the oldest goes first
    textbook: TextbookConfig = setting(factory=TextbookConfig)

    def __post_init__(self) -> None:
        check_fields(self)
        if self.lora_root == "":
            raise ConfigError("lora_root", "must not be empty (leave it out: any folder)")


@dataclass(frozen=True, kw_only=True)
class EngineDefaults:
    """Engine settings applied to every LLM the manager loads; None keeps the catalog's value."""

    dtype: Dtype | None = None  # float32 | bfloat16
    max_num_seqs: int | None = setting(None, ge=1)  # most requests running in one step
    max_num_batched_tokens: int | None = setting(None, ge=1)  # token budget per step
    kv_cache_bytes: int | None = setting(None, ge=1)  # memory for the KV cache per LLM

    def __post_init__(self) -> None:
        check_fields(self)

    def overrides(self) -> dict[str, Any]:
        """The fields that were set, by name."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}


@dataclass(frozen=True, kw_only=True)
class AgentServerConfig:
    """The knowledge agent the server runs for `POST /v1/agent/ask` (api/routes/agent.py)."""

    index: str = DEFAULT_INDEX  # the folder `modelyard agent ingest` wrote (the CLI's default)
    # the agent's own settings (chat_model, embedding_model, max_tokens, plan, refine...)
    settings: AgentConfig = setting(factory=AgentConfig, inline=True)


@dataclass(frozen=True, kw_only=True)
class ModelyardConfig:
    """Everything `modelyard serve` needs besides the catalog itself."""

    server: ServerConfig = setting(factory=ServerConfig)
    engine: EngineDefaults = setting(factory=EngineDefaults)
    manager: ManagerConfig = setting(factory=ManagerConfig)
    gateway: GatewayConfig = setting(factory=GatewayConfig)
    ray: RayConfig = setting(factory=RayConfig)
    agent: AgentServerConfig = setting(factory=AgentServerConfig)
    catalog: str | None = None  # catalog file; None: the embedded default catalog
    # one LLM served without a catalog (`modelyard serve PATH`): a HF folder or a .gguf file;
    # its id is `served_model_name`, else the file or folder's stem (manager.catalog)
    model: str | None = None
    served_model_name: str | None = None


def config_from_mapping(data: Mapping[str, Any]) -> ModelyardConfig:
    """Build and validate a ModelyardConfig from parsed YAML; unknown keys raise ValueError."""
    return from_mapping(ModelyardConfig, data)


# settings the environment gives over the file's: a secret (a password inside a URL) stays out
# of the file, e.g. put together by Kubernetes from a Secret (deploy/k8s)
ENVIRONMENT_SETTINGS = {"MODELYARD_REDIS_URL": ("gateway", "redis_url")}


def load_config(
    path: str | Path | None, environ: Mapping[str, str] | None = None
) -> ModelyardConfig:
    """Read a YAML config file (None: all defaults), then `ENVIRONMENT_SETTINGS` from `environ`
    (default: os.environ) where set. Raises ValueError on any invalid value."""
    data: Mapping[str, Any] = {}
    if path is not None:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        if not isinstance(data, Mapping):
            raise ValueError(f"{path}: the config must be a mapping of sections")
    environ = os.environ if environ is None else environ
    for name, (section, key) in ENVIRONMENT_SETTINGS.items():
        if environ.get(name) and isinstance(data.get(section) or {}, Mapping):
            data = {**data, section: {**(data.get(section) or {}), key: environ[name]}}
    return config_from_mapping(data)
