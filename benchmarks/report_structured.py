"""The "Structured output" section of docs/benchmarks.md, from `structured_serving.py`'s JSON.

Per host (targets.host_of), over its default runs at c=32: the median of each run's constrained /
unconstrained ratios (output tok/s, ITL p50) against their targets, and the mean output tokens
per request of both variants (equal when the schema outlasts the output budget, as it should).
Then the compile times of the typical schemas from the latest such run. No run, no section.
"""

from __future__ import annotations

import os
import statistics
import textwrap
from pathlib import Path
from typing import Any

import targets

INTRO = (
    "`structured_serving.py` serves SmolLM2 with `modelyard serve` and drives it with vLLM's "
    "`vllm bench serve` at c=32: streaming completions with random 128-token prompts, greedy, "
    "either every one under a JSON Schema (`response_format`, a list of long strings) or none "
    "(EOS ignored), 128 output tokens in both (the schema's shortest answer is longer). The two "
    "variants alternate round by round on the same server, each run with prompts of its own, "
    "and each figure is the median of the per-round ratios. Compile time is the engine's "
    "(`modelyard:structured_compile_seconds`, to the millisecond) on a schema's first request; "
    "a second request with the same schema finds it compiled."
)


def _runs(results: Path) -> list[tuple[Path, dict[str, Any]]]:
    """(path, data) of the default c=32 runs, oldest first."""
    found = [
        (path, data)
        for path, kind, data in targets.default_runs([results])
        if kind == "structured_serving" and data["args"]["concurrency"] == 32
    ]
    return sorted(found, key=lambda item: (item[1]["machine"].get("time") or "", str(item[0])))


def _median_range(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def _verdict(key: str, values: list[float]) -> str:
    target = targets.TARGETS[key]
    return "met" if target.meets(statistics.median(values)) else "**not met**"


def _mean_tokens(data: dict[str, Any], variant: str) -> float:
    return statistics.fmean(r["runs"][variant]["mean_output_tokens"] for r in data["rounds"])


def ratio_table(runs: list[tuple[Path, dict[str, Any]]]) -> str:
    """One row per host: tok/s and ITL p50 ratios (median, range, verdict), output tokens."""
    hosts: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for _, data in runs:
        key = (targets.host_of(data["machine"]), data["args"]["dtype"])
        hosts.setdefault(key, []).append(data)
    lines = [
        "| host | dtype | runs | tok/s ÷ unconstrained (≥ 0.9) | ITL p50 ÷ unconstrained (≤ 1.1) "
        "| mean output tokens, JSON Schema / unconstrained |",
        "|---|---|---|---|---|---|",
    ]
    for (host, dtype), found in sorted(hosts.items()):
        tok_s = [d["ratios_median"]["output_tok_s"] for d in found]
        itl = [d["ratios_median"]["itl_p50"] for d in found]
        con = statistics.fmean(_mean_tokens(d, "constrained") for d in found)
        unc = statistics.fmean(_mean_tokens(d, "unconstrained") for d in found)
        cells = [
            f"`{host}`",
            dtype,
            str(len(found)),
            f"{_median_range(tok_s)}, {_verdict('structured_tok_s', tok_s)}",
            f"{_median_range(itl)}, {_verdict('structured_itl_p50', itl)}",
            f"{con:.1f} / {unc:.1f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def compile_table(data: dict[str, Any]) -> str:
    """Per typical schema: the engine's compile time and the TTFT of its first and second
    request."""
    lines = [
        "| schema | compile, first request | TTFT, first request | TTFT, second request |",
        "|---|---|---|---|",
    ]
    for name, found in data["compile"]["schemas"].items():
        first, cached = found["first"], found["cached"]
        lines.append(
            f"| {name} | {first['compile_ms']:.1f} ms | {first['ttft_ms']:.0f} ms "
            f"| {cached['ttft_ms']:.0f} ms |"
        )
    return "\n".join(lines)


def _fill(text: str) -> str:
    return textwrap.fill(text, width=100, break_on_hyphens=False, break_long_words=False)


def section(results: Path, link_prefix: str) -> str | None:
    """The section's markdown, or None when no run is there yet."""
    runs = _runs(results)
    if not runs:
        return None
    path, latest = runs[-1]
    name = os.path.relpath(path, results)
    compiled = (
        f"Compile times in the latest run ([{name}]({link_prefix}{name}), "
        f"`{latest['machine'].get('host_kind')}`, {latest['machine'].get('cpu_model')}); "
        f"the second request's compile time was {_second_compile(latest)}. The first "
        "constrained request after the server starts also sets up the tokenizer for grammars "
        "(a `json_object` request, before these): TTFT "
        f"{latest['compile']['grammar_setup_request']['ttft_ms']:.0f} ms."
    )
    return "\n\n".join(
        [
            "## Structured output",
            _fill(INTRO),
            ratio_table(runs),
            _fill(compiled),
            compile_table(latest),
        ]
    )


def _second_compile(data: dict[str, Any]) -> str:
    cached = [s["cached"]["compile_ms"] for s in data["compile"]["schemas"].values()]
    return "0 for every schema" if not any(cached) else f"at most {max(cached):.1f} ms"
