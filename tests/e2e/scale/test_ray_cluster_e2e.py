"""`modelyard serve --ray` on a real two-node local Ray cluster (conftest.py): the same API
through Serve's proxy and the ingress, two replicas of the chat model (one per node), the non-LLM
models multiplexed, prefix affinity, metrics from every replica, a LoRA adapter loaded at run time
(answering what peft's merged model answers) and a pinned prefix, autoscaling 1 -> 2 -> 1 (a
second chat deployment), and faults: an engine worker and a replica killed mid-load, a node
leaving. Structured output: a json_schema answer and a forced tool call validate.

The tests run in file order and share one cluster and one app; the last ones change them (kills,
node leaves).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import psutil
import pytest
from e2e_server import E2E_MODEL
from ray_cluster import RayCluster, RayServe

from conftest import AUTOSCALED_MODEL, engine_of, replica_processes
from modelyard.cache_dir import cache_dir_from_environment

CACHE_DIR = cache_dir_from_environment()  # where the GGUF conversion is cached

pytest.importorskip("ray.serve", reason="the `ray` extra is not installed")

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]

LLM = f"llm-{E2E_MODEL}"
AUTOSCALED = f"llm-{AUTOSCALED_MODEL}"
# ~100-token shared system prompts (whole KV blocks), one per "tenant"
SYSTEMS = [
    " ".join(f"Rule {i}.{j}: answer {topic} questions briefly and politely." for j in range(8))
    for i, topic in enumerate(["math", "history", "cooking", "travel"])
]
#: the schema of the structured answer and of the forced tool call's arguments
PLACE = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 16}},
    "required": ["city"],
    "additionalProperties": False,
}


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
    _check_structured_output(client)


def _check_structured_output(client: openai.OpenAI) -> None:
    """A json_schema answer and a forced tool call, constrained in a replica's engine."""
    question: Any = [{"role": "user", "content": "Where is the Eiffel Tower?"}]
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "place", "schema": PLACE}}
    answer = client.chat.completions.create(
        model="smollm2", messages=question, response_format=fmt, max_tokens=40, temperature=0
    )
    jsonschema.validate(json.loads(answer.choices[0].message.content or ""), PLACE)
    tool: Any = {"type": "function", "function": {"name": "locate", "parameters": PLACE}}
    forced = client.chat.completions.create(
        model="smollm2",
        messages=question,
        tools=[tool],
        tool_choice="required",
        parallel_tool_calls=False,  # one call, then the grammar ends the answer
        max_tokens=64,
        temperature=0,
    )
    assert forced.choices[0].finish_reason == "tool_calls"
    (call,) = forced.choices[0].message.tool_calls or []
    assert call.function.name == "locate"
    jsonschema.validate(json.loads(call.function.arguments), PLACE)


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
    series = "ray_modelyard_engine_prefix_cache_queries_total{"
    while time.monotonic() < deadline and len(replicas) < 2:
        replicas = set()
        for node in cluster.nodes:
            text = httpx.get(f"http://127.0.0.1:{node.metrics_port}/metrics", timeout=10).text
            for line in text.splitlines():
                if line.startswith(series) and f'model="{E2E_MODEL}"' in line:
                    replicas.update(re.findall(r'replica="([^"]+)"', line))
        if len(replicas) < 2:
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


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from lora_helpers import float_base, make_adapter
    from modelyard.runner.loader import DEFAULT_MODEL

    base = float_base(DEFAULT_MODEL, CACHE_DIR)
    return make_adapter(base, tmp_path_factory.mktemp("ray-adapter") / "finance", seed=3, rank=4)


def _merged_text(adapter: Path, prompt: str, max_tokens: int) -> str:
    """What peft's merged model (W + s B A) generates greedily."""
    from transformers import AutoTokenizer

    from lora_helpers import MergedReference, float_base
    from modelyard.runner.loader import DEFAULT_MODEL

    base = float_base(DEFAULT_MODEL, CACHE_DIR)
    tokenizer = AutoTokenizer.from_pretrained(base)
    tokens = MergedReference(base).greedy(adapter, tokenizer.encode(prompt), max_tokens)
    return str(tokenizer.decode(tokens, skip_special_tokens=True))


def test_a_lora_adapter_loaded_at_run_time(ray_serve: RayServe, adapter: Path) -> None:
    """POST /v1/load_lora_adapter on Ray: the adapter answers as peft's merged model, the base
    model still answers as itself, and an unloaded adapter is gone."""
    prompt = "The quarterly report says"

    def complete(model: str) -> httpx.Response:
        body = {"model": model, "prompt": prompt, "max_tokens": 8, "temperature": 0}
        return httpx.post(f"{ray_serve.url}/v1/completions", json=body, timeout=120)

    body = {"lora_name": "finance", "lora_path": str(adapter), "base_model": "smollm2"}
    loaded = httpx.post(f"{ray_serve.url}/v1/load_lora_adapter", json=body, timeout=120)
    assert loaded.status_code == 200, loaded.text
    expected = _merged_text(adapter, prompt, 8)
    for _ in range(2):
        answer = complete("finance")
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["text"] == expected
    assert complete("smollm2").json()["choices"][0]["text"] != expected
    unload = {"lora_name": "finance"}
    unloaded = httpx.post(f"{ray_serve.url}/v1/unload_lora_adapter", json=unload, timeout=60)
    assert unloaded.status_code == 200, unloaded.text
    assert complete("finance").status_code == 404


