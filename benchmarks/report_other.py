"""The "other benchmarks" section of docs/benchmarks.md: one line per benchmark, from its JSON.

Each entry names the script, the result file it reads (relative to benchmarks/results/) and a
function that turns the file into one sentence of figures. A file that is missing or not in the
shape its script writes is left out of the page, never guessed at.
"""

from __future__ import annotations

import json
import statistics
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _multimodel(d: dict[str, Any]) -> str:
    thrash = d["thrash"]
    return (
        f"dynamic batching at c=32 serves {d['batching_c32']['speedup']:g}× the requests/s of "
        f"batch size 1; with more models than fit, skewed (80/20) traffic hits loaded models "
        f"{thrash['skewed_80_20']['hit_rate']:.0%} of the time against "
        f"{thrash['uniform']['hit_rate']:.0%} for uniform traffic; `/predict` adds "
        f"{d['predict_overhead']['overhead_p50_ms']:g} ms p50 over calling the backend directly"
    )


def _gateway(d: dict[str, Any]) -> str:
    v = d["variants"]
    return (
        "p50 overhead per request over auth off: "
        f"{v['memory']['overhead_p50_us']:.0f} µs with in-memory quotas, "
        f"{v['memory-jwt']['overhead_p50_us']:.0f} µs with JWTs, "
        f"{v['redis']['overhead_p50_us']:.0f} µs with quotas in Redis (targets: 1 ms, 2 ms)"
    )


def _ray(d: dict[str, Any]) -> str:
    p = d["points"][0]
    r = p["ratios_prefix_over_pow2"]
    replicas = p.get("replicas") or d["settings"].get("replicas", 2)  # 2: the script's default
    return (
        f"with {replicas} replicas, prefix-aware routing gives {r['engine_hit_rate']:g}× the "
        f"prefix-cache hit rate of power-of-two choices and {r['ttft_p50']:g}× its TTFT p50"
    )


def _agent(d: dict[str, Any]) -> str:
    loop = d["agent_loop"]
    return (
        f"retrieval hit@1 {d['retrieval']['hit_at_1']:g}, hit@5 {d['retrieval']['hit_at_5']:g}; "
        f"e2e p50 per question: RAG {loop['rag']['e2e_p50_ms'] / 1000:.1f} s, "
        f"CAG {loop['cag']['e2e_p50_ms'] / 1000:.1f} s; CAG's answer TTFT p50 is "
        f"{d['cag_over_rag_answer_ttft_p50']:g}× RAG's (the knowledge is pinned)"
    )


def _spec(d: dict[str, Any]) -> str:
    r = d["ratios"]
    return (
        f"prompt lookup (ngram) on input-grounded prompts: {r['ngram_c1']:g}× plain decoding's "
        f"tok/s at c=1, {r['ngram_c32']:g}× at c=32 (where the default policy stops speculating)"
    )


def _lora(d: dict[str, Any]) -> str:
    mixed = d["adapters"]["output_tok_s"] / d["no_lora_engine"]["output_tok_s"]
    return (
        f"32 requests spread over 4 rank-16 adapters in mixed batches: {mixed:.2f}× the tok/s "
        f"of an engine without LoRA; a first request on a new adapter takes "
        f"{min(d['adapter_first_request_s'].values()):g}-"
        f"{max(d['adapter_first_request_s'].values()):g} s"
    )


def _aiperf(d: dict[str, Any]) -> str:
    ratios = [r[m]["aiperf_over_ours"] for r in d["rounds"] for m in ("ttft", "itl")]
    return (
        f"NVIDIA's aiperf and `modelyard bench` measuring the same server agree on TTFT and ITL "
        f"p50 within {max(abs(1 - x) for x in ratios):.1%} over {len(d['rounds'])} alternating "
        "rounds (the check asks for 15 %)"
    )


def _gguf(d: dict[str, Any]) -> str:
    runs = [r["runs"] for r in d["rounds"]]

    def median(server: str, field: str) -> float:
        return statistics.median(r[server][field] for r in runs)

    gb = d["gguf"]["bytes"] / 1e9
    c = d["args"]["concurrency"]
    served = "one request at a time" if c == 1 else f"at c={c} against `llama-server -np {c}`"
    return (
        f"a {gb:.2f} GB Q4_K_M GGUF of Llama-3.2-1B's shape served {served}: output "
        f"{median('modelyard', 'output_tok_s'):.1f} against "
        f"{median('llamacpp', 'output_tok_s'):.1f} tok/s "
        f"({d['ratios_median']['output_tok_s']:g}×), "
        f"ITL p50 {median('modelyard', 'itl_p50_ms'):.1f} ms against "
        f"{median('llamacpp', 'itl_p50_ms'):.1f} ms ({d['ratios_median']['itl_p50']:g}×), TTFT "
        f"p50 {median('modelyard', 'ttft_p50_ms'):.0f} against "
        f"{median('llamacpp', 'ttft_p50_ms'):.0f} ms; peak RSS of the tree "
        f"{median('modelyard', 'peak_rss_mb') / 1024:.2f} against "
        f"{median('llamacpp', 'peak_rss_mb') / 1024:.2f} GiB with the same "
        f"{d['kv']['bytes'] / 2**20:.0f} MiB of KV ({len(runs)} alternating rounds)"
    )


# (title, script, result file under benchmarks/results/, one sentence of figures)
ENTRIES: list[tuple[str, str, str, Callable[[dict[str, Any]], str]]] = [
    ("Many models", "multimodel.py", "avx2/multimodel.json", _multimodel),
    ("Gateway cost", "gateway_overhead.py", "avx2/gateway_overhead.json", _gateway),
    ("Prefix-aware routing on Ray Serve", "ray_routing.py", "amx/ray_routing.json", _ray),
    ("Prefix-aware routing on Ray Serve", "ray_routing.py", "amx/ray_routing_3replicas.json", _ray),
    ("Knowledge agent, RAG against CAG", "agent.py", "agent.json", _agent),
    (
        "Speculative decoding",
        "spec_decode.py",
        "avx512-bf16/zen5/spec_decode_adaptive.json",
        _spec,
    ),
    ("Multi-LoRA", "lora.py", "amx/lora.json", _lora),
    ("The load generator", "aiperf_crosscheck.py", "avx2/aiperf_crosscheck.json", _aiperf),
    (
        "GGUF against llama.cpp",
        "gguf_serving.py",
        "avx2/gguf_serving_llama-1b-q4km_c1.json",
        _gguf,
    ),
]

HEAD = """\
## Other benchmarks

Each in its own script under `benchmarks/`, on one host, with its result file (which records the
host, the command and every figure):
"""

TAIL = """\
The `kernel_ab*.json` files beside each host's results time the alternatives behind the
runner's kernel choices (one against the other, in alternating rounds); what each choice rests
on is in [figures_behind_choices.md]({prefix}figures_behind_choices.md).
"""


def section(results: Path, link_prefix: str) -> str:
    lines = [HEAD]
    for title, script, name, sentence in ENTRIES:
        path = results / name
        if not path.is_file():
            continue
        try:
            text = sentence(json.loads(path.read_text()))
        except (KeyError, TypeError, IndexError, ZeroDivisionError):
            continue
        lead = f"**{title}** (`{script}`)"
        item = f"- {lead}: {text} ([{name}]({link_prefix}{name}))."
        lines.append(
            textwrap.fill(
                item,
                width=100,
                subsequent_indent="  ",
                break_on_hyphens=False,
                break_long_words=False,
            )
        )
    return "\n".join(lines) + "\n\n" + TAIL.format(prefix=link_prefix).rstrip()
