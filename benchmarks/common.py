"""Shared helpers for the benchmarks: fresh prompts of an exact token length, percentiles, the
machine's matmul ceiling, peak RSS of a whole process tree, the host's kind and versions, a
peer's own environment, and JSON output. Benchmarks are never timed tests: they write JSON into
benchmarks/results/<host-kind>/ and their figures go into docs/benchmarks.md."""

from __future__ import annotations

import contextlib
import json
import platform
import resource
import socket
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from emulation import describe, emulated_kind, peer_extra, results_subdir

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


def make_prompts(tokenizer: Any, count: int, num_tokens: int, tag: str = "") -> list[list[int]]:
    """`count` different prompts of exactly `num_tokens` token ids. Each opens with its own
    label (`tag` and its index), so no two share a first KV block: give every measured point
    and every system its own `tag` and no prefix cache serves one point from another's prompts.
    The rest is a long text from an offset of its own."""
    ids: list[int] = tokenizer.encode(_TEXT * 40, add_special_tokens=False)
    prompts = []
    for i in range(count):
        label: list[int] = tokenizer.encode(f"[{tag}#{i}] ", add_special_tokens=False)
        start = (i * 37) % (len(ids) - num_tokens)
        prompts.append((label + ids[start : start + num_tokens])[:num_tokens])
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


class TreeRss:
    """Peak resident memory of a process and all its descendants together, sampled every
    `interval_s` in a thread (vLLM runs its engine core in a second process; modelyard serve
    runs the API and an engine worker): `with TreeRss(pid) as rss: ...; rss.peak_mb`."""

    def __init__(self, pid: int, interval_s: float = 0.2) -> None:
        import threading

        self.pid, self.interval_s, self.peak_mb = pid, interval_s, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> float:
        import psutil

        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return 0.0
        total = 0
        for proc in procs:
            with contextlib.suppress(psutil.Error):  # exited between listing and reading
                total += proc.memory_info().rss
        return total / 2**20

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak_mb = max(self.peak_mb, self.sample())

    def __enter__(self) -> TreeRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak_mb = round(self.peak_mb, 1)


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


def ceiling_gflops(dtype_name: str) -> float:
    """The matmul rate behind a ceiling. Playing an AVX-512 BF16 host on an Intel one
    (`--emulate`), bf16 matmuls without AMX run on `vdpbf16ps`, which Intel cores issue at half
    their float32 FMA rate (AMD Zen 4 at twice it): the bf16 ceiling is then the higher of the
    bf16 and the float32 matmul rates, the one a bf16 model could reach by widening to fp32.
    On AVX2 (and generic) hosts, played or real, torch's bf16 matmul is scalar (~0.3 GFLOP/s
    on 2048², minutes to measure): their bf16 ceiling is the float32 rate, which the runner's
    bf16 GEMM there (bf16 widened to float32) works at."""
    if dtype_name == "bfloat16" and (emulated_kind() or host_kind()) in ("avx2", "generic"):
        return matmul_gflops("float32")
    rate = matmul_gflops(dtype_name)
    if dtype_name == "bfloat16" and emulated_kind() == "avx512-bf16":
        rate = max(rate, matmul_gflops("float32"))
    return rate


# the CPU flags that decide which kernels run (the full list is long and mostly irrelevant)
_ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16")
_ISA_FLAGS += ("avx512_fp16", "amx_tile", "amx_bf16", "amx_int8", "amx_fp16")


def host_kind() -> str:
    """amx, avx512-bf16, avx512, avx2 or generic (modelyard.runner.kernel_config)."""
    from modelyard.runner.kernel_config import host_kind as kind

    return kind()


def cpu_identity() -> dict[str, str]:
    """Family / model / stepping and the L3 size as /proc/cpuinfo gives them: two hosts that
    report the same model name (a virtual machine's "Intel(R) Xeon(R) Processor") can still
    differ here, and in speed."""
    fields = {"cpu family": "", "model": "", "stepping": "", "cache size": ""}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in fields and not fields[key]:
                    fields[key] = value.strip()
                if not line.strip():
                    break  # the first processor's block is enough
    except OSError:
        return {}
    signature = "/".join(fields[k] for k in ("cpu family", "model", "stepping"))
    return {"cpu_signature": signature, "cache_size": fields["cache size"]}


def machine_info() -> dict[str, Any]:
    """Host kind, CPU model and flags, core count, versions and the commit measured."""
    import os
    import subprocess

    import torch

    from modelyard.engine.config import kernels_from_environment
    from modelyard.runner.kernel_config import cpu_flags, cpu_model

    flags = cpu_flags()
    commit = subprocess.run(
        ["git", "-C", str(Path(__file__).parent), "describe", "--always", "--dirty"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    return {
        "host_kind": host_kind(),
        "emulated": describe(),  # a lower kind played on this host (benchmarks/emulation.py)
        "kernel_isa": kernels_from_environment().isa,
        "cpu_model": cpu_model(),
        "cpu_flags": [f for f in _ISA_FLAGS if f in flags],
        **cpu_identity(),
        # the runner's switches this run was started with (runner.kernel_config)
        "modelyard_env": {
            k: v for k, v in sorted(os.environ.items()) if k.startswith("MODELYARD_")
        },
        "python": platform.python_version(),
        "torch": torch.__version__,
        "modelyard_commit": commit,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "machine": platform.machine(),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def results_dir() -> Path:
    """benchmarks/results/<host-kind>/: the latest results of each kind of host side by side."""
    return RESULTS_DIR / (results_subdir() or host_kind())


def write_json(name: str, payload: dict[str, Any]) -> Path:
    """payload as results_dir()/NAME.json, with the command that made it where it has none."""
    out = results_dir()
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    payload = {"command": " ".join(["python", *sys.argv]), **payload}
    path.write_text(json.dumps(payload, indent=2, sort_keys=True))
    return path


# environment a peer must not inherit from us: the engine worker's OpenMP and malloc settings,
# our switches and import path
_OURS = ("OMP_WAIT_POLICY", "GLIBC_TUNABLES", "PYTHONPATH", "KMP_BLOCKTIME", "OMP_NUM_THREADS")


def peer_env(python: str, **extra: str) -> dict[str, str]:
    """The environment a peer (vLLM, llama.cpp) runs in: ours without our runtime settings,
    plus the Intel OpenMP runtime of its venv preloaded where it ships one (vLLM CPU's best
    settings, ../shared/design/PEERS.md), plus `extra`."""
    import os

    env = {k: v for k, v in os.environ.items() if k not in _OURS and not k.startswith("MODELYARD_")}
    iomp = Path(python).parents[1] / "lib" / "libiomp5.so"  # <venv>/bin/python -> <venv>/lib
    if iomp.exists():
        env["LD_PRELOAD"] = str(iomp)
    env.update(peer_extra())
    env.update(extra)
    return env


VLLM_BEST = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "OMP_NUM_THREADS": "2"}
VLLM_BEST |= {"VLLM_CPU_KVCACHE_SPACE": "4"}


def peer_versions(python: str, packages: Sequence[str]) -> dict[str, str | None]:
    """Installed versions of `packages` in the venv of `python`."""
    import subprocess

    code = (
        "import json, sys, importlib.metadata as m\n"
        "out = {}\n"
        "for p in sys.argv[1:]:\n"
        "    try: out[p] = m.version(p)\n"
        "    except m.PackageNotFoundError: out[p] = None\n"
        "print(json.dumps(out))"
    )
    proc = subprocess.run([python, "-c", code, *packages], capture_output=True, text=True)
    try:
        versions: dict[str, str | None] = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return dict.fromkeys(packages)
    return versions


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