def test_a_pinned_prefix_serves_later_requests_from_cache(ray_serve: RayServe) -> None:
    """POST /v1/prefixes on Ray pins on the replica the prefix router picks; a later chat that
    opens with the pinned messages finds those blocks cached; DELETE releases it."""
    system = " ".join(f"Fact {j}: the museum opens at {j + 8} on day {j}." for j in range(10))
    messages = [{"role": "system", "content": system}]
    body = {"model": "smollm2", "messages": messages}
    pinned = httpx.post(f"{ray_serve.url}/v1/prefixes", json=body, timeout=120)
    assert pinned.status_code == 200, pinned.text
    prefix = pinned.json()
    assert prefix["num_pinned_tokens"] >= 96
    listed = httpx.get(f"{ray_serve.url}/v1/prefixes", timeout=30).json()
    assert [p["id"] for p in listed["data"]] == [prefix["id"]]
    for i in range(3):
        answer = chat(ray_serve.url, system, f"When does it open on day {i}?")
        assert answer.status_code == 200, answer.text
        assert answer.json()["modelyard"]["cached_tokens"] >= prefix["num_pinned_tokens"]
    deleted = httpx.delete(f"{ray_serve.url}/v1/prefixes/{prefix['id']}", timeout=30)
    assert deleted.status_code == 200, deleted.text
    assert httpx.get(f"{ray_serve.url}/v1/prefixes", timeout=30).json()["data"] == []


async def _load(
    url: str, count: int, max_tokens: int = 300, model: str = "smollm2"
) -> list[tuple[httpx.Response, float]]:
    """`count` concurrent completions; each response with the monotonic time it ended."""
    body = {"model": model, "max_tokens": max_tokens, "ignore_eos": True}

    async def one(client: httpx.AsyncClient, i: int) -> tuple[httpx.Response, float]:
        response = await client.post(f"{url}/v1/completions", json={**body, "prompt": f"Tale {i}:"})
        return response, time.monotonic()

    async with httpx.AsyncClient(timeout=300) as client:
        return await asyncio.gather(*(one(client, i) for i in range(count)))


def test_autoscaling_one_to_two_and_back(ray_serve: RayServe) -> None:
    """A load step of 4 ongoing requests (target 1 per replica) scales the second chat
    deployment to its 2 replicas; 4 s after the load stops it is back to 1."""
    deadline = time.monotonic() + 60
    while len(replica_processes(AUTOSCALED)) != 1 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert len(replica_processes(AUTOSCALED)) == 1  # min_replicas
    up_deadline = time.monotonic() + 120
    while len(replica_processes(AUTOSCALED)) < 2 and time.monotonic() < up_deadline:
        done = asyncio.run(_load(ray_serve.url, 4, max_tokens=32, model=AUTOSCALED_MODEL))
        assert [r.status_code for r, _ in done] == [200] * 4
    assert len(replica_processes(AUTOSCALED)) == 2
    down_deadline = time.monotonic() + 90
    while len(replica_processes(AUTOSCALED)) > 1 and time.monotonic() < down_deadline:
        time.sleep(0.5)
    assert len(replica_processes(AUTOSCALED)) == 1
    assert len(replica_processes(LLM)) == 2  # the fixed deployment did not move


def _assert_fail_fast_then_recover(
    url: str, done: list[tuple[httpx.Response, float]], killed_at: float, killed: set[int]
) -> None:
    responses = [r for r, _ in done]
    statuses = [r.status_code for r in responses]
    assert set(statuses) <= {200, 503}, [(r.status_code, r.text[:200]) for r in responses]
    failed = [(r, t) for r, t in done if r.status_code == 503]
    assert failed, statuses  # the victims had requests in flight
    for response, ended in failed:
        assert "unavailable" in response.text or "dead" in response.text, response.text
        assert response.headers.get("retry-after")
        assert ended - killed_at < 30  # failed fast, not at a timeout
    deadline = time.monotonic() + 180
    replaced: list[psutil.Process] = []
    while time.monotonic() < deadline:
        replaced = [r for r in replica_processes(LLM) if _live_engine(r, killed)]
        if len(replaced) == 2:
            break
        time.sleep(1)
    assert len(replaced) == 2  # two replicas again, each with a new engine worker
    ok = 0
    while ok < 4 and time.monotonic() < deadline:
        ok = ok + 1 if chat(url, SYSTEMS[1], f"Still there {ok}?").status_code == 200 else 0
    assert ok == 4


def _live_engine(replica: psutil.Process, killed: set[int]) -> bool:
    """Whether a replica (not a killed one) has an engine worker that is not a killed one."""
    try:
        return replica.pid not in killed and engine_of(replica).pid not in killed
    except (LookupError, psutil.Error):
        return False


async def test_engine_worker_and_replica_killed_mid_load(ray_serve: RayServe) -> None:
    """Under a load on both replicas, one replica's engine worker and the other replica's actor
    die at once: their in-flight requests fail fast with a 503, Serve replaces what died."""
    load = asyncio.create_task(_load(ray_serve.url, 6))
    await asyncio.sleep(3.0)
    first, other = replica_processes(LLM)
    engine = await asyncio.to_thread(engine_of, first)
    os.kill(engine.pid, signal.SIGKILL)
    os.kill(other.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    done = await load
    killed = {engine.pid, other.pid}
    await asyncio.to_thread(_assert_fail_fast_then_recover, ray_serve.url, done, killed_at, killed)


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
            if chat(ray_serve.url, SYSTEMS[2], f"After the node left {ok}?").status_code == 200
            else 0
        )
    assert ok == 5
    assert len(replica_processes(LLM)) == 1
