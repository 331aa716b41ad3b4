"""PNG plots of bench reports (matplotlib, Agg backend: no display needed).

- `plot_cdfs`: latency CDFs (TTFT, TPOT, ITL, E2E) with one line per run;
- `plot_sweep`: output/request throughput and TTFT/ITL p50/p99 against concurrency;
- `plot_compare`: the same key figures for several reports, side by side.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from modelyard.bench.report import run_label

_CDF_METRICS = ("ttft", "tpot", "itl", "e2e")


def _samples(run: dict[str, Any], name: str) -> list[float]:
    reqs = [r for r in run["requests"] if r["ok"]]
    if name == "itl":
        return sorted(g for r in reqs for g in r["itl"])
    return sorted(v for r in reqs if (v := r.get(name)) is not None)


def plot_cdfs(report: dict[str, Any], path: Path, label_prefix: str = "") -> Path:
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, name in zip(axes.flat, _CDF_METRICS, strict=True):
        for run in report["runs"]:
            values = [v * 1000 for v in _samples(run, name)]
            if values:
                ys = [(i + 1) / len(values) for i in range(len(values))]
                ax.step(values, ys, where="post", label=label_prefix + run_label(run))
        ax.set_title(f"{name.upper()} CDF")
        ax.set_xlabel("ms")
        ax.set_ylabel("fraction of samples")
        ax.grid(alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _series(runs: list[dict[str, Any]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {
        k: [] for k in ("c", "tok", "req", "ttft50", "ttft99", "itl50", "itl99")
    }
    for run in runs:
        s = run["summary"]
        arrivals = run["config"]["arrivals"]
        x = arrivals["rate"] if arrivals["mode"] == "poisson" else arrivals["concurrency"]
        out["c"].append(float(x))
        out["tok"].append(s["output_throughput"])
        out["req"].append(s["request_throughput"])
        for m in ("ttft", "itl"):
            for q in ("50", "99"):
                v = s["latency"][m][f"p{q}"]
                out[m + q].append(math.nan if v is None else v * 1000)
    return out


def plot_sweep(reports: dict[str, dict[str, Any]], path: Path) -> Path:
    """Throughput and latency against concurrency, one line per report (label -> report)."""
    fig, (ax_t, ax_l) = plt.subplots(1, 2, figsize=(11, 4.5))
    for label, report in reports.items():
        s = _series(report["runs"])
        ax_t.plot(s["c"], s["tok"], marker="o", label=f"{label} output tok/s")
        ax_l.plot(s["c"], s["ttft50"], marker="o", label=f"{label} TTFT p50")
        ax_l.plot(s["c"], s["ttft99"], marker="x", linestyle="--", label=f"{label} TTFT p99")
        ax_l.plot(s["c"], s["itl50"], marker="s", label=f"{label} ITL p50")
        ax_l.plot(s["c"], s["itl99"], marker="^", linestyle=":", label=f"{label} ITL p99")
    for ax, title, unit in ((ax_t, "Throughput", "tokens/s"), (ax_l, "Latency", "ms")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency (Poisson sweeps: request rate)")
        ax.set_ylabel(unit)
        ax.set_title(f"{title} vs concurrency")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_compare(reports: dict[str, dict[str, Any]], path: Path) -> Path:
    """Grouped bars of key figures (first run of each report), or lines if all are sweeps."""
    if all(len(r["runs"]) > 1 for r in reports.values()):
        return plot_sweep(reports, path)
    keys = (
        ("output_throughput", "output tok/s"),
        ("ttft", "TTFT p50 ms"),
        ("itl", "ITL p50 ms"),
        ("e2e", "E2E p50 ms"),
    )
    fig, axes = plt.subplots(1, len(keys), figsize=(3.2 * len(keys), 4))
    labels = list(reports)
    for ax, (key, title) in zip(axes, keys, strict=True):
        values = []
        for label in labels:
            s = reports[label]["runs"][0]["summary"]
            v = (
                s[key]
                if key == "output_throughput"
                else (s["latency"][key]["p50"] or math.nan) * 1000
            )
            values.append(v)
        ax.bar(range(len(labels)), values, color=[f"C{i}" for i in range(len(labels))])
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
