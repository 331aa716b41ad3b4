"""Per-tenant usage of this process: requests, tokens and rejections, for `/admin/usage`.

The same events go to the Prometheus counters (TENANT_REQUESTS, RATE_LIMIT_REJECTIONS); the
tracker keeps totals in memory so the admin endpoint can answer without a Prometheus server.
Counts are per process (each replica reports its own).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from modelyard.observability.metrics import RATE_LIMIT_REJECTIONS, TENANT_REQUESTS


@dataclass(slots=True)
class TenantUsage:
    """Totals for one tenant since the process started."""

    requests: int = 0  # requests admitted past authentication
    prompt_tokens: int = 0  # real prompt tokens reported by handlers
    completion_tokens: int = 0  # real completion tokens reported by handlers
    rejections: dict[str, int] = field(default_factory=dict)  # by limit: rpm, tpm, model, ...


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

    def record_tokens(self, tenant: str, prompt: int, completion: int) -> None:
        usage = self._get(tenant)
        usage.prompt_tokens += max(0, prompt)
        usage.completion_tokens += max(0, completion)

    def record_rejection(self, tenant: str, limit: str) -> None:
        rejections = self._get(tenant).rejections
        rejections[limit] = rejections.get(limit, 0) + 1
        RATE_LIMIT_REJECTIONS.labels(tenant, limit).inc()

    def snapshot(self) -> dict[str, Any]:
        """JSON-ready totals: {"since": unix time, "tenants": {tenant: {...}}}."""
        tenants = {name: asdict(usage) for name, usage in sorted(self._tenants.items())}
        return {"since": self.started_at, "tenants": tenants}
