"""The byte-budget LRU model manager (the real `ModelProvider`).

Policy, in order, when a lease needs a model that is not loaded:

1. **Single-flight**: the first lease starts one load task per model; every concurrent lease for
   that model awaits the same task (20 cold leases -> 1 load). Loads of different models run
   concurrently (per-model tasks; no global lock is held across an await), so loading A never
   delays a lease of a loaded B.
2. **Check the estimate first**: `memory_estimate_bytes` (catalog) or a size-based estimate.
   A model larger than the whole budget fails at once (ModelLoadError).
3. **Evict only what is needed**: if the estimate fits in the free budget (and the model count
   limit allows), nothing is evicted. Otherwise the least recently used *idle* models (no lease,
   no waiter, not pinned) are chosen until it fits; they are stopped (worker process ends, memory
   returns) before the load starts, because evict-before-load is what makes it fit. If idle
   models cannot free enough (the rest is leased or pinned), the load waits for leases to end,
   up to `wait_timeout_s` -> ModelUnavailableError (503). So a load that fails has evicted
   nothing unless eviction was required for it to fit at all.
4. **Load** (`ModelLoader.load`, off the event loop: a worker process). On failure the
   reservation is returned, the model enters backoff (`retry_backoff_s`, doubling up to
   `retry_backoff_max_s`): leases during backoff fail fast with the last error; the first lease
   after it retries.
5. **Measure**: the worker's RSS replaces the estimate. If the measurement overshoots the
   budget, idle LRU models are evicted (best effort, never waiting).

A LoRA adapter is an entry of its own (manager/adapters.py): its lease holds its base model.
A loaded model whose worker died is dropped at its next lease and loaded again (its in-flight
requests already failed with a clear 503). A background task unloads idle models past their
`keep_alive_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from modelyard.engine.messages import SchedulerStats
from modelyard.manager.adapters import AdapterTable, adapter_lease, adapter_spec
from modelyard.manager.base import (
    Adapter,
    Lease,
    ModelLoadError,
    ModelProvider,
    ModelUnavailableError,
)
from modelyard.manager.catalog import Catalog
from modelyard.manager.config import ManagerConfig
from modelyard.manager.entries import Entry, State
from modelyard.manager.loaders import (
    LLMModel,
    ModelLoader,
    ProcessLoader,
    default_budget_bytes,
    estimate_bytes,
    predictor_of,
)
from modelyard.model_spec import ModelSpec
from modelyard.observability import metrics

log = logging.getLogger(__name__)


class Manager:
    def __init__(
        self, catalog: Catalog, config: ManagerConfig, loader: ModelLoader | None = None
    ) -> None:
        self.catalog = catalog
        self.config = config
        self.loader = loader or ProcessLoader(
            start_method=config.worker_start_method,
            preload=tuple(config.worker_preload),
            ready_timeout_s=config.load_timeout_s,
        )
        self.budget_bytes = config.memory_budget_bytes or default_budget_bytes(
            config.budget_fraction
        )
        self.ready = False
        self._entries = {spec.id: Entry(spec) for spec in catalog}
        self._adapters = AdapterTable.of_catalog(catalog)
        self._reserved = 0  # bytes reserved by loads in progress
        self._reserved_count = 0  # loads in progress
        self._freeing = 0  # bytes of evicted workers not yet stopped
        self._changed = asyncio.Event()  # set (and replaced) whenever memory or leases change
        self._sweeper: asyncio.Task[None] | None = None
        self._stopping: set[asyncio.Task[None]] = set()
        self.stats = {"loads": 0, "hits": 0, "misses": 0, "evictions": 0, "load_failures": 0}
        metrics.MODEL_BUDGET_BYTES.set(self.budget_bytes)

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        """Start the keep_alive sweeper and load preload/pinned models; then ready."""
        self._sweeper = asyncio.create_task(self._sweep(), name="manager-keep-alive")
        wanted = [e.spec.id for e in self._entries.values() if e.spec.preload or e.spec.pin]
        results = await asyncio.gather(*(self.load(n) for n in wanted), return_exceptions=True)
        for name, result in zip(wanted, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("preloading %s failed: %s", name, result)
        self.ready = True

    async def close(self) -> None:
        """Stop the sweeper and every worker."""
        self.ready = False
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
        for entry in self._entries.values():
            if entry.load_task is not None:
                entry.load_task.cancel()
        models = [self._detach(e, "shutdown") for e in self._entries.values() if e.model]
        await asyncio.gather(*(m.stop() for m in models if m), return_exceptions=True)
        await asyncio.gather(*self._stopping, return_exceptions=True)

    # ------------------------------------------------------------------ leases
    @contextlib.asynccontextmanager
    async def lease(self, name: str) -> AsyncIterator[Lease]:
        """Resolve, load if needed (single-flight), hold against eviction while in use; an
        adapter's lease holds its base."""
        adapter = self._adapters.get(name)
        async with self._lease_model(adapter.base if adapter else name) as lease:
            yield adapter_lease(adapter, lease) if adapter else lease

    @contextlib.asynccontextmanager
    async def _lease_model(self, name: str) -> AsyncIterator[Lease]:
        entry = self._entries[self.catalog.resolve(name).id]
        model = await self._acquire(entry)
        metrics.MODEL_ACTIVE_LEASES.labels(entry.spec.id).inc()
        try:
            client = model.llm if isinstance(model, LLMModel) else predictor_of(model)
            yield Lease(entry.spec.id, entry.spec.kind, client, model.metadata)
        finally:
            entry.leases -= 1
            entry.touch()
            metrics.MODEL_ACTIVE_LEASES.labels(entry.spec.id).dec()
            self._wake()

    async def load(self, name: str) -> None:
        """Load a model now (repository API, preload); no lease is kept."""
        async with self.lease(name):
            pass

    async def unload(self, name: str) -> None:
        """Unload a model now (after its leases end, up to wait_timeout_s); pins included."""
        entry = self._entry(name)
        if entry.load_task is not None:
            await asyncio.gather(asyncio.shield(entry.load_task), return_exceptions=True)
        deadline = time.monotonic() + self.config.wait_timeout_s
        while entry.state is State.LOADED and (entry.leases or entry.waiters):
            if not await self._wait_changed(deadline):
                raise ModelUnavailableError(f"{entry.spec.id} is still in use")
        if entry.state is State.LOADED:
            model = self._detach(entry, "explicit")
            if model is not None:
                await self._stop(model, entry.bytes_at_detach)

    async def _acquire(self, entry: Entry) -> Any:
        counted = False
        while True:
            if entry.state is State.LOADED and entry.model is not None:
                if entry.model.is_alive:
                    entry.leases += 1
                    entry.touch()
                    if not counted:
                        self._count("hits", metrics.MODEL_CACHE_HITS, entry.spec.id)
                    return entry.model
                dead = self._detach(entry, "crash")
                if dead is not None:
                    await self._stop(dead, entry.bytes_at_detach)
                continue
            if not counted:
                self._count("misses", metrics.MODEL_CACHE_MISSES, entry.spec.id)
                counted = True
            if entry.load_task is None:
                entry.check_backoff()
                entry.load_task = asyncio.create_task(self._load(entry))
            entry.waiters += 1
            try:
                await asyncio.shield(entry.load_task)
            finally:
                entry.waiters -= 1

    def _count(self, key: str, counter: Any, model_id: str) -> None:
        self.stats[key] += 1
        counter.labels(model_id).inc()

    # ------------------------------------------------------------------ loading
    async def _load(self, entry: Entry) -> None:
        spec = entry.spec
        try:
            estimate = await asyncio.to_thread(estimate_bytes, spec)  # walks the source
            await self._reserve(entry, estimate)
            await self._load_reserved(entry, estimate)
        finally:
            entry.load_task = None
            self._wake()

    async def _load_reserved(self, entry: Entry, estimate: int) -> None:
        spec = entry.spec
        start = time.perf_counter()
        try:
            model = await asyncio.wait_for(self.loader.load(spec), self.config.load_timeout_s)
        except (Exception, asyncio.CancelledError) as exc:
            self._reserved -= estimate
            self._reserved_count -= 1
            self.stats["load_failures"] += 1
            metrics.MODEL_LOAD_FAILURES.labels(spec.id).inc()
            error = exc if isinstance(exc, ModelLoadError) else ModelLoadError(f"{spec.id}: {exc}")
            entry.fail(str(error), self.config.retry_backoff_s, self.config.retry_backoff_max_s)
            if isinstance(exc, asyncio.CancelledError):
                raise
            raise error from exc
        measured = model.memory_bytes() if self.config.measure_memory else None
        self._reserved -= estimate
        self._reserved_count -= 1
        entry.loaded(model, measured or estimate)
        self.stats["loads"] += 1
        metrics.MODEL_LOADS.labels(spec.id).inc()
        metrics.MODEL_LOAD_LATENCY.labels(spec.id).observe(time.perf_counter() - start)
        metrics.MODEL_LOADED_BYTES.labels(spec.id).set(entry.bytes)
        victims = self._plan_eviction(0, exclude=entry, count_self=False) or []
        for victim in victims:  # measured overshoot: best effort, never waits
            model_to_stop = self._detach(victim, "overshoot")
            if model_to_stop is not None:
                self._stop_later(model_to_stop, victim.bytes_at_detach)

    async def _reserve(self, entry: Entry, need: int) -> None:
        """Make room for `need` bytes (evicting idle LRU models only if required), or wait
        for leases to end; ModelUnavailableError after wait_timeout_s."""
        if need > self.budget_bytes:
            raise ModelLoadError(
                f"{entry.spec.id} needs about {need} bytes; the budget is {self.budget_bytes}"
            )
        deadline = time.monotonic() + self.config.wait_timeout_s
        while (victims := self._plan_eviction(need, exclude=entry)) is None:
            if not await self._wait_changed(deadline):
                raise ModelUnavailableError(
                    f"no memory for {entry.spec.id}: every model that could make room is in use",
                    retry_after_s=2.0,
                )
        self._reserved += need
        self._reserved_count += 1
        entry.state = State.LOADING
        for model, size in [(self._detach(v, "lru"), v.bytes_at_detach) for v in victims]:
            if model is not None:
                await self._stop(model, size)

    def _plan_eviction(
        self, need: int, *, exclude: Entry, count_self: bool = True
    ) -> list[Entry] | None:
        """Idle LRU models to evict so `need` more bytes (and one more model) fit; [] when it
        fits already; None when even evicting every idle model would not do."""
        loaded = [e for e in self._entries.values() if e.state is State.LOADED]
        free = self.budget_bytes - sum(e.bytes for e in loaded) - self._reserved - self._freeing
        count = len(loaded) + self._reserved_count + (1 if count_self else 0)
        limit = self.config.max_models
        candidates = sorted(
            (e for e in loaded if e is not exclude and e.is_idle), key=lambda e: e.last_used
        )
        victims: list[Entry] = []
        for candidate in candidates:
            if free >= need and (limit is None or count <= limit):
                break
            victims.append(candidate)
            free += candidate.bytes
            count -= 1
        if free >= need and (limit is None or count <= limit):
            return victims
        return None

    # ------------------------------------------------------------------ unloading
    def _detach(self, entry: Entry, reason: str) -> Any:
        """Take a model out of the books (its bytes move to `_freeing` until stopped)."""
        model = entry.unloaded()
        self._freeing += entry.bytes_at_detach
        if reason != "shutdown":
            self.stats["evictions"] += 1
            metrics.MODEL_EVICTIONS.labels(entry.spec.id, reason).inc()
        metrics.MODEL_LOADED_BYTES.labels(entry.spec.id).set(0)
        return model

    async def _stop(self, model: Any, size: int) -> None:
        try:
            await model.stop()
        except Exception as exc:
            log.warning("stopping a worker failed: %s", exc)
        finally:
            self._freeing -= size
            self._wake()

    def _stop_later(self, model: Any, size: int) -> None:
        task = asyncio.create_task(self._stop(model, size))
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(self.config.sweep_interval_s)
            try:
                self._expire_idle(time.monotonic())
            except Exception:  # the sweeper must outlive any one bad entry
                log.exception("keep_alive sweep failed")

    def _expire_idle(self, now: float) -> None:
        for entry in list(self._entries.values()):
            ttl = entry.spec.keep_alive_s or self.config.default_keep_alive_s
            expired = ttl is not None and now - entry.last_used > ttl
            if entry.state is State.LOADED and entry.is_idle and expired:
                model = self._detach(entry, "keep_alive")
                if model is not None:
                    self._stop_later(model, entry.bytes_at_detach)

    # ------------------------------------------------------------------ waiting
    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait_changed(self, deadline: float) -> bool:
        """Wait for a lease/memory change; False once the deadline passed."""
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), remaining)
        return True

    # ------------------------------------------------------------------ listing
    def describe(self) -> dict[str, Any]:
        """The /models listing (see module docs of api routes)."""
        entries = self._entries.values()
        loaded = [e.describe_loaded() for e in entries if e.state is State.LOADED]
        used = sum(e.bytes for e in entries if e.state is State.LOADED)
        available = [e.describe_spec() for e in entries]
        return {
            "models": available,  # the same list under the key api/routes/openai.py reads
            "available_models": available,
            "loaded_models": loaded,
            "memory": {
                "budget_bytes": self.budget_bytes,
                "used_bytes": used,
                "reserved_bytes": self._reserved,
                "max_models": self.config.max_models,
            },
            "adapters": self._adapters.describe(),
            "stats": dict(self.stats),
            "ready": self.ready,
        }

    def engine_stats(self) -> dict[str, SchedulerStats]:
        """The latest scheduler snapshot of every loaded LLM (read at /metrics scrape time)."""
        return {
            e.spec.id: e.model.llm.stats()
            for e in self._entries.values()
            if e.state is State.LOADED and isinstance(e.model, LLMModel)
        }

    def spec(self, name: str) -> ModelSpec:
        adapter = self._adapters.get(name)
        if adapter is not None:
            return adapter_spec(adapter, self.catalog.resolve(adapter.base))
        return self.catalog.resolve(name)

    def catalog_entries(self) -> list[ModelSpec]:
        return list(self.catalog)

    def state(self, name: str) -> State:
        return self._entry(name).state

    def metadata(self, name: str) -> dict[str, Any] | None:
        """A loaded model's tensor metadata (None when not loaded)."""
        entry = self._entry(name)
        return entry.model.metadata if entry.model is not None else None

    # ------------------------------------------------------------------ adapters
    def adapters(self) -> list[Adapter]:
        return self._adapters.all()

    def add_adapter(self, name: str, base: str, folder: str) -> Adapter:
        return self._adapters.add_beside(self.catalog, name, base, folder)

    async def remove_adapter(self, name: str) -> Adapter:
        adapter = self._adapters.remove(name)
        model = self._entries[adapter.base].model
        if isinstance(model, LLMModel) and model.is_alive:
            await model.llm.drop_loras([name])
        return adapter

    def _entry(self, name: str) -> Entry:
        """The entry a name means (an adapter's: its base's)."""
        adapter = self._adapters.get(name)
        return self._entries[self.catalog.resolve(adapter.base if adapter else name).id]


def _conforms(manager: Manager) -> ModelProvider:
    """mypy checks here that the manager implements the whole provider protocol."""
    return manager
