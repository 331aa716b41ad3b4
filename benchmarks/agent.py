"""The knowledge agent over a real server: retrieval quality, and no-context vs RAG vs CAG.

One run, one `modelyard serve` (the default catalog: SmolLM2-135M-Instruct and
all-MiniLM-L6-v2; `--max-num-batched-tokens 512` splits the knowledge pin's prefill into
steps that stay well inside the engine's 30 s heartbeat on a busy host, and changes nothing
for the measured prompts, which are all shorter), the evaluation set in benchmarks/agent_eval
(4 pages, ~1,270 tokens of knowledge, 32 questions labelled with an evidence phrase):

1. ingest: chunk (60 words, 15 overlap), embed through /v1/embeddings, FAISS index;
2. retrieval: hit@1 / hit@5 of the question's own embedding (exact cosine search);
3. single call per question, the three systems side by side, in rotated order:
   - none: the question alone;
   - RAG: embed the question, top-4 chunks as context, one answer call;
   - CAG: the whole knowledge pinned once (POST /v1/prefixes), one answer call naming it;
   TTFT of the answer call (client-side, streamed), the question's TTFT (from the question to
   the first answer token: RAG includes its embeddings call and search), end to end,
   prompt / cached tokens, model calls;
4. the agent loop (plan -> retrieve -> answer -> refine for RAG, the agent's prompt retrieval;
   answer -> refine for CAG):
   e2e latency and model calls per question, answer quality.

Answer quality is "one of the labelled answer strings appears in the answer": a coarse check.
The 135M chat model answers poorly whatever the context; the serving figures are the point.
Every question is asked once per system in each section, and the prefix cache is flushed
(random prompts that need more blocks than the cache has; pinned blocks stay) before the agent
loop re-asks them, so no prompt is served from an earlier identical one. RAG prompts still share
the cached system rules (and a chunk order that repeats) like any client's would.

    flock /work/bench.lock .venv/bin/python benchmarks/agent.py [--url URL] [--questions N]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).parent))

from common import free_port, machine_info, modelyard_cli, percentile, wait_http_ready, write_json
from modelyard.agent import AgentConfig, Answer, KnowledgeAgent, ModelyardAPI
from modelyard.agent.evaluation import Question, answer_correct, hit_at, load_questions

EVAL = Path(__file__).parent / "agent_eval"
SYSTEMS = ("none", "rag", "cag")


def host_info() -> dict[str, Any]:
    """machine_info() plus the CPU model and its vector extensions."""
    info = machine_info()
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return info
    fields = dict(line.split(":", 1) for line in lscpu.splitlines() if ":" in line)
    info["cpu_model"] = fields.get("Model name", "").strip()
    flags = fields.get("Flags", "").split()
    info["cpu_flags"] = sorted(f for f in flags if f.startswith(("avx", "amx")))
    import faiss

    info["faiss"] = faiss.__version__
    info["commit"] = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    return info


def tree_rss_mb(pid: int) -> float:
    """Resident memory of a process and all its children."""
    root = psutil.Process(pid)
    procs = [root, *root.children(recursive=True)]
    return round(sum(p.memory_info().rss for p in procs) / 2**20, 1)


def p50_ms(values: list[float]) -> float | None:
    p = percentile(values, 50)
    return None if p is None else round(p * 1000, 1)


def p90_ms(values: list[float]) -> float | None:
    p = percentile(values, 90)
    return None if p is None else round(p * 1000, 1)


async def retrieval(agent: KnowledgeAgent, questions: list[Question]) -> dict[str, Any]:
    index = await agent.index()
    vectors = await agent.api.embed([q.question for q in questions], model=index.embedding_model)
    results = index.search(vectors, 5)
    hit1 = sum(hit_at(hits, q, 1) for hits, q in zip(results, questions, strict=True))
    hit5 = sum(hit_at(hits, q, 5) for hits, q in zip(results, questions, strict=True))
    n = len(questions)
    return {"chunks": len(index), "hit_at_1": round(hit1 / n, 3), "hit_at_5": round(hit5 / n, 3)}


def record(answer: Answer, question: Question) -> dict[str, Any]:
    call = answer.answer_call
    steps = [c.step for c in answer.calls]
    before_answer = sum(c.seconds for c in answer.calls[: steps.index("answer")])
    return {
        "question": question.question_id,
        "answer_ttft_s": call.ttft_s,
        "server_ttft_s": call.server_ttft_s,
        "question_ttft_s": before_answer + call.ttft_s,
        "e2e_s": answer.e2e_s,
        "prompt_tokens": call.prompt_tokens,
        "cached_tokens": call.cached_tokens,
        "model_calls": answer.model_calls,
        "correct": answer_correct(answer.text, question),
        "retrieved_hit": hit_at(answer.hits, question, len(answer.hits)) if answer.hits else None,
        "answer": answer.text,
    }


async def run_systems(
    agents: dict[str, KnowledgeAgent], questions: list[Question]
) -> dict[str, list[dict[str, Any]]]:
    """Every question once per system; the order of the systems rotates per question."""
    rows: dict[str, list[dict[str, Any]]] = {s: [] for s in SYSTEMS}
    for i, question in enumerate(questions):
        for system in SYSTEMS[i % 3 :] + SYSTEMS[: i % 3]:
            answer = await agents[system].ask(question.question, mode=system)  # type: ignore[arg-type]
            rows[system].append(record(answer, question))
    return rows


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def col(key: str) -> list[float]:
        return [r[key] for r in rows if r[key] is not None]

    hits = [r["retrieved_hit"] for r in rows if r["retrieved_hit"] is not None]
    return {
        "questions": len(rows),
        "answer_ttft_p50_ms": p50_ms(col("answer_ttft_s")),
        "answer_ttft_p90_ms": p90_ms(col("answer_ttft_s")),
        "server_ttft_p50_ms": p50_ms(col("server_ttft_s")),
        "question_ttft_p50_ms": p50_ms(col("question_ttft_s")),
        "e2e_p50_ms": p50_ms(col("e2e_s")),
        "e2e_p90_ms": p90_ms(col("e2e_s")),
        "prompt_tokens_mean": round(sum(col("prompt_tokens")) / len(rows), 1),
        "cached_tokens_mean": round(sum(col("cached_tokens")) / len(rows), 1),
        "model_calls_per_question": round(sum(col("model_calls")) / len(rows), 2),
        "answer_correct": round(sum(col("correct")) / len(rows), 3),
        "context_hit": round(sum(hits) / len(hits), 3) if hits else None,
    }


async def flush_prefix_cache(url: str, seed: int, blocks: int = 800, size: int = 480) -> None:
    """Evict every unpinned block from the chat model's prefix cache: prompts of random token
    ids that together need more blocks than the cache has (pinned blocks stay). Short prompts:
    one engine step of ~2,000 prompt tokens can outlast the engine's 30 s heartbeat on a busy
    2-core host."""
    import httpx
    import numpy as np

    rng = np.random.default_rng(seed)
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        for _ in range(-(-blocks * 16 // size)):
            prompt = [int(t) for t in rng.integers(1000, 40000, size=size)]
            body = {"model": "smollm2", "prompt": prompt, "max_tokens": 1}
            response = await client.post("/v1/completions", json=body)
            response.raise_for_status()


def make_agents(api: ModelyardAPI, index_dir: Path, loop: bool) -> dict[str, KnowledgeAgent]:
    # RAG as measured here is the prompt retrieval (the agent retrieves; no search tool)
    config = AgentConfig(
        chunk_words=60, overlap_words=15, top_k=4, max_tokens=48, retrieval="prompt"
    )
    if not loop:
        config = dataclasses.replace(config, plan=False, refine=False)
    return {s: KnowledgeAgent(api, index_dir, config) for s in SYSTEMS}


async def run(url: str, args: argparse.Namespace) -> dict[str, Any]:
    questions = load_questions(EVAL)[: args.questions]
    api = ModelyardAPI(url)
    result: dict[str, Any] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            index_dir = Path(tmp)
            direct = make_agents(api, index_dir, loop=False)
            t0 = time.perf_counter()
            await direct["rag"].ingest(EVAL / "knowledge")
            result["ingest_s"] = round(time.perf_counter() - t0, 2)
            result["retrieval"] = await retrieval(direct["rag"], load_questions(EVAL))
            await direct["none"].ask("Hello, who are you?", mode="none")  # warm the engine
            t0 = time.perf_counter()
            prefix_id = await direct["cag"].pin_knowledge()
            result["pin_s"] = round(time.perf_counter() - t0, 2)
            pinned = await api.get_prefix(prefix_id)
            result["pinned_prefix"] = pinned
            rows = await run_systems(direct, questions)
            result["single_call"] = {s: summarise(rows[s]) for s in SYSTEMS}
            result["single_call_rows"] = rows
            write_json(args.name + "_partial", result)  # kept if the loop section fails
            if args.loop_questions:
                await flush_prefix_cache(url, seed=1)  # the loop's prompts start cold too
                loop_agents = make_agents(api, index_dir, loop=True)
                loop_rows = await run_systems(loop_agents, questions[: args.loop_questions])
                result["agent_loop"] = {s: summarise(loop_rows[s]) for s in SYSTEMS}
                result["agent_loop_rows"] = loop_rows
            await direct["cag"].unpin_knowledge()
    finally:
        await api.aclose()
    single = result["single_call"]
    result["cag_over_rag_answer_ttft_p50"] = round(
        single["cag"]["answer_ttft_p50_ms"] / single["rag"]["answer_ttft_p50_ms"], 3
    )
    result["cag_over_rag_question_ttft_p50"] = round(
        single["cag"]["question_ttft_p50_ms"] / single["rag"]["question_ttft_p50_ms"], 3
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", help="an already running server (default: start one)")
    parser.add_argument("--questions", type=int, default=32)
    parser.add_argument("--loop-questions", type=int, default=8)
    parser.add_argument("--log", default="/tmp/agent_bench_server.log")
    parser.add_argument("--name", default="agent")
    args = parser.parse_args()
    server = None
    url = args.url
    if url is None:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with open(args.log, "w") as log:
            server = subprocess.Popen(
                modelyard_cli("serve", "--port", str(port), "--max-num-batched-tokens", "512"),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
    try:
        wait_http_ready(url + "/ready", server)
        result = asyncio.run(run(url, args))
        if server is not None:
            result["server_tree_rss_mb"] = tree_rss_mb(server.pid)
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)
    result["host"] = host_info()
    result["command"] = " ".join([os.path.basename(sys.executable), *sys.argv])
    path = write_json(args.name, result)
    print_table(result)
    print(f"wrote {path}")


def print_table(result: dict[str, Any]) -> None:
    r = result["retrieval"]
    print(f"retrieval over {r['chunks']} chunks: hit@1 {r['hit_at_1']}  hit@5 {r['hit_at_5']}")
    print(
        f"knowledge pinned: {result['pinned_prefix']['num_tokens']} tokens in {result['pin_s']} s"
    )
    for section in ("single_call", "agent_loop"):
        if section not in result:
            continue
        print(
            f"\n{section}: system | answer TTFT p50 | question TTFT p50 | e2e p50 | "
            "prompt/cached tokens | calls | correct"
        )
        for system, s in result[section].items():
            print(
                f"{system:5} | {s['answer_ttft_p50_ms']} ms | {s['question_ttft_p50_ms']} ms | "
                f"{s['e2e_p50_ms']} ms | {s['prompt_tokens_mean']}/{s['cached_tokens_mean']} | "
                f"{s['model_calls_per_question']} | {s['answer_correct']}"
            )
    print(f"\nCAG/RAG answer TTFT p50: {result['cag_over_rag_answer_ttft_p50']}")


if __name__ == "__main__":
    main()
