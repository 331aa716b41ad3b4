from __future__ import annotations

import json
import math
import random
from pathlib import Path

import numpy as np
import pytest

from modelyard.bench.cli import write_report
from modelyard.bench.client import RequestResult
from modelyard.bench.compare import compare_markdown, load_reports
from modelyard.bench.plots import plot_compare
from modelyard.bench.report import (
    build_run,
    markdown_report,
    meets_slo,
    parse_slo,
    percentile,
    summarize,
)

pytestmark = pytest.mark.unit


def test_percentiles_match_numpy() -> None:
    rng = random.Random(3)
    for n in (1, 2, 7, 100, 101):
        values = [rng.expovariate(1.0) for _ in range(n)]
        for q in (0, 50, 90, 95, 99, 100):
            assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))
    assert math.isnan(percentile([], 50))
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def _req(ttft: float, itl: list[float], ok: bool = True, error: str | None = None) -> RequestResult:
    return RequestResult(
        ok=ok, start=0.0, e2e=ttft + sum(itl), ttft=ttft, itl=itl,
        output_tokens=len(itl) + 1, usage_reported=True, error=error,
    )  # fmt: skip


def test_goodput_counts_requests_meeting_every_slo() -> None:
    slo = parse_slo("ttft=0.5,itl=0.1")
    assert slo == {"ttft": 0.5, "itl": 0.1}
    results = [
        _req(0.2, [0.05, 0.05]),  # good
        _req(0.6, [0.05]),  # TTFT too slow
        _req(0.1, [0.09, 0.2]),  # mean ITL 0.145 > 0.1
        _req(0.1, [0.02, 0.15, 0.02]),  # one slow gap, mean 0.063: good
        _req(0.1, [], ok=False, error="http_500"),
    ]
    assert [meets_slo(r, slo) for r in results] == [True, False, False, True, False]
    s = summarize(results, duration_s=2.0, slo=slo)
    assert s["goodput"] == pytest.approx(1.0)  # 2 good requests / 2 s
    assert s["slo_attainment"] == pytest.approx(2 / 5)
    assert s["errors"] == {"http_500": 1}
    assert s["successful"] == 4
    assert s["request_throughput"] == pytest.approx(2.0)
    assert s["total_output_tokens"] == 3 + 2 + 3 + 4
    # ITL is pooled over requests
    pooled = [0.05, 0.05, 0.05, 0.09, 0.2, 0.02, 0.15, 0.02]
    assert s["latency"]["itl"]["p50"] == pytest.approx(float(np.percentile(pooled, 50)))
    # TPOT per request = (e2e - ttft) / (n - 1)
    assert _req(0.1, [0.09, 0.2]).tpot == pytest.approx(0.145)
    for bad in ("ttft", "foo=1", "ttft=-1"):
        with pytest.raises(ValueError):
            parse_slo(bad)


def _report(label: str, concurrencies: list[int], scale: float) -> dict[str, object]:
    runs = []
    for c in concurrencies:
        results = [_req(0.1 * scale * c, [0.02 * scale] * 9) for _ in range(10)]
        config = {"arrivals": {"mode": "closed", "concurrency": c, "rate": 1.0}}
        runs.append(build_run(config, results, duration_s=1.0, slo={"ttft": 0.3}))
    return {"label": label, "runs": runs}


def test_report_json_markdown_and_plots_written(tmp_path: Path) -> None:
    report = _report("fast", [1, 2, 4], 1.0)
    md = markdown_report(report)
    assert "concurrency 4" in md
    assert "| TTFT | 400.0 |" in md  # mean TTFT at c=4 = 0.4 s
    assert "goodput" in md
    write_report(report, md, tmp_path / "a")
    data = json.loads((tmp_path / "a" / "report.json").read_text())
    assert len(data["runs"]) == 3
    assert len(data["runs"][0]["requests"]) == 10
    assert data["runs"][0]["requests"][0]["itl"] == [0.02] * 9
    for png in ("latency_cdf.png", "sweep.png"):
        assert (tmp_path / "a" / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_lines_up_runs_side_by_side(tmp_path: Path) -> None:
    for label, scale in (("fast", 1.0), ("slow", 2.0)):
        write_report(_report(label, [1, 2], scale), "", tmp_path / label, plots=False)
    reports = load_reports([str(tmp_path / "fast/report.json"), str(tmp_path / "slow")])  # a folder
    assert list(reports) == ["fast", "slow"]
    md = compare_markdown(reports)
    assert "| metric | fast | slow |" in md
    assert "### concurrency 2" in md
    assert "| TTFT p50 ms | 200.0 | 400.0 |" in md
    assert "| ITL p50 ms | 20.0 | 40.0 |" in md
    plot_compare(reports, tmp_path / "cmp.png")
    assert (tmp_path / "cmp.png").stat().st_size > 1000
    single = {k: {**v, "runs": v["runs"][:1]} for k, v in reports.items()}
    plot_compare(single, tmp_path / "bars.png")
    assert (tmp_path / "bars.png").stat().st_size > 1000
