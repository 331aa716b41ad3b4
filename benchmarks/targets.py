"""Which of the engine's performance targets the result files show met, per host.

`python benchmarks/targets.py benchmarks/results/avx512-bf16/zen4` reads every result file under
the paths given (`compare_servers.py` summaries, `engine_throughput.py` and `serving.py` JSON),
groups them by the host that made them (kind, CPU model, signature, cache) and prints, for each
target, the latest run, the median and range over all runs, how many runs meet it, and whether
the median does. Runs that played a lower kind (`--emulate`), served other weights (`--weights`)
or ran with a runner switch set (`MODELYARD_*`) are left out: the targets are for the defaults.

The targets: through HTTP at c=32, output tok/s >= 1.3x vLLM's in bf16 and float32; at c=1,
ITL p50 <= 0.75x vLLM's and <= llama.cpp's (bf16 GGUF); HTTP >= 0.95x the in-process engine at
c=32; bf16 share of the adjacent matmul ceiling >= 40 % on `avx512-bf16` hosts and >= 25 % on
`amx` hosts; peak RSS of the process tree <= vLLM's; at c=32 with every request under a JSON
Schema (`structured_serving.py`), output tok/s >= 0.9x and ITL p50 <= 1.1x unconstrained
requests' on the same server. `report_page.py` writes these verdicts,
per host, into docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SHARE_TARGETS = {"avx512-bf16": 0.40, "amx": 0.25}


@dataclass(frozen=True)
class Target:
    key: str
    text: str
    threshold: float
    at_least: bool  # True: value >= threshold meets it; False: value <= threshold

    def meets(self, value: float) -> bool:
        return value >= self.threshold if self.at_least else value <= self.threshold


@dataclass(frozen=True)
class Value:
    key: str
    value: float
    time: str
    commit: str
    file: str


TARGETS = {
    t.key: t
    for t in [
        Target("http_c32_bfloat16", "HTTP c=32 bf16 tok/s, modelyard / vLLM", 1.3, True),
        Target("http_c32_float32", "HTTP c=32 float32 tok/s, modelyard / vLLM", 1.3, True),
        Target("itl_c1_bfloat16", "HTTP c=1 bf16 ITL p50, modelyard / vLLM", 0.75, False),
        Target("itl_c1_float32", "HTTP c=1 float32 ITL p50, modelyard / vLLM", 0.75, False),
        Target("itl_c1_llamacpp", "HTTP c=1 bf16 ITL p50, modelyard / llama.cpp", 1.0, False),
        Target("server_cost_bfloat16", "HTTP / in-process tok/s, c=32 bf16", 0.95, True),
        Target("server_cost_float32", "HTTP / in-process tok/s, c=32 float32", 0.95, True),
        Target("rss_bfloat16", "peak RSS of the tree, c=32 bf16, modelyard / vLLM", 1.0, False),
        Target("rss_float32", "peak RSS of the tree, c=32 float32, modelyard / vLLM", 1.0, False),
        Target("structured_tok_s", "c=32 tok/s, JSON Schema / unconstrained", 0.9, True),
        Target("structured_itl_p50", "c=32 ITL p50, JSON Schema / unconstrained", 1.1, False),
        Target("gguf_itl_c1", "c=1 ITL p50 on a 1B Q4_K_M GGUF, modelyard / llama.cpp", 0.8, False),
        Target(
            "gguf_ttft_c1", "c=1 TTFT p50 on a 1B Q4_K_M GGUF, modelyard / llama.cpp", 1.0, False
        ),
        Target(
            "gguf_tok_s_c32", "c=32 tok/s on a 1B Q4_K_M GGUF, modelyard / llama-server", 1.5, True
        ),
        Target(
            "gguf_ttft_c32",
            "c=32 TTFT p50 on a 1B Q4_K_M GGUF, modelyard / llama-server",
            1.0,
            False,
        ),
    ]
}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _point(servers: dict[str, Any], name: str, point: str, field: str) -> float | None:
    value = servers.get(name, {}).get("points", {}).get(point, {}).get(field)
    return float(value) if value is not None else None


def _compare_servers(data: dict[str, Any]) -> Iterator[tuple[str, float | None]]:
    dtype, servers = data["args"]["dtype"], data["servers"]
    vllm_c32 = _point(servers, "vllm", "32", "output_tok_s")
    if vllm_c32:  # a c=32 point: throughput, and the trees' peak RSS at that load
        yield (
            f"http_c32_{dtype}",
            _ratio(_point(servers, "modelyard", "32", "output_tok_s"), vllm_c32),
        )
        rss = [servers.get(s, {}).get("peak_rss_mb") for s in ("modelyard", "vllm")]
        yield f"rss_{dtype}", _ratio(rss[0], rss[1])
    itl = _point(servers, "modelyard", "1", "itl_p50_ms")
    yield f"itl_c1_{dtype}", _ratio(itl, _point(servers, "vllm", "1", "itl_p50_ms"))
    if dtype == "bfloat16":
        yield "itl_c1_llamacpp", _ratio(itl, _point(servers, "llamacpp", "1", "itl_p50_ms"))


def _engine_throughput(data: dict[str, Any]) -> Iterator[tuple[str, float | None]]:
    bf16 = data["results"].get("bfloat16") or {}
    if "adjacent_ceiling" in bf16.get("modelyard", {}):  # the ceiling measured beside the run
        yield "share_bfloat16", bf16["ratios"].get("modelyard_fraction_of_ceiling_c32")


def _serving(data: dict[str, Any]) -> Iterator[tuple[str, float | None]]:
    yield (
        f"server_cost_{data['args']['dtype']}",
        data["ratios"].get("http_over_in_process_c32_median"),
    )


def _structured_serving(data: dict[str, Any]) -> Iterator[tuple[str, float | None]]:
    if data["args"]["concurrency"] == 32:  # the targets' load; smaller runs are smoke tests
        yield "structured_tok_s", data["ratios_median"]["output_tok_s"]
        yield "structured_itl_p50", data["ratios_median"]["itl_p50"]


def _gguf_serving(data: dict[str, Any]) -> Iterator[tuple[str, float | None]]:
    if "q4km" not in Path(data["gguf"]["path"]).stem:
        return
    if data["args"]["concurrency"] == 1:
        yield "gguf_itl_c1", data["ratios_median"]["itl_p50"]
        yield "gguf_ttft_c1", data["ratios_median"]["ttft_p50"]
    elif data["args"]["concurrency"] == 32:
        yield "gguf_tok_s_c32", data["ratios_median"]["output_tok_s"]
        yield "gguf_ttft_c32", data["ratios_median"]["ttft_p50"]


READERS: dict[str, Callable[[dict[str, Any]], Iterator[tuple[str, float | None]]]] = {
    "compare_servers": _compare_servers,
    "engine_throughput": _engine_throughput,
    "serving": _serving,
    "structured_serving": _structured_serving,
    "gguf_serving": _gguf_serving,
}


def _reader(path: Path) -> str | None:
    name = path.parent.name if path.name == "summary.json" else path.name
    return next((r for r in READERS if name.startswith(r)), None)


def _default_run(data: dict[str, Any]) -> bool:
    machine, args = data.get("machine", {}), data.get("args", {})
    return not (machine.get("emulated") or args.get("weights") or machine.get("modelyard_env"))


def host_of(machine: dict[str, Any]) -> str:
    """A host's label: its kind, CPU model, signature and cache (where the file recorded them)."""
    parts = [machine.get(k) or "?" for k in ("cpu_model", "cpu_signature", "cache_size")]
    return f"{machine.get('host_kind') or '?'}: " + ", ".join(map(str, parts))


