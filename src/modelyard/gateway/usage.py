"""Per-tenant usage of this process, for `/admin/usage`: requests, rejections, and per serving
model the requests, tokens (generation), inputs and bytes (other models).

The same events go to the Prometheus counters (TENANT_REQUESTS, RATE_LIMIT_REJECTIONS,
TENANT_MODEL_REQUESTS, TENANT_ITEMS, TENANT_INPUT_BYTES); the tracker keeps totals in memory so
the admin endpoint can answer without a Prometheus server. Counts are per process (each replica
reports its own).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from modelyard.gateway.base import RequestUsage
from modelyard.observability.metrics import (
    RATE_LIMIT_REJECTIONS,
    TENANT_INPUT_BYTES,
    TENANT_ITEMS,
    TENANT_MODEL_REQUESTS,
    TENANT_REQUESTS,
)


@dataclass(slots=True)
class ModelUsage:
    """One tenant's use of one serving model."""

    requests: int = 0  # requests the model served
    prompt_tokens: int = 0  # generation
    completion_tokens: int = 0  # generation
    items: int = 0  # other models: inputs served
    input_bytes: int = 0  # request body bytes
    policies: dict[str, int] = field(default_factory=dict)  # requests by routing policy


@dataclass(slots=True)
class TenantUsage:
    """Totals for one tenant since the process started."""

    requests: int = 0  # requests admitted past authentication and quotas
    prompt_tokens: int = 0  # real prompt tokens, all models
    completion_tokens: int = 0  # real completion tokens, all models
    rejections: dict[str, int] = field(default_factory=dict)  # by limit: rpm, tpm, model, ...
    models: dict[str, ModelUsage] = field(default_factory=dict)  # by the model that served


class UsageTracker:
    """Accumulates TenantUsage and mirrors it to the Prometheus counters."""

    def __init__(self) -> None:
        self._tenants: dict[str, TenantUsage] = {}
        self._request_counters: dict[str, Any] = {}  # labelled children, looked up once
        self.started_at = time.time()

    def _get(self, tenant: str) -> TenantUsage:
        usage = self._tenants.get(tenant)
        if usage is None:
            usage = self._tenants[tenant] = TenantUsage()
        return usage

    def record_request(self, tenant: str) -> None:
        self._get(tenant).requests += 1
        counter = self._request_counters.get(tenant)
        if counter is None:
            counter = self._request_counters[tenant] = TENANT_REQUESTS.labels(tenant)
        counter.inc()

    def record_served(self, tenant: str, policy: str, usage: RequestUsage) -> None:
        """A request that a model served: per-model totals and the tenant/model counters."""
        if usage.model is None:
            return
        totals = self._get(tenant)
        totals.prompt_tokens += max(0, usage.prompt_tokens)
        totals.completion_tokens += max(0, usage.completion_tokens)
        model = totals.models.get(usage.model)
        if model is None:
            model = totals.models[usage.model] = ModelUsage()
        model.requests += 1
        model.prompt_tokens += max(0, usage.prompt_tokens)
        model.completion_tokens += max(0, usage.completion_tokens)
        model.items += usage.items
        model.input_bytes += usage.input_bytes
        model.policies[policy] = model.policies.get(policy, 0) + 1
        TENANT_MODEL_REQUESTS.labels(tenant, usage.model, policy).inc()
        if usage.items:
            TENANT_ITEMS.labels(tenant, usage.model).inc(usage.items)
        TENANT_INPUT_BYTES.labels(tenant, usage.model).inc(usage.input_bytes)

    def record_rejection(self, tenant: str, limit: str) -> None:
        rejections = self._get(tenant).rejections
        rejections[limit] = rejections.get(limit, 0) + 1
        RATE_LIMIT_REJECTIONS.labels(tenant, limit).inc()

    def snapshot(self) -> dict[str, Any]:
        """JSON-ready totals: {"since": unix time, "tenants": {tenant: {...}}}."""
        tenants = {name: asdict(usage) for name, usage in sorted(self._tenants.items())}
        return {"since": self.started_at, "tenants": tenants}
