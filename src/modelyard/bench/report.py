"""Summaries of a run: percentiles, throughput, goodput, errors; JSON and Markdown out.

Definitions (seconds; the same as vLLM's `benchmark_serving` where both define one):
- TTFT, E2E: per request; TPOT: per request (e2e - ttft) / (output tokens - 1);
- ITL: every per-token gap of every request pooled together;
- request throughput: successful requests / run duration; output throughput: their output
  tokens / run duration (duration = first send -> last completion);
- goodput: successful requests that meet *every* SLO, per second. SLO keys: `ttft`, `tpot`,
  `e2e`, and `itl`, compared with the request's own mean ITL (for a streaming request that is
  its average decode gap; a single slow gap does not fail it, the p99 ITL shows those).
Percentiles interpolate linearly between order statistics (numpy's default).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import asdict
from typing import Any

from modelyard.bench.client import RequestResult

PERCENTILES = (50, 90, 95, 99)
SLO_KEYS = ("ttft", "tpot", "itl", "e2e")
LATENCY_METRICS = ("ttft", "tpot", "itl", "e2e")


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation; NaN for no values."""
    if not 0 <= q <= 100:
        raise ValueError("q must be in [0, 100]")
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def parse_slo(text: str | None) -> dict[str, float]:
    """`ttft=0.5,itl=0.1` -> {"ttft": 0.5, "itl": 0.1} (seconds)."""
    if not text:
        return {}
    slo: dict[str, float] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in SLO_KEYS:
            raise ValueError(f"SLO entries are key=seconds with key in {SLO_KEYS}, not {part!r}")
        slo[key] = float(value)
        if slo[key] <= 0:
            raise ValueError("SLO values must be > 0")
    return slo


def mean_itl(r: RequestResult) -> float | None:
    return sum(r.itl) / len(r.itl) if r.itl else None


def meets_slo(r: RequestResult, slo: dict[str, float]) -> bool:
    """True when the request succeeded and each SLO it has a value for holds.

    A request without a value for a key (e.g. 1 output token: no ITL) passes that key, except
    `ttft` on a streaming request that never produced a token (then it fails).
    """
    if not r.ok:
        return False
    values = {"ttft": r.ttft, "tpot": r.tpot, "itl": mean_itl(r), "e2e": r.e2e}
    for key, limit in slo.items():
        value = values[key]
        if value is not None and value > limit:
            return False
    return True


def _stats(values: list[float]) -> dict[str, float]:
    out = {"mean": sum(values) / len(values) if values else math.nan}
    out.update({f"p{q}": percentile(values, q) for q in PERCENTILES})
    out["max"] = max(values) if values else math.nan
    return out


def summarize(
    results: list[RequestResult], duration_s: float, slo: dict[str, float] | None = None
) -> dict[str, Any]:
    """The summary block of a report (see the module docstring for the definitions)."""
    ok = [r for r in results if r.ok]
    duration = max(duration_s, 1e-9)
    out_tokens = sum(r.output_tokens for r in ok)
    samples: dict[str, list[float]] = {
        "ttft": [r.ttft for r in ok if r.ttft is not None],
        "tpot": [t for r in ok if (t := r.tpot) is not None],
        "itl": [g for r in ok for g in r.itl],
        "e2e": [r.e2e for r in ok],
    }
    summary: dict[str, Any] = {
        "requests": len(results),
        "successful": len(ok),
        "failed": len(results) - len(ok),
        "errors": dict(Counter(r.error or "other" for r in results if not r.ok)),
        "duration_s": duration_s,
        "request_throughput": len(ok) / duration,
        "output_throughput": out_tokens / duration,
        "total_output_tokens": out_tokens,
        "total_prompt_tokens": sum(r.prompt_tokens for r in ok),
        "usage_reported": all(r.usage_reported for r in ok) if ok else False,
        "latency": {name: _stats(vals) for name, vals in samples.items()},
    }
    if slo:
        good = sum(1 for r in ok if meets_slo(r, slo))
        summary["slo"] = slo
        summary["goodput"] = good / duration
        summary["slo_attainment"] = good / len(results) if results else math.nan
    return summary


def result_to_dict(r: RequestResult) -> dict[str, Any]:
    d = asdict(r)
    d["tpot"] = r.tpot
    return d


def result_from_dict(d: dict[str, Any]) -> RequestResult:
    fields = {k: v for k, v in d.items() if k != "tpot"}
    return RequestResult(**fields)


def build_run(
    config: dict[str, Any], results: list[RequestResult], duration_s: float, slo: dict[str, float]
) -> dict[str, Any]:
    """One run of a report: its config, summary and every raw per-request sample."""
    return {
        "config": config,
        "summary": summarize(results, duration_s, slo),
        "requests": [result_to_dict(r) for r in results],
    }


def _ms(x: float) -> str:
    return "–" if math.isnan(x) else f"{x * 1000:.1f}"


def markdown_run(run: dict[str, Any], title: str | None = None) -> str:
    """A Markdown summary: throughput lines, then a latency table in milliseconds."""
    s = run["summary"]
    lines = [f"### {title}", ""] if title else []
    lines += [
        f"- requests: {s['successful']} ok / {s['requests']} sent in {s['duration_s']:.2f} s",
        f"- request throughput: {s['request_throughput']:.2f} req/s",
        f"- output throughput: {s['output_throughput']:.1f} tok/s"
        + ("" if s["usage_reported"] else " (tokens counted by chunks)"),
    ]
    if "goodput" in s:
        slo = ", ".join(f"{k} ≤ {v * 1000:g} ms" for k, v in s["slo"].items())
        lines.append(f"- goodput ({slo}): {s['goodput']:.2f} req/s ({s['slo_attainment']:.1%})")
    if s["errors"]:
        lines.append("- errors: " + ", ".join(f"{k}: {v}" for k, v in sorted(s["errors"].items())))
    cols = ["mean", *[f"p{q}" for q in PERCENTILES], "max"]
    lines += ["", "| ms | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name in LATENCY_METRICS:
        st = s["latency"][name]
        lines.append(f"| {name.upper()} | " + " | ".join(_ms(st[c]) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def markdown_report(report: dict[str, Any]) -> str:
    parts = [f"## modelyard bench: {report.get('label', '')}".rstrip(": ") + "\n"]
    for run in report["runs"]:
        parts.append(markdown_run(run, run_label(run)))
    if len(report["runs"]) > 1:
        parts.append(sweep_table(report["runs"]))
    return "\n".join(parts)


def run_label(run: dict[str, Any]) -> str:
    a = run["config"].get("arrivals", {})
    mode = a.get("mode", "closed")
    if mode == "closed":
        return f"concurrency {a.get('concurrency')}"
    if mode == "poisson":
        return f"poisson {a.get('rate')} req/s"
    return f"bursts of {a.get('burst_size')} every {a.get('burst_interval_s')} s"


def sweep_table(runs: list[dict[str, Any]]) -> str:
    head = (
        "| run | req/s | out tok/s | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | E2E p50 | errors |"
    )
    lines = ["", head, "|---" * 9 + "|"]
    for run in runs:
        s = run["summary"]
        lat = s["latency"]
        lines.append(
            f"| {run_label(run)} | {s['request_throughput']:.2f} | {s['output_throughput']:.1f} "
            f"| {_ms(lat['ttft']['p50'])} | {_ms(lat['ttft']['p99'])} | {_ms(lat['itl']['p50'])} "
            f"| {_ms(lat['itl']['p99'])} | {_ms(lat['e2e']['p50'])} | {s['failed']} |"
        )
    return "\n".join(lines) + "\n"
