"""The manager's per-model bookkeeping (`Entry`)."""

from __future__ import annotations

import asyncio
import enum
import time
from typing import Any

from modelyard.engine.client.protocol import LOCAL_ENGINE_CAPABILITIES
from modelyard.manager.base import ModelLoadError
from modelyard.manager.loaders import LLMModel, LoadedModel
from modelyard.model_spec import ModelKind, ModelSpec


class State(enum.StrEnum):
    UNLOADED = "unloaded"  # not loaded (never, evicted, or unloaded)
    LOADING = "loading"  # memory reserved, worker starting
    LOADED = "loaded"  # serving
    FAILED = "failed"  # last load failed; retried after the backoff


class Entry:
    """One catalog model's state in the manager. Mutated only on the event loop."""

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec  # the catalog entry
        self.state = State.UNLOADED  # see State
        self.model: LoadedModel | None = None  # while LOADED
        self.bytes = 0  # measured (or estimated) memory while LOADED
        self.bytes_at_detach = 0  # memory of the last unloaded worker (until it stopped)
        self.leases = 0  # active leases (block eviction)
        self.waiters = 0  # leases waiting for the current load (block eviction after it)
        self.last_used = time.monotonic()  # monotonic time of the last lease start/end
        self.last_used_wall = time.time()  # the same, wall clock, for /models
        self.load_task: asyncio.Task[None] | None = None  # the single-flight load in progress
        self.loads = 0  # successful loads of this model
        self.failures = 0  # consecutive failed loads
        self.retry_at = 0.0  # monotonic time before which a failed model is not retried
        self.last_error: str | None = None  # the last load error

    @property
    def is_idle(self) -> bool:
        """Evictable: no lease or waiter, not pinned, no pinned prefix in its engine."""
        holds_pins = self.model is not None and self.model.holds_pins
        return self.leases == 0 and self.waiters == 0 and not self.spec.pin and not holds_pins

    def touch(self) -> None:
        self.last_used = time.monotonic()
        self.last_used_wall = time.time()

    def check_backoff(self) -> None:
        """Raise the last load error while the retry backoff runs."""
        if self.state is State.FAILED and time.monotonic() < self.retry_at:
            wait = self.retry_at - time.monotonic()
            raise ModelLoadError(f"{self.last_error} (next retry in {wait:.1f} s)")

    def fail(self, error: str, backoff_s: float, backoff_max_s: float) -> None:
        self.failures += 1
        self.state = State.FAILED
        self.last_error = error
        self.retry_at = time.monotonic() + min(backoff_max_s, backoff_s * 2 ** (self.failures - 1))

    def loaded(self, model: Any, size: int) -> None:
        self.model, self.bytes, self.state = model, size, State.LOADED
        self.loads += 1
        self.failures = 0
        self.last_error = None
        self.touch()

    def unloaded(self) -> Any:
        model, self.model = self.model, None
        self.bytes_at_detach, self.bytes = self.bytes, 0
        self.state = State.UNLOADED
        return model

    def describe_spec(self) -> dict[str, Any]:
        """The catalog entry and its state; an LLM's also its `capabilities`, which every local
        engine serves (EngineCapabilities.listed), so they are known before it loads."""
        spec = self.spec
        described = {
            "id": spec.id,
            "name": spec.name,
            "aliases": list(spec.aliases),
            "kind": str(spec.kind),
            "backend": spec.backend,
            "version": spec.version,
            "description": spec.description,
            "pin": spec.pin,
            "state": str(self.state),
            "last_error": self.last_error,
        }
        if spec.kind.is_llm:
            chat = spec.kind is ModelKind.CHAT
            described["capabilities"] = LOCAL_ENGINE_CAPABILITIES.listed(chat=chat)
        return described

    def describe_loaded(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "id": self.spec.id,
            "kind": str(self.spec.kind),
            "state": str(self.state),
            "memory_bytes": self.bytes,
            "last_used": self.last_used_wall,
            "idle_s": round(time.monotonic() - self.last_used, 3),
            "active_leases": self.leases,
            "loads": self.loads,
            "pid": self.model.pid if self.model is not None else None,
            "pin": self.spec.pin,
        }
        if isinstance(self.model, LLMModel):
            try:
                stats = self.model.llm.stats()
                info["engine"] = {f: getattr(stats, f) for f in stats.__struct_fields__}
            except Exception as exc:  # a dead engine must not break the listing
                info["engine"] = {"error": str(exc)}
        return info
