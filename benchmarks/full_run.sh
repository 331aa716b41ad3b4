#!/usr/bin/env bash
# The battery behind docs/benchmarks.md's table for this host, one benchmark after another,
# each holding /work/bench.lock (other users of a shared host wait), then the verdict on every
# target (benchmarks/targets.py) over all the runs kept for this host. ~50 minutes on 2 cores.
# Results land in benchmarks/results/<host-kind>/HOST/, each as its benchmark's next free runN
# (engine_throughput_run7.json, compare_servers_bfloat16_c32_run7/, structured_serving_run7.json,
# ...). Usage:
#   benchmarks/full_run.sh HOST [PEERS_DIR]      e.g. benchmarks/full_run.sh zen4
# PEERS_DIR (default /work/sidecar) holds vllm-venv, llama-venv and the bf16 GGUF
# (benchmarks/setup_peers.sh); LLAMA_VENV names another llama.cpp venv in it.
set -euo pipefail
cd "$(dirname "$0")/.."
HOST=${1:?host label, e.g. zen4}
PEERS=${2:-/work/sidecar}
PY=${PYTHON:-.venv/bin/python}
KIND_DIR=$("$PY" -c 'import sys; sys.path.insert(0, "benchmarks"); import common
print(common.results_dir())')
R=$KIND_DIR/$HOST
mkdir -p "$R"
VLLM=(--vllm-python "$PEERS/vllm-venv/bin/python")
LLAMA=(--llamacpp-python "$PEERS/${LLAMA_VENV:-llama-venv}/bin/python"
  --llamacpp-gguf "$PEERS/smollm2-135m-bf16.gguf")
SHAPE=(--input-len 128 --output-len 128)
run() { echo "== $*" >&2; flock /work/bench.lock "$@"; }
# NAME_runN for the first N that names no file or folder in $R yet
next() { local n=1; while compgen -G "$R/$1_run$n" >/dev/null || [ -e "$R/$1_run$n.json" ]; do
  n=$((n + 1)); done; echo "$1_run$n"; }

run "$PY" benchmarks/engine_throughput.py --dtypes float32 bfloat16 --systems modelyard vllm \
  "${VLLM[@]}" --out "$HOST/$(next engine_throughput)"
for dtype in bfloat16 float32; do
  run "$PY" benchmarks/compare_servers.py --dtype "$dtype" --sweep 32 --num-requests 64 \
    "${SHAPE[@]}" --servers modelyard vllm "${VLLM[@]}" \
    --out "$R/$(next "compare_servers_${dtype}_c32")"
done
run "$PY" benchmarks/compare_servers.py --dtype bfloat16 --sweep 1 --num-requests 8 "${SHAPE[@]}" \
  --servers modelyard vllm llamacpp "${VLLM[@]}" "${LLAMA[@]}" \
  --out "$R/$(next compare_servers_bfloat16_c1)"
run "$PY" benchmarks/compare_servers.py --dtype float32 --sweep 1 --num-requests 8 "${SHAPE[@]}" \
  --servers modelyard vllm "${VLLM[@]}" --out "$R/$(next compare_servers_float32_c1)"
run "$PY" benchmarks/serving.py --dtype bfloat16 --concurrency 32 --rounds 5
mv "$KIND_DIR/serving_c32_bfloat16.json" "$R/$(next serving_c32_bfloat16).json"
run "$PY" benchmarks/structured_serving.py --rounds 3 --num-requests 64 --concurrency 32 \
  --vllm-python "$PEERS/vllm-venv/bin/python" --out "$HOST/$(next structured_serving)"
"$PY" benchmarks/targets.py "$R" --json "$R/targets.json" | tee "$R/targets.md"
