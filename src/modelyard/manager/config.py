"""The `manager:` section of the server config: the memory budget and the workers' lifecycle."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from modelyard.config_parse import check_fields, setting

StartMethod = Literal["forkserver", "spawn", "fork"]


@dataclass(frozen=True, kw_only=True)
class ManagerConfig:
    # None: budget_fraction of the memory available at start
    memory_budget_bytes: int | None = setting(None, ge=1)
    budget_fraction: float = setting(0.6, gt=0, le=1)  # used when memory_budget_bytes is None
    max_models: int | None = setting(None, ge=1)  # optional cap on loaded models
    default_keep_alive_s: float | None = None  # idle TTL for models without keep_alive_s
    wait_timeout_s: float = setting(30.0, ge=0)  # how long a load waits for leased memory -> 503
    load_timeout_s: float = setting(600.0, gt=0)  # a load taking longer fails
    retry_backoff_s: float = 1.0  # first backoff after a failed load (doubles)
    retry_backoff_max_s: float = 60.0  # backoff cap
    sweep_interval_s: float = setting(1.0, gt=0)  # keep_alive check period
    measure_memory: bool = True  # replace the estimate by the worker's RSS after load
    worker_start_method: StartMethod = "forkserver"  # multiprocessing start method for workers
    worker_preload: tuple[str, ...] = ("torch",)  # imported once by the forkserver

    def __post_init__(self) -> None:
        check_fields(self)
