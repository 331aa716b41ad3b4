"""Shared helpers for the benchmarks: prompts of an exact token length, percentiles, the
machine's matmul ceiling, peak RSS, and JSON output. Benchmarks are never timed tests: they
write JSON into benchmarks/results/ and their figures go into docs/benchmarks.md."""

from __future__ import annotations

import json
import platform
import resource
import socket
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).parent / "results"

_TEXT = (
    "The history of computing is a story of machines that learned to follow instructions "
    "faster and with less energy. Early mechanical calculators gave way to relays, then to "
    "vacuum tubes, transistors and integrated circuits. Each step made memory cheaper and "
    "arithmetic quicker, and software grew to fill the space. Operating systems learned to "
    "share a processor among many programs, compilers turned readable code into efficient "
    "instructions, and networks joined distant machines into one system. Today a small "
    "language model can answer questions on an ordinary laptop, and serving many users at once "
    "is a problem of scheduling, caching and careful use of memory bandwidth. "
)


def make_prompts(tokenizer: Any, count: int, num_tokens: int) -> list[list[int]]:
    """`count` different prompts of exactly `num_tokens` token ids (no shared prefix beyond
    chance: each starts at a different offset of a long text)."""
    ids: list[int] = tokenizer.encode(_TEXT * 40, add_special_tokens=False)
    prompts = []
    for i in range(count):
        start = (i * 37) % (len(ids) - num_tokens)
        prompts.append(ids[start : start + num_tokens])
    return prompts


def percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100.0
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def latency_summary(ttfts: Sequence[float], itls: Sequence[float]) -> dict[str, float | None]:
    return {
        "ttft_p50_ms": _ms(percentile(ttfts, 50)),
        "ttft_p99_ms": _ms(percentile(ttfts, 99)),
        "itl_p50_ms": _ms(percentile(itls, 50)),
        "itl_p99_ms": _ms(percentile(itls, 99)),
        "itl_mean_ms": _ms(statistics.fmean(itls)) if itls else None,
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 2)


def peak_rss_mb() -> float:
    """Peak resident memory of this process (Linux reports KiB)."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1)


def matmul_gflops(dtype_name: str, size: int = 2048, seconds: float = 3.0) -> float:
    """Measured dense matmul throughput in this dtype on all torch threads."""
    import torch

    dtype = getattr(torch, dtype_name)
    a = torch.randn(size, size, dtype=dtype)
    b = torch.randn(size, size, dtype=dtype)
    for _ in range(3):
        a @ b
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        n += 1
    elapsed = time.perf_counter() - start
    return 2.0 * size**3 * n / elapsed / 1e9


def machine_info() -> dict[str, Any]:
    import os

    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def write_json(name: str, payload: dict[str, Any]) -> Path:
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, sort_keys=True))
    return path


def free_port() -> int:
    """A free TCP port on 127.0.0.1 for a server the benchmark starts."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def modelyard_cli(*args: str) -> list[str]:
    """The command line of `modelyard ARGS...` run by this python."""
    import sys

    return [sys.executable, "-m", "modelyard.cli", *args]


def bench_command(
    url: str,
    model: str,
    tokenizer: str,
    out: Path,
    *,
    num_requests: int,
    input_len: int,
    output_len: int,
    extra: Sequence[str] = (),
) -> list[str]:
    """`modelyard bench` on streaming /v1/completions: fixed lengths, EOS ignored, 2 warm-ups."""
    return modelyard_cli(
        "bench",
        *("--base-url", url, "--model", model, "--endpoint", "completions"),
        *("--num-requests", str(num_requests)),
        *("--input-len", str(input_len), "--output-len", str(output_len), "--ignore-eos"),
        *("--tokenizer", tokenizer, "--warmup", "2", "--no-progress", "--out", str(out)),
        *extra,
    )


def wait_http_ready(url: str, process: Any = None, limit_s: float = 600.0) -> None:
    """Poll GET `url` until it answers 200; RuntimeError if `process` (a Popen) exits first."""
    import httpx

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"server exited with {process.returncode}")
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass  # not listening yet
        time.sleep(1.0)
    raise TimeoutError(f"{url} not ready")
