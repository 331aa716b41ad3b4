from __future__ import annotations

import pytest
from obs_helpers import sample

from modelyard.engine.messages import SchedulerStats
from modelyard.observability.collectors import EngineStatsCollector

pytestmark = pytest.mark.unit


def test_gauges_set_and_cumulative_counters_turned_into_increments() -> None:
    model = "collector-test-model"
    state: dict[str, SchedulerStats] = {}
    collector = EngineStatsCollector()
    unregister = collector.register(lambda: dict(state))
    q0 = sample("modelyard:prefix_cache_queries_total", model=model)
    h0 = sample("modelyard:prefix_cache_hits_total", model=model)
    p0 = sample("modelyard:num_preemptions_total", model=model)

    state[model] = SchedulerStats(
        num_running=3,
        num_waiting=2,
        kv_cache_usage=0.25,
        prefix_cache_queries=100,
        prefix_cache_hits=40,
        num_preemptions=1,
    )
    collector.refresh()
    assert sample("modelyard:num_requests_running", model=model) == 3
    assert sample("modelyard:num_requests_waiting", model=model) == 2
    assert sample("modelyard:kv_cache_usage_perc", model=model) == 0.25
    assert sample("modelyard:prefix_cache_queries_total", model=model) - q0 == 100

    collector.refresh()  # same snapshot: no double counting
    assert sample("modelyard:prefix_cache_queries_total", model=model) - q0 == 100

    state[model] = SchedulerStats(prefix_cache_queries=150, prefix_cache_hits=60, num_preemptions=3)
    collector.refresh()
    assert sample("modelyard:prefix_cache_queries_total", model=model) - q0 == 150
    assert sample("modelyard:prefix_cache_hits_total", model=model) - h0 == 60
    assert sample("modelyard:num_preemptions_total", model=model) - p0 == 3

    # engine restarted: counters start again from 0; the new value counts in full
    state[model] = SchedulerStats(prefix_cache_queries=10)
    collector.refresh()
    assert sample("modelyard:prefix_cache_queries_total", model=model) - q0 == 160

    # model unloaded: its gauge series disappear, counters stay
    state.clear()
    collector.refresh()
    assert sample("modelyard:num_requests_running", model=model) == 0.0
    assert sample("modelyard:prefix_cache_queries_total", model=model) - q0 == 160
    unregister()


def test_a_failing_source_does_not_break_the_scrape() -> None:
    collector = EngineStatsCollector()

    def broken() -> dict[str, SchedulerStats]:
        raise RuntimeError("engine gone")

    collector.register(broken)
    collector.register(lambda: {"ok-model": SchedulerStats(num_running=7)})
    collector.refresh()
    assert sample("modelyard:num_requests_running", model="ok-model") == 7


def test_spec_decode_counters_are_labelled_with_the_proposer() -> None:
    model = "collector-spec-model"
    labels = {"model": model, "method": "ngram"}
    state: dict[str, SchedulerStats] = {}
    collector = EngineStatsCollector()
    collector.register(lambda: dict(state))
    d0 = sample("modelyard:spec_decode_num_drafts_total", **labels)
    t0 = sample("modelyard:spec_decode_num_draft_tokens_total", **labels)
    a0 = sample("modelyard:spec_decode_num_accepted_tokens_total", **labels)
    p0 = sample("modelyard:spec_decode_num_accepted_tokens_per_pos_total", **labels, position="1")
    state[model] = SchedulerStats(
        spec_decode_method="ngram",
        spec_decode_num_drafts=4,
        spec_decode_num_draft_tokens=16,
        spec_decode_num_accepted_tokens=6,
        spec_decode_num_accepted_tokens_per_pos=[4, 2],
    )
    collector.refresh()
    collector.refresh()
    assert sample("modelyard:spec_decode_num_drafts_total", **labels) - d0 == 4
    assert sample("modelyard:spec_decode_num_draft_tokens_total", **labels) - t0 == 16
    assert sample("modelyard:spec_decode_num_accepted_tokens_total", **labels) - a0 == 6
    per_pos = sample(
        "modelyard:spec_decode_num_accepted_tokens_per_pos_total", **labels, position="1"
    )
    assert per_pos - p0 == 2


def test_structured_output_counters() -> None:
    model = "collector-structured-model"
    collector = EngineStatsCollector()
    stats = SchedulerStats(
        structured_requests=5,
        structured_compile_seconds=0.25,
        structured_mask_seconds=0.5,
        structured_mask_steps=40,
    )
    unregister = collector.register(lambda: {model: stats})
    collector.refresh()
    collector.refresh()  # the same snapshot counts once
    assert sample("modelyard:structured_requests_total", model=model) == 5
    assert sample("modelyard:structured_compile_seconds_total", model=model) == 0.25
    assert sample("modelyard:structured_mask_seconds_total", model=model) == 0.5
    assert sample("modelyard:structured_mask_steps_total", model=model) == 40
    unregister()
