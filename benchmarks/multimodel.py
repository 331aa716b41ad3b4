"""Multi-model manager benchmark (JSON into benchmarks/results/multimodel.json).

1. cold vs warm latency per default non-LLM model (cold = lease + load + first request);
2. dynamic batching: all-MiniLM-L6-v2 embeddings at concurrency 32, max_batch_size 32 vs 1;
3. thrashing: 4 tiny models, budget for 2, uniform and skewed (80/20) random patterns -> hit rate;
4. /predict overhead: warm /predict through the ASGI app (in-process transport) vs calling the
   worker's predictor directly, on a no-op model (noop_backend.py).

Usage: `.venv/bin/python benchmarks/multimodel.py [--quick]`. Runs the manager in-process with
real worker processes; no server socket.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import random
import statistics
import time
from typing import Any

from common import machine_info, write_json
from modelyard.manager.catalog import Catalog, load_catalog, spec_from_dict
from modelyard.manager.config import ManagerConfig
from modelyard.manager.manager import Manager
from noop_backend import register_noop

register_noop()  # the no-op model below

GIB = 1024**3
COFFEE = None


def _coffee_b64() -> str:
    import base64
    from pathlib import Path

    import skimage

    return base64.b64encode(
        (Path(skimage.__file__).parent / "data" / "coffee.png").read_bytes()
    ).decode()


def _input_for(kind: str) -> list[Any]:
    from modelyard.api.inputs import decode_image_input

    if kind == "image-classification":
        return [decode_image_input(_coffee_b64())]
    return ["The quick brown fox jumps over the lazy dog."]


async def cold_warm(ids: list[str], warm_runs: int) -> dict[str, Any]:
    catalog = Catalog([s for s in load_catalog(None) if s.id in ids])
    results = {}
    for spec in catalog:
        manager = Manager(Catalog([spec]), ManagerConfig(memory_budget_bytes=8 * GIB))
        items = _input_for(str(spec.kind))
        start = time.perf_counter()
        async with manager.lease(spec.id) as lease:
            await lease.predictor.predict(items)
        cold = time.perf_counter() - start
        warm = []
        for _ in range(warm_runs):
            start = time.perf_counter()
            async with manager.lease(spec.id) as lease:
                await lease.predictor.predict(items)
            warm.append(time.perf_counter() - start)
        results[spec.id] = {
            "cold_s": round(cold, 3),
            "warm_p50_ms": round(statistics.median(warm) * 1e3, 2),
        }
        await manager.close()
    return results


async def batching(requests: int, concurrency: int) -> dict[str, Any]:
    base = load_catalog(None).resolve("all-minilm-l6-v2")
    out = {}
    for size in (32, 1):
        spec = dataclasses.replace(
            base, batching=dataclasses.replace(base.batching, max_batch_size=size)
        )
        manager = Manager(Catalog([spec]), ManagerConfig(memory_budget_bytes=8 * GIB))
        await manager.load(spec.id)
        limit = asyncio.Semaphore(concurrency)

        async def one(
            i: int, m: Manager = manager, s: Any = spec, sem: asyncio.Semaphore = limit
        ) -> None:
            async with sem, m.lease(s.id) as lease:
                await lease.predictor.predict([f"sentence number {i} about serving many models"])

        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(requests)))
        elapsed = time.perf_counter() - start
        out[f"max_batch_size_{size}"] = {"requests_per_s": round(requests / elapsed, 1)}
        await manager.close()
    out["speedup"] = round(
        out["max_batch_size_32"]["requests_per_s"] / out["max_batch_size_1"]["requests_per_s"], 2
    )
    return out


async def thrash(requests: int) -> dict[str, Any]:
    names = ["m0", "m1", "m2", "m3"]
    specs = [
        spec_from_dict(
            {"id": n, "kind": "embedding", "backend": "noop", "memory_estimate_bytes": 100 * 2**20}
        )
        for n in names
    ]
    out = {}
    for pattern, weights in (("uniform", [1, 1, 1, 1]), ("skewed_80_20", [8, 1, 0.5, 0.5])):
        config = ManagerConfig(
            memory_budget_bytes=250 * 2**20, measure_memory=False, worker_preload=()
        )
        manager = Manager(Catalog(specs), config)
        rng = random.Random(1)
        start = time.perf_counter()
        for name in rng.choices(names, weights, k=requests):
            async with manager.lease(name) as lease:
                await lease.predictor.predict(["x"])
        stats = manager.stats
        out[pattern] = {
            "hit_rate": round(stats["hits"] / (stats["hits"] + stats["misses"]), 3),
            "loads": stats["loads"],
            "requests_per_s": round(requests / (time.perf_counter() - start), 1),
        }
        await manager.close()
    return out


async def predict_overhead(runs: int) -> dict[str, Any]:
    import httpx

    from modelyard.api.app import build_app

    spec = spec_from_dict(
        {
            "id": "noop",
            "kind": "embedding",
            "backend": "noop",
            "batching": {"max_batch_size": 1, "max_queue_delay_ms": 0},
        }
    )
    manager = Manager(Catalog([spec]), ManagerConfig(memory_budget_bytes=GIB, worker_preload=()))
    await manager.load("noop")
    direct, http = [], []
    async with manager.lease("noop") as lease:
        for _ in range(runs):
            start = time.perf_counter()
            await lease.predictor.predict(["hello"])
            direct.append(time.perf_counter() - start)
    app = build_app(manager, close_provider=False)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
        for _ in range(runs):
            start = time.perf_counter()
            answer = await client.post("/predict", json={"model_id": "noop", "input_data": "hello"})
            http.append(time.perf_counter() - start)
            answer.raise_for_status()
    await manager.close()
    p50_direct, p50_http = statistics.median(direct), statistics.median(http)
    return {
        "direct_p50_ms": round(p50_direct * 1e3, 3),
        "predict_p50_ms": round(p50_http * 1e3, 3),
        "overhead_p50_ms": round((p50_http - p50_direct) * 1e3, 3),
    }


async def main(quick: bool) -> dict[str, Any]:
    return {
        "machine": machine_info(),
        "quick": quick,
        "cold_warm": await cold_warm(
            ["all-minilm-l6-v2", "efficientnet-lite0", "efficientnet-lite0-onnx"],
            5 if quick else 20,
        ),
        "batching_c32": await batching(128 if quick else 512, 32),
        "thrash": await thrash(100 if quick else 500),
        "predict_overhead": await predict_overhead(50 if quick else 300),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    result = asyncio.run(main(parser.parse_args().quick))
    print(write_json("multimodel", result))
