"""`modelyard bench compare A.json B.json ...`: a side-by-side table and a plot.

Each report is labelled by its `label` field or its file name. For sweeps, runs are matched by
their label (e.g. "concurrency 8") so the table lines up the same load across reports.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from modelyard.bench.report import run_label

_ROWS: tuple[tuple[str, str], ...] = (
    ("request_throughput", "req/s"),
    ("output_throughput", "output tok/s"),
    ("goodput", "goodput req/s"),
    ("ttft.p50", "TTFT p50 ms"),
    ("ttft.p99", "TTFT p99 ms"),
    ("tpot.p50", "TPOT p50 ms"),
    ("itl.p50", "ITL p50 ms"),
    ("itl.p99", "ITL p99 ms"),
    ("e2e.p50", "E2E p50 ms"),
    ("e2e.p99", "E2E p99 ms"),
    ("failed", "failed requests"),
)


def load_reports(paths: list[str]) -> dict[str, dict[str, Any]]:
    reports: dict[str, dict[str, Any]] = {}
    for p in paths:
        path = Path(p)
        if path.is_dir():  # a `modelyard bench --out` folder
            path = path / "report.json"
        report = json.loads(path.read_text())
        if "runs" not in report:
            raise ValueError(f"{p}: not a modelyard bench report")
        label = report.get("label") or Path(p).stem
        while label in reports:
            label += "'"
        reports[label] = report
    return reports


def _value(summary: dict[str, Any], key: str) -> str:
    metric, _, stat = key.partition(".")
    if stat:
        v = summary["latency"][metric][stat]
        return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v * 1000:.1f}"
    v = summary.get(metric)
    if v is None:
        return "–"
    return str(v) if isinstance(v, int) else f"{v:.2f}"


def compare_markdown(reports: dict[str, dict[str, Any]]) -> str:
    """One table per run label found in any report; a column per report."""
    labels = list(reports)
    run_labels: list[str] = []
    for report in reports.values():
        for run in report["runs"]:
            if run_label(run) not in run_labels:
                run_labels.append(run_label(run))
    out: list[str] = []
    for rl in run_labels:
        out += [
            f"### {rl}",
            "",
            "| metric | " + " | ".join(labels) + " |",
            "|---" * (len(labels) + 1) + "|",
        ]
        runs = {
            lb: next((r for r in reports[lb]["runs"] if run_label(r) == rl), None) for lb in labels
        }
        for key, title in _ROWS:
            cells = [_value(r["summary"], key) if r else "–" for r in runs.values()]
            out.append(f"| {title} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)
