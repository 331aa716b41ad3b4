"""Real worker processes (no weights: the echo backend and a tiny ONNX model), a real Triton."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import psutil
import pytest
from manager_triton import start_triton

from modelyard.manager.base import ModelUnavailableError
from modelyard.manager.catalog import Catalog, spec_from_dict
from modelyard.manager.config import ManagerConfig
from modelyard.manager.manager import Manager
from modelyard.observability import metrics

pytestmark = pytest.mark.integration

MB = 1024 * 1024


def manager_of(*entries: dict[str, Any], **config: Any) -> Manager:
    catalog = Catalog([spec_from_dict(e) for e in entries])
    return Manager(catalog, ManagerConfig(memory_budget_bytes=4096 * MB, **config))


def tiny_onnx(path: Path) -> Path:
    """y = 3 * x + 1 over FP32 [-1]."""
    import onnx
    from onnx import TensorProto, helper

    three = helper.make_tensor("three", TensorProto.FLOAT, [1], [3.0])
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "three"], ["t"]),
            helper.make_node("Add", ["t", "one"], ["y"]),
        ],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"])],
        initializer=[three, one],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def worker_pid(manager: Manager, model_id: str) -> int:
    """The worker process of a loaded model, as the /models listing shows it."""
    (pid,) = [m["pid"] for m in manager.describe()["loaded_models"] if m["id"] == model_id]
    assert isinstance(pid, int)
    return pid


async def test_crashed_worker_fails_in_flight_then_recovers() -> None:
    entry = {
        "id": "echo",
        "kind": "embedding",
        "backend": "echo",
        "options": {"crash_on": "boom"},
        "batching": {"max_batch_size": 1, "max_queue_delay_ms": 0},
    }
    manager = manager_of(entry)
    try:
        async with manager.lease("echo") as lease:
            first_pid = worker_pid(manager, "echo")
            with pytest.raises(ModelUnavailableError, match="exited"):
                await lease.predictor.predict(["boom"])
        async with manager.lease("echo") as lease:  # the next request reloads
            assert await lease.predictor.predict(["two words"]) == [[9.0, 2.0]]
            assert worker_pid(manager, "echo") != first_pid
        assert manager.stats["loads"] == 2
    finally:
        await manager.close()


async def test_unload_returns_memory_and_api_rss_stays_flat(tmp_path: Path) -> None:
    model = tiny_onnx(tmp_path / "tiny.onnx")
    manager = manager_of({"id": "tiny", "kind": "tensor", "backend": "onnx", "source": str(model)})
    api = psutil.Process(os.getpid())
    x = {"x": {"shape": [3], "datatype": "FP32", "data": [0.0, 1.0, 2.0]}}
    rss: list[int] = []
    try:
        for _ in range(20):
            async with manager.lease("tiny") as lease:
                pid = worker_pid(manager, "tiny")
                (out,) = await lease.predictor.predict([x])
            assert out["y"]["data"] == [1.0, 4.0, 7.0]
            await manager.unload("tiny")
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
            rss.append(api.memory_info().rss)
    finally:
        await manager.close()
    assert rss[-1] - rss[4] < 15 * MB, rss  # after warm-up, no growth per cycle


async def test_dynamic_batching_joins_concurrent_requests() -> None:
    entry = {
        "id": "batched",
        "kind": "embedding",
        "backend": "echo",
        "batching": {"max_batch_size": 8, "max_queue_delay_ms": 50},
    }
    manager = manager_of(entry)
    histogram = metrics.INFERENCE_BATCH_SIZE.labels("batched")
    try:
        async with manager.lease("batched") as lease:
            results = await asyncio.gather(*(lease.predictor.predict([f"t{i}"]) for i in range(16)))
        assert [r[0][0] for r in results] == [float(len(f"t{i}")) for i in range(16)]
        samples = {s.name: s.value for s in histogram._child_samples()}  # type: ignore[attr-defined]
        assert samples["_count"] == 16
        assert samples["_sum"] / samples["_count"] > 4  # joined, never above max_batch_size
    finally:
        await manager.close()


async def test_triton_backend_loads_on_use_and_unloads_on_eviction(tmp_path: Path) -> None:
    process, url = await asyncio.to_thread(start_triton, tmp_path)
    triton = {
        "id": "remote-doubler",
        "kind": "tensor",
        "backend": "triton",
        "source": "doubler",
        "options": {"url": url, "timeout_s": 30},
        "memory_estimate_bytes": 200 * MB,
    }
    other = {
        "id": "other",
        "kind": "embedding",
        "backend": "echo",
        "memory_estimate_bytes": 200 * MB,
    }
    catalog = Catalog([spec_from_dict(triton), spec_from_dict(other)])
    manager = Manager(catalog, ManagerConfig(memory_budget_bytes=300 * MB, measure_memory=False))

    async def index() -> dict[str, str]:
        async with httpx.AsyncClient() as client:
            answer = await client.post(f"http://{url}/v2/repository/index")
        return {m["name"]: m.get("state", "") for m in answer.json()}

    try:
        assert (await index()).get("doubler", "") != "READY"
        async with manager.lease("remote-doubler") as lease:
            assert (await index())["doubler"] == "READY"  # loaded on first use
            x = {"INPUT0": {"shape": [3], "datatype": "FP32", "data": [1.0, 2.0, 3.5]}}
            (out,) = await lease.predictor.predict([x])
        assert np.allclose(out["OUTPUT0"]["data"], [2.0, 4.0, 7.0])
        assert lease.metadata["inputs"][0]["name"] == "INPUT0"
        async with manager.lease("other"):  # budget for one: evicts the Triton model
            pass
        for _ in range(100):  # Triton unloads asynchronously (UNLOADING -> UNAVAILABLE)
            if (await index())["doubler"] != "UNLOADING":
                break
            await asyncio.sleep(0.1)
        assert (await index())["doubler"] == "UNAVAILABLE"  # unloaded explicitly in Triton
    finally:
        await manager.close()
        process.terminate()
        await asyncio.to_thread(process.wait, 10)
