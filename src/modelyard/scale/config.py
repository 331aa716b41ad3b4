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

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ROUTERS = ("prefix", "pow2")


@dataclass(frozen=True, kw_only=True)
class RayConfig:
    """How the catalog is laid out on Ray Serve (see the module docstring)."""

    app_name: str = "modelyard"  # Serve application name
    ingress_replicas: int = 1  # replicas of the ingress deployment
    ingress_num_cpus: float = 0.0  # CPUs reserved per ingress replica
    pool_replicas: int = 1  # replicas of the non-LLM pool
    pool_max_models: int = 4  # models per pool replica (Ray's LRU by count)
    pool_num_cpus: float = 0.0  # CPUs reserved per pool replica
    router: str = "prefix"  # prefix | pow2
    prefix_table_size: int = 8192  # entries of the block-hash -> replica table
    max_prefix_blocks: int = 128  # leading blocks hashed per prompt
    max_queue_gap: int = 4  # load guard: queue(preferred) - queue(least loaded) allowed
    session_header: str = "x-session-id"  # the stickiness header
    health_check_period_s: float = 2.0  # Serve health checks of every replica
    graceful_shutdown_timeout_s: float = 30.0  # a stopping replica drains this long

    def __post_init__(self) -> None:
        if self.router not in ROUTERS:
            raise ValueError(f"ray.router must be one of {ROUTERS}, got {self.router!r}")
        counts = (self.ingress_replicas, self.pool_replicas, self.pool_max_models)
        if min(counts) < 1:
            raise ValueError("ray: replica and model counts must be >= 1")
        if self.prefix_table_size < 1 or self.max_prefix_blocks < 1 or self.max_queue_gap < 0:
            raise ValueError("ray: prefix_table_size, max_prefix_blocks >= 1, max_queue_gap >= 0")
        if min(self.ingress_num_cpus, self.pool_num_cpus) < 0:
            raise ValueError("ray: num_cpus must be >= 0")
        if self.health_check_period_s <= 0 or not self.session_header:
            raise ValueError("ray: health_check_period_s > 0 and a session_header are required")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> RayConfig:
        """The `ray:` section -> RayConfig (ValueError on unknown keys or bad values)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown key(s) in ray: {sorted(unknown)}")
        return cls(**dict(data))
