#!/usr/bin/env bash
# Every benchmark behind docs/benchmarks.md's table for this host's kind, one after another,
# holding /work/bench.lock (other users of a shared host wait). Results land in
# benchmarks/results/<host-kind>/. ~1 hour on 2 cores. Usage:
#   benchmarks/full_run.sh [PEERS_DIR]      (default /work/sidecar; see setup_peers.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
PEERS=${1:-/work/sidecar}
PY=${PYTHON:-.venv/bin/python}
VLLM=(--vllm-python "$PEERS/vllm-venv/bin/python")
LLAMA=(--llamacpp-python "$PEERS/llama-venv/bin/python" --llamacpp-gguf "$PEERS/smollm2-135m-bf16.gguf")
run() { echo "== $*" >&2; flock /work/bench.lock "$@"; }
run "$PY" benchmarks/engine_throughput.py --dtypes float32 bfloat16 --textbook-output-tokens 32 \
  "${VLLM[@]}"
run "$PY" benchmarks/serving.py --dtype bfloat16 --concurrency 32 --rounds 3
for dtype in bfloat16 float32; do
  servers=(modelyard vllm); [ "$dtype" = bfloat16 ] && servers+=(llamacpp)
  run "$PY" benchmarks/compare_servers.py --dtype "$dtype" --num-requests 32 --input-len 128 \
    --output-len 128 --servers "${servers[@]}" "${VLLM[@]}" "${LLAMA[@]}"
done
