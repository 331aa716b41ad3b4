from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from prometheus_client import Counter, Gauge, Histogram

from modelyard.observability import metrics

pytestmark = pytest.mark.unit

DASHBOARD = Path(__file__).parents[3] / "deploy" / "grafana" / "modelyard-dashboard.json"


def test_dashboard_queries_only_metrics_that_exist() -> None:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) > 20
    known: set[str] = set()
    for obj in vars(metrics).values():
        if isinstance(obj, Counter):
            known.add(obj._name + "_total")
        elif isinstance(obj, Histogram):
            known.update(obj._name + s for s in ("_bucket", "_sum", "_count"))
        elif isinstance(obj, Gauge):
            known.add(obj._name)
    used = {m for e in exprs for m in re.findall(r"modelyard:[a-z0-9_]+", e)}
    assert used <= known, used - known
    # every metric family appears on the dashboard
    families = {re.sub(r"_(total|bucket|sum|count)$", "", m) for m in used}
    assert len(families) >= 30
