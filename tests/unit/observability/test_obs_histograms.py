from __future__ import annotations

import pytest
from obs_helpers import sample

from modelyard.observability import metrics

pytestmark = pytest.mark.unit


def test_ttft_buckets_count_known_values() -> None:
    name = "modelyard:time_to_first_token_seconds"
    labels = {"model": "hist-test-model", "tenant": "t1"}
    bounds = ["0.005", "0.01", "0.05", "0.1", "0.5", "+Inf"]
    before = {b: sample(name + "_bucket", le=b, **labels) for b in bounds}
    sum_before = sample(name + "_sum", **labels)
    values = [0.004, 0.009, 0.01, 0.03, 0.07, 0.2, 3.0]
    for v in values:
        metrics.TIME_TO_FIRST_TOKEN.labels(**labels).observe(v)
    # Prometheus buckets are cumulative and inclusive of the upper bound (le).
    for b in bounds:
        bound = float("inf") if b == "+Inf" else float(b)
        expected = sum(1 for v in values if v <= bound)
        assert sample(name + "_bucket", le=b, **labels) - before[b] == expected, b
    assert sample(name + "_sum", **labels) - sum_before == pytest.approx(sum(values))


def test_latency_buckets_resolve_sub_100ms_targets() -> None:
    bounds = metrics.TIME_TO_FIRST_TOKEN._upper_bounds
    below_100ms = [b for b in bounds if b <= 0.1]
    assert len(below_100ms) >= 10
    assert bounds == sorted(bounds)


def test_every_metric_is_prefixed_and_documented() -> None:
    from pathlib import Path

    docs = (Path(__file__).parents[3] / "docs" / "metrics.md").read_text()
    from prometheus_client import Counter, Gauge, Histogram

    objs = [v for v in vars(metrics).values() if isinstance(v, Counter | Gauge | Histogram)]
    assert len(objs) > 30
    for obj in objs:
        name = obj._name
        assert name.startswith("modelyard:"), name
        assert f"`{name}" in docs, f"{name} missing from docs/metrics.md"
