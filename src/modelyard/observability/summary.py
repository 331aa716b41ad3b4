"""The server's own metrics as JSON, per model, for the web console's dashboard.

The console polls `GET /ui/api/summary` (api/routes/console.py) every few seconds and works
out windowed values itself from two snapshots, as Prometheus' `rate()` and
`histogram_quantile()` do: request rate = Δrequests / Δt, TTFT p50 = the quantile of the
bucket deltas. So this module only reads cumulative values, never keeps state:

- `model_metrics()`: `{model: {...}}` from the prometheus-client metric objects of this
  process (observability/metrics.py) that are updated as requests happen, label sets other
  than `model` summed (e.g. tenant). Engine state (KV cache, prefix cache) is not here: it is
  in the manager's listing of loaded models, read fresh on every call;
- a histogram is `{"le": [upper bounds, +Inf last], "counts": [cumulative], "sum", "count"}`.

Reading a metric object walks its children under prometheus-client's lock; callers run it in
a worker thread (a sync route), never on the event loop.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from prometheus_client import Counter, Histogram
from prometheus_client.samples import Sample

from modelyard.observability import metrics as m

HistogramSnapshot = dict[str, Any]  # {"le": [...], "counts": [...], "sum": float, "count": int}

# Histograms and counters the dashboard shows, by the key they get in a model's entry.
_HISTOGRAMS: dict[str, Histogram] = {
    "ttft": m.TIME_TO_FIRST_TOKEN,
    "itl": m.INTER_TOKEN_LATENCY,
    "e2e": m.E2E_REQUEST_LATENCY,
    "inference": m.INFERENCE_REQUEST_DURATION,
}
_COUNTERS: dict[str, Counter] = {
    "requests": m.TENANT_MODEL_REQUESTS,  # served requests of every kind, by tenant
    "prompt_tokens": m.PROMPT_TOKENS,
    "generation_tokens": m.GENERATION_TOKENS,
}


def _samples(metric: Counter | Histogram, tenant: str | None) -> Iterator[Sample]:
    """The metric's samples; with `tenant`, only that tenant's series (none when the metric
    has no tenant label)."""
    for family in metric.collect():
        for sample in family.samples:
            if tenant is None or sample.labels.get("tenant") == tenant:
                yield sample


def counter_by_model(metric: Counter, tenant: str | None = None) -> dict[str, float]:
    """A counter's `_total` summed per `model` label (other labels added together)."""
    totals: dict[str, float] = {}
    for sample in _samples(metric, tenant):
        if sample.name.endswith("_total"):
            model = sample.labels.get("model", "")
            totals[model] = totals.get(model, 0.0) + sample.value
    return totals


def histogram_by_model(
    metric: Histogram, tenant: str | None = None
) -> dict[str, HistogramSnapshot]:
    """A histogram's cumulative buckets, sum and count per `model` label (others added)."""
    buckets: dict[str, dict[float, float]] = {}
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for sample in _samples(metric, tenant):
        model = sample.labels.get("model", "")
        if sample.name.endswith("_bucket"):
            per_le = buckets.setdefault(model, {})
            le = float(sample.labels["le"])
            per_le[le] = per_le.get(le, 0.0) + sample.value
        elif sample.name.endswith("_sum"):
            sums[model] = sums.get(model, 0.0) + sample.value
        elif sample.name.endswith("_count"):
            counts[model] = counts.get(model, 0.0) + sample.value
    snapshots: dict[str, HistogramSnapshot] = {}
    for model, per_le in buckets.items():
        bounds = sorted(per_le)
        snapshots[model] = {
            "le": [b if math.isfinite(b) else "+Inf" for b in bounds],
            "counts": [int(per_le[b]) for b in bounds],
            "sum": sums.get(model, 0.0),
            "count": int(counts.get(model, 0.0)),
        }
    return snapshots


def model_metrics(tenant: str | None = None) -> dict[str, dict[str, Any]]:
    """`{model: {counter key: value, histogram key: HistogramSnapshot}}` for every model with
    at least one series; `requests` counts the requests each model served (every kind).

    With `tenant`: only the series labelled with that tenant (requests, TTFT, e2e latency,
    prompt and generation tokens): what one tenant may learn without seeing the others'
    traffic. ITL and non-LLM latency have no tenant label, so a tenant gets neither.
    """
    per_model: dict[str, dict[str, Any]] = {}
    for key, counter in _COUNTERS.items():
        for model, value in counter_by_model(counter, tenant).items():
            per_model.setdefault(model, {})[key] = int(value)
    for key, histogram in _HISTOGRAMS.items():
        for model, snapshot in histogram_by_model(histogram, tenant).items():
            per_model.setdefault(model, {})[key] = snapshot
    return per_model
