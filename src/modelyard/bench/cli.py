"""`modelyard bench`: load-test an OpenAI-compatible, /predict or KServe endpoint.

    modelyard bench --base-url http://127.0.0.1:8000 --model smollm2-135m \
        --concurrency 8 --num-requests 200 --input-len 128 --output-len 128 --out results/
    modelyard bench compare results/a/report.json results/b/report.json --out cmp/

Writes `report.json` (config, summary and every raw per-request sample, per run),
`report.md`, and PNG plots into `--out`; prints the Markdown to stdout. Exit status 0 when the
run completed (even with failed requests: they are counted), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from modelyard.bench.client import EndpointConfig, RequestResult
from modelyard.bench.compare import compare_markdown, load_reports
from modelyard.bench.loadgen import ArrivalConfig, RunResult, run_load
from modelyard.bench.plots import plot_cdfs, plot_compare, plot_sweep
from modelyard.bench.report import build_run, markdown_report, parse_slo
from modelyard.bench.workloads import LengthDist, Workload, WorkloadConfig, load_tokenizer


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench_command", required=False)
    cmp = sub.add_parser("compare", help="side-by-side table and plot of several reports")
    cmp.add_argument("reports", nargs="+", help="report.json files or the folders holding them")
    cmp.add_argument("--out", default=None, help="folder for compare.md and compare.png")

    t = parser.add_argument_group("target")
    t.add_argument("--base-url", default="http://127.0.0.1:8000")
    t.add_argument("--model", help="model name sent to the server")
    t.add_argument(
        "--endpoint", default="chat", choices=["chat", "completions", "predict", "kserve"]
    )
    t.add_argument("--payload", help="predict/kserve: a JSON file with the request body")
    t.add_argument("--api-key", default=None)
    t.add_argument("--timeout", type=float, default=60.0, help="per-request timeout (s)")

    a = parser.add_argument_group("arrivals")
    a.add_argument("--arrival", default="closed", choices=["closed", "poisson", "burst"])
    a.add_argument(
        "--concurrency",
        type=int,
        default=1,
        help="closed: workers; open: max in flight (0: no cap)",
    )
    a.add_argument("--rate", type=float, default=1.0, help="poisson: requests/s")
    a.add_argument("--burst", default="8,1.0", help="burst: SIZE,INTERVAL_S")
    a.add_argument("--num-requests", type=int, default=None, help="default 100 unless --duration")
    a.add_argument("--duration", type=float, default=None, help="seconds of issuing requests")
    a.add_argument("--warmup", type=int, default=0, help="unmeasured requests sent first")
    a.add_argument("--sweep", default=None, help="concurrency=1,2,4,... or rate=1,2,4,...")

    w = parser.add_argument_group("workload")
    w.add_argument("--input-len", default="128", help="N | uniform:LO,HI | normal:MEAN,SD (tokens)")
    w.add_argument("--output-len", default="128", help="same forms; sent as max_tokens")
    w.add_argument("--dataset", help='JSONL, one {"prompt": ..., "output_len"?: N} per line')
    w.add_argument("--tokenizer", help="local tokenizer folder: exact prompt token lengths")
    w.add_argument(
        "--seed", type=int, default=0, help="prompts' seed; each sweep point draws its own"
    )
    w.add_argument("--no-stream", action="store_true")
    w.add_argument("--ignore-eos", action="store_true")
    w.add_argument("--min-tokens", type=int, default=None)
    w.add_argument(
        "--no-usage", action="store_true", help="don't ask for stream_options.include_usage"
    )
    w.add_argument("--continuous-usage", action="store_true", help="ask for per-chunk usage (vLLM)")

    o = parser.add_argument_group("output")
    o.add_argument("--slo", default=None, help="goodput SLO, seconds: ttft=0.5,itl=0.1")
    o.add_argument("--out", default=None, help="folder for report.json, report.md, plots")
    o.add_argument("--label", default=None, help="name of this report (compare uses it)")
    o.add_argument("--no-progress", action="store_true")
    o.add_argument("--no-plots", action="store_true")


def run(args: argparse.Namespace) -> int:
    try:
        if args.bench_command == "compare":
            return _run_compare(args)
        return _run_bench(args)
    except (ValueError, OSError) as exc:
        print(f"modelyard bench: {exc}", file=sys.stderr)
        return 2


def _endpoint(args: argparse.Namespace) -> EndpointConfig:
    if not args.model:
        raise ValueError("--model is required")
    payload = json.loads(Path(args.payload).read_text()) if args.payload else None
    return EndpointConfig(
        base_url=args.base_url, model=args.model, endpoint=args.endpoint,
        stream=not args.no_stream, ignore_eos=args.ignore_eos, min_tokens=args.min_tokens,
        include_usage=not args.no_usage, continuous_usage=args.continuous_usage,
        timeout_s=args.timeout, api_key=args.api_key, payload=payload,
    )  # fmt: skip


def _arrivals(args: argparse.Namespace) -> ArrivalConfig:
    size, _, interval = args.burst.partition(",")
    num = args.num_requests if args.num_requests is not None or args.duration else 100
    return ArrivalConfig(
        mode=args.arrival, concurrency=args.concurrency, rate=args.rate,
        burst_size=int(size), burst_interval_s=float(interval or 1.0), num_requests=num,
        duration_s=args.duration, warmup=args.warmup, seed=args.seed,
    )  # fmt: skip


def sweep_points(text: str | None, base: ArrivalConfig) -> list[ArrivalConfig]:
    """`concurrency=1,2,4` / `rate=1,2` -> one ArrivalConfig per value; none: [base]."""
    if not text:
        return [base]
    key, _, values = text.partition("=")
    if key not in ("concurrency", "rate") or not values:
        raise ValueError("--sweep takes concurrency=1,2,4 or rate=0.5,1,2")
    if key == "concurrency":
        return [replace(base, concurrency=int(v)) for v in values.split(",")]
    return [replace(base, rate=float(v)) for v in values.split(",")]


def point_seed(seed: int, index: int) -> int:
    """The workload seed of sweep point `index` for `--seed seed`: distinct for every point of
    every seed below 1009 (runs that compare servers give each server its own seed)."""
    return seed * 1009 + index


def _run_bench(args: argparse.Namespace) -> int:
    endpoint = _endpoint(args)
    points = sweep_points(args.sweep, _arrivals(args))
    slo = parse_slo(args.slo)
    wcfg = WorkloadConfig(
        input_len=LengthDist.parse(args.input_len), output_len=LengthDist.parse(args.output_len),
        dataset=args.dataset, seed=args.seed,
    )  # fmt: skip
    tokenizer = load_tokenizer(args.tokenizer)
    runs = []
    for index, arrivals in enumerate(points):
        # each sweep point gets prompts of its own, so a server's prefix cache never serves a
        # point from the prompts of the one before
        wcfg = replace(wcfg, seed=point_seed(args.seed, index))
        specs = iter(Workload(wcfg, tokenizer))
        result = _run_with_progress(endpoint, arrivals, specs, not args.no_progress)
        config = {
            "endpoint": {**asdict(endpoint), "api_key": None, "url": endpoint.url()},
            "arrivals": asdict(arrivals),
            "workload": {**asdict(wcfg), "tokenizer": args.tokenizer},
            "started_at": time.time(),
        }
        runs.append(build_run(config, result.results, result.duration_s, slo))
    report = {"label": args.label or f"{args.model}@{endpoint.base_url}", "runs": runs}
    markdown = markdown_report(report)
    print(markdown)
    if args.out:
        write_report(report, markdown, Path(args.out), plots=not args.no_plots)
    return 0


def _run_with_progress(
    endpoint: EndpointConfig, arrivals: ArrivalConfig, specs: Any, show: bool
) -> RunResult:
    if not (show and sys.stderr.isatty()):
        return asyncio.run(run_load(endpoint, arrivals, specs))
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    total = arrivals.num_requests if arrivals.duration_s is None else None
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("errors {task.fields[errors]}"), TimeElapsedColumn())  # fmt: skip
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(f"c={arrivals.concurrency} {arrivals.mode}", total=total, errors=0)
        errors = 0

        def tick(r: RequestResult) -> None:
            nonlocal errors
            errors += 0 if r.ok else 1
            bar.update(task, advance=1, errors=errors)

        return asyncio.run(run_load(endpoint, arrivals, specs, tick))


def _clean(obj: Any) -> Any:
    """NaN/inf -> None so the JSON is standard."""
    if isinstance(obj, float):
        return None if math.isnan(obj) or math.isinf(obj) else obj
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_clean(v) for v in obj]
    return obj


def write_report(report: dict[str, Any], markdown: str, out: Path, plots: bool = True) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(_clean(report), indent=1, allow_nan=False))
    (out / "report.md").write_text(markdown)
    if plots:
        plot_cdfs(report, out / "latency_cdf.png")
        if len(report["runs"]) > 1:
            plot_sweep({report["label"]: report}, out / "sweep.png")


def _run_compare(args: argparse.Namespace) -> int:
    reports = load_reports(args.reports)
    markdown = compare_markdown(reports)
    print(markdown)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "compare.md").write_text(markdown)
        plot_compare(reports, out / "compare.png")
    return 0
