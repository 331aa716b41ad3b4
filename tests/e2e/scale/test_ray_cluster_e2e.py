"""`modelyard serve --ray` on a real two-node local Ray cluster (conftest.py): the same API
through Serve's proxy and the ingress, two replicas of the chat model (one per node), the non-LLM
models multiplexed, prefix affinity, metrics from every replica, and faults: an engine worker or
a replica killed mid-load, a node leaving, then autoscaling 1 -> 2 -> 1.

The tests run in file order and share the cluster; the last ones change it (kill, node leaves).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import psutil
import pytest
from e2e_server import E2E_MODEL
from ray_cluster import RayCluster, RayServe

from conftest import (
    AUTOSCALED,
    engine_of,
    replica_processes,
    start_app,
)

pytest.importorskip("ray.serve", reason="the `ray` extra is not installed")

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

LLM = f"llm-{E2E_MODEL}"
# ~100-token shared system prompts (whole KV blocks), one per "tenant"
SYSTEMS = [
    " ".join(f"Rule {i}.{j}: answer {topic} questions briefly and politely." for j in range(8))
    for i, topic in enumerate(["math", "history", "cooking", "travel"])
]


def chat(url: str, system: str, question: str, **extra: Any) -> httpx.Response:
    body = {
        "model": "smollm2",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": 4,
        "temperature": 0,
    }
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120, **extra)


def test_openai_client_through_the_ingress(ray_serve: RayServe) -> None:
    client = openai.OpenAI(base_url=ray_serve.url + "/v1", api_key="unused", max_retries=0)
    answer = client.chat.completions.create(
        model="smollm2",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=12,
        temperature=0,
    )
    assert answer.model == E2E_MODEL
    assert "Paris" in (answer.choices[0].message.content or "")
    pieces = [
        chunk.choices[0].text
        for chunk in client.completions.create(
            model="smollm2", prompt="Once upon a time", max_tokens=8, stream=True
        )
        if chunk.choices
    ]
    assert len(pieces) >= 2
    assert "".join(pieces).strip()
    listed = {m.id for m in client.models.list().data}
    assert {E2E_MODEL, "all-minilm-l6-v2", "minilm-zero-shot"} <= listed
    assert len(replica_processes(LLM)) == 2


def test_non_llm_models_through_predict_and_v2(ray_serve: RayServe) -> None:
    zero_shot = httpx.post(
        f"{ray_serve.url}/predict",
        json={
            "model_id": "minilm-zero-shot",
            "input_data": "The striker scored twice and the team won the match.",
        },
        timeout=120,
    )
    assert zero_shot.status_code == 200, zero_shot.text
    assert zero_shot.json()["predictions"][0][0]["label"] == "sports"
    infer = httpx.post(
        f"{ray_serve.url}/v2/models/all-minilm-l6-v2/infer",
        json={"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]}]},
        timeout=120,
    )
    assert infer.status_code == 200, infer.text
    assert infer.json()["outputs"][0]["shape"] == [2, 384]
    missing = httpx.post(f"{ray_serve.url}/v2/models/nope/infer", json={"inputs": []})
    assert missing.status_code == 404
    assert isinstance(missing.json()["error"], str)


def test_shared_prefixes_stick_to_the_replica_that_cached_them(ray_serve: RayServe) -> None:
    """Every repeat of a system prompt finds its blocks in the engine that served it first."""
    for round_ in range(3):
        for i, system in enumerate(SYSTEMS):
            answer = chat(ray_serve.url, system, f"Question {round_}-{i}?")
            assert answer.status_code == 200, answer.text
            cached = answer.json()["modelyard"]["cached_tokens"]
            if round_ > 0:
                assert cached >= 96, (round_, i, cached)  # the system prompt's whole blocks


def test_metrics_from_every_replica(cluster: RayCluster, ray_serve: RayServe) -> None:
    """Each LLM replica exports its engine counters through its node's Ray metrics port."""
    deadline = time.monotonic() + 60
    replicas: set[str] = set()
    while time.monotonic() < deadline and len(replicas) < 2:
        replicas = set()
        for node in cluster.nodes:
            text = httpx.get(f"http://127.0.0.1:{node.metrics_port}/metrics", timeout=10).text
            for line in text.splitlines():
                if line.startswith("ray_modelyard_engine_prefix_cache_queries_total{"):
                    replicas.update(re.findall(r'replica="([^"]+)"', line))
        time.sleep(1)
    assert len(replicas) == 2, replicas
    ingress = httpx.get(f"{ray_serve.url}/metrics", timeout=10).text
    assert "modelyard:time_to_first_token_seconds" in ingress


def test_request_id_is_carried_to_the_replica(cluster: RayCluster, ray_serve: RayServe) -> None:
    answer = chat(ray_serve.url, SYSTEMS[0], "Hi?", headers={"x-request-id": "trace-ray-42"})
    assert answer.status_code == 200
    assert answer.headers.get_list("x-request-id") == ["trace-ray-42"]
    logs = Path(cluster.root, "ray", "session_latest", "logs", "serve")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if any("trace-ray-42" in f.read_text(errors="replace") for f in logs.glob("*llm-*.log")):
            return
        time.sleep(0.5)
    pytest.fail("the LLM replica's log never mentioned the request id")


