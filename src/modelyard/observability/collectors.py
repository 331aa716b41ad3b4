"""Scrape-time collection of engine state.

Engines report a `SchedulerStats` snapshot with every step; nobody should push those into
Prometheus on the hot path. Instead the manager (or whoever knows the loaded LLMs) registers a
*source*: a cheap, non-blocking callable returning `{model_id: SchedulerStats}` for the LLMs loaded
right now. `refresh_engine_metrics()` runs before every `/metrics` scrape and

- sets the gauges `num_requests_running`, `num_requests_waiting`, `kv_cache_usage_perc`,
  `pinned_prefix_blocks`, `pinned_prefixes`;
- turns the cumulative counters of `SchedulerStats` (`prefix_cache_queries`,
  `prefix_cache_hits`, `num_preemptions`, `pinned_prefix_hits`, `num_failed_requests`,
  `lora_loads`, the `structured_*` ones, and the `spec_decode_*` ones of a model that
  speculates, labelled with its proposer) into increments of the Prometheus counters, by
  remembering the last value seen per model. A value lower than the last one means the engine
  restarted: the new value counts in full (what Prometheus' `rate()` assumes after a reset);
- removes the gauge series of models no longer loaded (counters keep their totals).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable

from prometheus_client import Counter

from modelyard.engine.messages import SchedulerStats
from modelyard.manager.base import ModelProvider
from modelyard.observability.metrics import (
    ENGINE_FAILED_REQUESTS,
    KV_CACHE_USAGE,
    LORA_LOAD_SECONDS,
    LORA_LOADS,
    LORA_RESIDENT_ADAPTERS,
    LORA_RESIDENT_BYTES,
    NUM_PREEMPTIONS,
    NUM_REQUESTS_RUNNING,
    NUM_REQUESTS_WAITING,
    PINNED_PREFIX_BLOCKS,
    PINNED_PREFIX_HITS,
    PINNED_PREFIXES,
    PREFIX_CACHE_HITS,
    PREFIX_CACHE_QUERIES,
    SPEC_DECODE_NUM_ACCEPTED_TOKENS,
    SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS,
    SPEC_DECODE_NUM_DRAFT_TOKENS,
    SPEC_DECODE_NUM_DRAFTS,
    STRUCTURED_COMPILE_SECONDS,
    STRUCTURED_MASK_SECONDS,
    STRUCTURED_MASK_STEPS,
    STRUCTURED_REQUESTS,
)

EngineStatsSource = Callable[[], dict[str, SchedulerStats]]

logger = logging.getLogger(__name__)

_CUMULATIVE: tuple[tuple[str, Counter], ...] = (
    ("prefix_cache_queries", PREFIX_CACHE_QUERIES),
    ("prefix_cache_hits", PREFIX_CACHE_HITS),
    ("num_preemptions", NUM_PREEMPTIONS),
    ("pinned_prefix_hits", PINNED_PREFIX_HITS),
    ("num_failed_requests", ENGINE_FAILED_REQUESTS),
    ("lora_loads", LORA_LOADS),
    ("structured_requests", STRUCTURED_REQUESTS),
    ("structured_mask_steps", STRUCTURED_MASK_STEPS),
)
_SECONDS: tuple[tuple[str, Counter], ...] = (  # cumulative float seconds, counted in ms
    ("lora_load_seconds", LORA_LOAD_SECONDS),
    ("structured_compile_seconds", STRUCTURED_COMPILE_SECONDS),
    ("structured_mask_seconds", STRUCTURED_MASK_SECONDS),
)
_GAUGES = (
    NUM_REQUESTS_RUNNING,
    NUM_REQUESTS_WAITING,
    KV_CACHE_USAGE,
    PINNED_PREFIX_BLOCKS,
    PINNED_PREFIXES,
    LORA_RESIDENT_ADAPTERS,
    LORA_RESIDENT_BYTES,
)
_SPEC_CUMULATIVE: tuple[tuple[str, Counter], ...] = (
    ("spec_decode_num_drafts", SPEC_DECODE_NUM_DRAFTS),
    ("spec_decode_num_draft_tokens", SPEC_DECODE_NUM_DRAFT_TOKENS),
    ("spec_decode_num_accepted_tokens", SPEC_DECODE_NUM_ACCEPTED_TOKENS),
)


class EngineStatsCollector:
    """Holds the registered sources and the last cumulative values seen per model."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sources: list[EngineStatsSource] = []
        self._last: dict[str, dict[str, int]] = {}  # model -> counter field -> last value
        self._gauge_models: set[str] = set()  # models whose gauge series exist

    def register(self, source: EngineStatsSource) -> Callable[[], None]:
        """Add a source; returns a function that removes it again."""
        with self._lock:
            self._sources.append(source)

        def unregister() -> None:
            with self._lock:
                if source in self._sources:
                    self._sources.remove(source)

        return unregister

    def refresh(self) -> None:
        """Read every source once and update the engine metrics (see the module docstring)."""
        snapshot: dict[str, SchedulerStats] = {}
        with self._lock:
            sources = list(self._sources)
        for source in sources:
            try:
                snapshot.update(source())
            except Exception:  # a broken source must not break /metrics
                logger.exception("engine stats source failed")
        with self._lock:
            for model, stats in snapshot.items():
                self._set_gauges(model, stats)
                self._add_increments(model, stats)
            for gone in self._gauge_models - snapshot.keys():
                for gauge in _GAUGES:
                    with contextlib.suppress(KeyError):
                        gauge.remove(gone)
            self._gauge_models = set(snapshot)

    @staticmethod
    def _set_gauges(model: str, stats: SchedulerStats) -> None:
        NUM_REQUESTS_RUNNING.labels(model=model).set(stats.num_running)
        NUM_REQUESTS_WAITING.labels(model=model).set(stats.num_waiting)
        KV_CACHE_USAGE.labels(model=model).set(stats.kv_cache_usage)
        LORA_RESIDENT_ADAPTERS.labels(model=model).set(len(stats.lora_resident))
        LORA_RESIDENT_BYTES.labels(model=model).set(stats.lora_resident_bytes)
        PINNED_PREFIX_BLOCKS.labels(model=model).set(stats.num_pinned_blocks)
        PINNED_PREFIXES.labels(model=model).set(stats.num_pinned_prefixes)

    def _add_increments(self, model: str, stats: SchedulerStats) -> None:
        last = self._last.setdefault(model, {})
        for name, counter in _CUMULATIVE:
            _increment(last, name, int(getattr(stats, name)), counter.labels(model=model))
        for name, counter in _SECONDS:
            ms = round(float(getattr(stats, name)) * 1000)
            counter.labels(model=model).inc(_gain(last, f"{name}_ms", ms) / 1000)
        method = stats.spec_decode_method
        if not method:
            return
        for name, counter in _SPEC_CUMULATIVE:
            child = counter.labels(model=model, method=method)
            _increment(last, name, int(getattr(stats, name)), child)
        for position, value in enumerate(stats.spec_decode_num_accepted_tokens_per_pos):
            child = SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS.labels(
                model=model, method=method, position=str(position)
            )
            _increment(last, f"spec_decode_pos_{position}", value, child)


def _increment(last: dict[str, int], name: str, value: int, counter: Counter) -> None:
    """Add what a cumulative value gained since the last scrape (all of it after a reset)."""
    increment = _gain(last, name, value)
    if increment > 0:
        counter.inc(increment)


def _gain(last: dict[str, int], name: str, value: int) -> int:
    """What a cumulative value gained since the last scrape (all of it after a reset)."""
    previous = last.get(name, 0)
    last[name] = value
    return value - previous if value >= previous else value


ENGINE_STATS = EngineStatsCollector()


def register_engine_stats_source(source: EngineStatsSource) -> Callable[[], None]:
    """Register `source` with the process-wide collector; returns the unregister function."""
    return ENGINE_STATS.register(source)


def refresh_engine_metrics() -> None:
    """Update the engine gauges and counters from every registered source (scrape time)."""
    ENGINE_STATS.refresh()


def register_provider_stats(provider: ModelProvider) -> Callable[[], None]:
    """Register `provider.engine_stats()` (a `{model_id: SchedulerStats}` of its loaded LLMs);
    returns the unregister function.

    The app calls this at startup and the returned function at shutdown.
    """
    return register_engine_stats_source(provider.engine_stats)
