"""`GET /metrics`: the process's Prometheus metrics in the text exposition format.

Engine gauges and counters are refreshed from the registered stats sources just before the
registry is rendered (see `collectors.py`).
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from modelyard.observability.collectors import refresh_engine_metrics

router = APIRouter()


@router.get("/metrics", include_in_schema=False)
def metrics() -> Response:
    """Render the default registry (sync handler: runs in the threadpool, off the event loop)."""
    refresh_engine_metrics()
    return Response(content=generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)