def default_runs(paths: list[Path], since: str = "") -> Iterator[tuple[Path, str, dict[str, Any]]]:
    """(path, reader name, data) of every result file under paths that a reader knows and that
    ran the defaults; with `since`, the runs whose recorded time (ISO 8601) is not earlier."""
    files = [f for p in paths for f in ([p] if p.is_file() else sorted(p.rglob("*.json")))]
    for path in files:
        kind = _reader(path)
        if kind is None:
            continue
        data = json.loads(path.read_text())
        machine = data.get("machine", {})
        if _default_run(data) and (machine.get("time") or "") >= since:
            yield path, kind, data


def read_results(paths: list[Path], since: str = "") -> dict[str, list[Value]]:
    """Every default run's values under paths, by host; with `since`, the runs whose recorded
    time (ISO 8601) is not earlier."""
    hosts: dict[str, list[Value]] = {}
    for path, kind, data in default_runs(paths, since):
        machine = data.get("machine", {})
        commit = machine.get("modelyard_commit") or "?"
        stamp = (machine.get("time") or "", commit, os.path.relpath(path))
        try:
            found = list(READERS[kind](data))
        except (KeyError, TypeError, AttributeError):  # an older or foreign file of that name
            print(f"skipped {path}: not in the shape {kind} writes", file=sys.stderr)
            continue
        for key, value in found:
            if value is not None:
                hosts.setdefault(host_of(machine), []).append(Value(key, value, *stamp))
    return hosts


def targets_of(kind: str) -> dict[str, Target]:
    """The targets of a host kind: every kind's, plus the bf16 share where the kind has one."""
    found = dict(TARGETS)
    if kind in SHARE_TARGETS:
        text = "bf16 share of the adjacent ceiling, c=32"
        found["share_bfloat16"] = Target("share_bfloat16", text, SHARE_TARGETS[kind], True)
    return found


def _row(target: Target, runs: list[Value]) -> dict[str, Any]:
    numbers = [v.value for v in runs]
    median = statistics.median(numbers)
    return {
        **asdict(target),
        "latest": asdict(runs[-1]),
        "median": round(median, 4),
        "range": [round(min(numbers), 4), round(max(numbers), 4)],
        "runs": len(runs),
        "runs_meeting": sum(map(target.meets, numbers)),
        "met_by_median": target.meets(median),
    }


def verdicts(host: str, values: list[Value]) -> list[dict[str, Any]]:
    """One row per target the values cover: latest, median, range, runs meeting it."""
    rows = []
    for key, target in targets_of(host.split(":")[0]).items():
        runs = sorted((v for v in values if v.key == key), key=lambda v: (v.time, v.file))
        if runs:
            rows.append(_row(target, runs))
    return rows


def table(host: str, rows: list[dict[str, Any]]) -> str:
    lines = [
        f"## {host}",
        "",
        "| target | needs | latest (commit) | median (range) | runs meeting | by the median |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        needs = ("≥ " if row["at_least"] else "≤ ") + f"{row['threshold']:g}"
        latest = f"{row['latest']['value']:.3f} ({row['latest']['commit']})"
        spread = f"{row['median']:.3f} ({row['range'][0]:.3f}-{row['range'][1]:.3f})"
        met = "met" if row["met_by_median"] else "**not met**"
        counts = f"{row['runs_meeting']} of {row['runs']}"
        lines.append(f"| {row['text']} | {needs} | {latest} | {spread} | {counts} | {met} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="result files or folders")
    parser.add_argument("--since", default="", help="only runs from this time on: 2026-12-03")
    parser.add_argument("--json", type=Path, help="also write the verdicts here")
    args = parser.parse_args()
    found = read_results(args.paths, args.since)
    report = {host: verdicts(host, values) for host, values in found.items()}
    print("\n\n".join(table(host, rows) for host, rows in sorted(report.items())))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
