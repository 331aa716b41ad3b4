"""`RayConfig`: the `ray:` section of the config file, read only by `modelyard serve --ray`.

```yaml
ray:
  app_name: modelyard
  ingress_replicas: 1          # replicas of the HTTP ingress (the same ASGI app as single-node)
  pool_replicas: 1             # replicas of the multiplexed deployment of the non-LLM models
  pool_max_models: 4           # @serve.multiplexed models per pool replica (LRU by count)
  pool_num_cpus: 0.5           # CPUs reserved per pool replica
  router: prefix               # prefix | pow2: how LLM replicas are picked
  prefix_table_size: 8192      # bounded table of block hashes -> replica
  max_prefix_blocks: 128       # at most this many leading blocks of a prompt are hashed
  max_queue_gap: 4             # prefer the cached replica unless its queue is this much longer
  session_header: x-session-id # requests with the same value stick to one replica
  health_check_period_s: 2.0   # Serve calls each replica's check_health this often
```

The per-replica byte budget of the pool is the `manager:` section, as in single-node mode.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from modelyard.config_parse import ConfigError, check_fields, setting


@dataclass(frozen=True, kw_only=True)
class RayConfig:
    """How the catalog is laid out on Ray Serve (see the module docstring)."""

    app_name: str = "modelyard"  # Serve application name
    ingress_replicas: int = setting(1, ge=1)  # replicas of the ingress deployment
    ingress_num_cpus: float = setting(0.0, ge=0)  # CPUs reserved per ingress replica
    pool_replicas: int = setting(1, ge=1)  # replicas of the non-LLM pool
    pool_max_models: int = setting(4, ge=1)  # models per pool replica (Ray's LRU by count)
    pool_num_cpus: float = setting(0.0, ge=0)  # CPUs reserved per pool replica
    router: Literal["prefix", "pow2"] = "prefix"  # how LLM replicas are picked
    prefix_table_size: int = setting(8192, ge=1)  # entries of the block-hash -> replica table
    max_prefix_blocks: int = setting(128, ge=1)  # leading blocks hashed per prompt
    # load guard: how much longer the preferred replica's queue may be than the shortest
    max_queue_gap: int = setting(4, ge=0)
    session_header: str = "x-session-id"  # the stickiness header
    health_check_period_s: float = setting(2.0, gt=0)  # Serve health checks of every replica
    graceful_shutdown_timeout_s: float = setting(30.0, ge=0)  # a stopping replica drains this long

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.session_header or not self.app_name:
            raise ConfigError("session_header", "app_name and session_header must not be empty")