async def _load(url: str, count: int, max_tokens: int = 300) -> list[tuple[httpx.Response, float]]:
    """`count` concurrent completions; each response with the monotonic time it ended."""
    body = {"model": "smollm2", "max_tokens": max_tokens, "ignore_eos": True}

    async def one(client: httpx.AsyncClient, i: int) -> tuple[httpx.Response, float]:
        response = await client.post(f"{url}/v1/completions", json={**body, "prompt": f"Tale {i}:"})
        return response, time.monotonic()

    async with httpx.AsyncClient(timeout=300) as client:
        return await asyncio.gather(*(one(client, i) for i in range(count)))


def _busiest_engine() -> tuple[psutil.Process, psutil.Process]:
    """(replica, engine) whose engine worker used the most CPU in the last second."""
    pairs = [(r, engine_of(r)) for r in replica_processes(LLM)]
    before = [sum(e.cpu_times()[:2]) for _, e in pairs]
    time.sleep(1.0)
    after = [sum(e.cpu_times()[:2]) for _, e in pairs]
    return max(zip(pairs, after, before, strict=True), key=lambda x: x[1] - x[2])[0]


def _assert_fail_fast_then_recover(
    url: str, done: list[tuple[httpx.Response, float]], killed_at: float
) -> None:
    responses = [r for r, _ in done]
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 503}, [(r.status_code, r.text[:200]) for r in responses]
    failed = [(r, t) for r, t in done if r.status_code == 503]
    assert failed, statuses  # the victim had requests in flight
    for response, ended in failed:
        assert "unavailable" in response.text or "dead" in response.text, response.text
        assert response.headers.get("retry-after")
        assert ended - killed_at < 30  # failed fast, not at a timeout
    deadline = time.monotonic() + 180
    while len(replica_processes(LLM)) < 2 and time.monotonic() < deadline:
        time.sleep(1)
    assert len(replica_processes(LLM)) == 2  # Serve replaced the replica
    ok = 0
    while ok < 4 and time.monotonic() < deadline:
        ok = ok + 1 if chat(url, SYSTEMS[1], "Still there?").status_code == 200 else 0
    assert ok == 4


async def _kill_mid_load(url: str, kill: str) -> None:
    load = asyncio.create_task(_load(url, 6))
    await asyncio.sleep(3.0)
    replica, engine = await asyncio.to_thread(_busiest_engine)
    os.kill((engine if kill == "engine" else replica).pid, signal.SIGKILL)
    killed_at = time.monotonic()
    done = await load
    await asyncio.to_thread(_assert_fail_fast_then_recover, url, done, killed_at)


async def test_engine_worker_killed_mid_load(ray_serve: RayServe) -> None:
    await _kill_mid_load(ray_serve.url, "engine")


async def test_replica_killed_mid_load(ray_serve: RayServe) -> None:
    await _kill_mid_load(ray_serve.url, "replica")


def test_a_node_leaves_and_the_app_keeps_serving(cluster: RayCluster, ray_serve: RayServe) -> None:
    worker = cluster.nodes[-1]
    on_worker = {p.pid for p in worker.tree()}
    assert any(r.pid in on_worker for r in replica_processes(LLM))  # one replica per node
    worker.stop()
    cluster.nodes.remove(worker)
    deadline = time.monotonic() + 60
    ok = 0
    while ok < 5 and time.monotonic() < deadline:
        ok = (
            ok + 1
            if chat(ray_serve.url, SYSTEMS[2], "After the node left?").status_code == 200
            else 0
        )
    assert ok == 5
    assert len(replica_processes(LLM)) == 1


def test_autoscaling_one_to_two_and_back(cluster: RayCluster, ray_serve: RayServe) -> None:
    ray_serve.stop()
    cluster.add_worker()
    serve = start_app(cluster, AUTOSCALED, with_pool=False)
    try:
        deadline = time.monotonic() + 60
        while len(replica_processes(LLM)) != 1 and time.monotonic() < deadline:
            time.sleep(1)
        assert len(replica_processes(LLM)) == 1
        up_deadline = time.monotonic() + 180
        while len(replica_processes(LLM)) < 2 and time.monotonic() < up_deadline:
            asyncio.run(_load(serve.url, 4, max_tokens=48))  # a load step: 4 ongoing > target 1
        assert len(replica_processes(LLM)) == 2
        down_deadline = time.monotonic() + 120
        while len(replica_processes(LLM)) > 1 and time.monotonic() < down_deadline:
            time.sleep(1)
        assert len(replica_processes(LLM)) == 1
        assert chat(serve.url, SYSTEMS[3], "Scaled back?").status_code == 200
    finally:
        serve.stop()
