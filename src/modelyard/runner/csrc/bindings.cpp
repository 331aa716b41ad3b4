// Every op of the modelyard_kernels library: its schema and its CPU implementation (ops.h).
#include <torch/library.h>

#include "ops.h"

using namespace modelyard::ops;

TORCH_LIBRARY(modelyard_kernels, m) {
  // paged_decode.cpp
  m.def(
      "paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
      "Tensor seq_lens, float scale, int window, int layout=0) -> Tensor");
  m.impl("paged_decode_attention", c10::DispatchKey::CPU, &paged_decode_attention);
  // rms_norm.cpp, fused_ops.cpp
  m.def("rms_norm(Tensor x, Tensor weight, float eps, int sum_width) -> Tensor");
  m.def(
      "add_rms_norm(Tensor(a!) x, Tensor delta, Tensor weight, float eps, int sum_width) -> "
      "Tensor");
  m.def("mean_squares(Tensor x, int sum_width) -> Tensor");
  m.impl("mean_squares", c10::DispatchKey::CPU, &mean_squares);
  m.def("argmax_rows(Tensor x) -> Tensor");
  m.def("silu_mul(Tensor x) -> Tensor");
  m.impl("silu_mul", c10::DispatchKey::CPU, &silu_mul);
  m.def(
      "rope_store(Tensor(a!) qkv, Tensor cos, Tensor signed_sin, Tensor positions, "
      "Tensor(b!) k_cache, Tensor(c!) v_cache, Tensor slots, int num_heads, int layout=0) -> ()");
  m.impl("rms_norm", c10::DispatchKey::CPU, &rms_norm);
  m.impl("add_rms_norm", c10::DispatchKey::CPU, &add_rms_norm);
  m.impl("argmax_rows", c10::DispatchKey::CPU, &argmax_rows);
  m.impl("rope_store", c10::DispatchKey::CPU, &rope_store);
  // gemm.cpp
  m.def("pack_weight(Tensor w) -> Tensor");
  m.def("packed_linear(Tensor x, Tensor packed, int n, Tensor? bias) -> Tensor");
  m.impl("pack_weight", c10::DispatchKey::CPU, &pack_weight);
  m.impl("packed_linear", c10::DispatchKey::CPU, &packed_linear);
  m.def("pack_swiglu(Tensor gate, Tensor up) -> Tensor");
  m.def("packed_swiglu(Tensor x, Tensor packed, int n) -> Tensor");
  m.impl("pack_swiglu", c10::DispatchKey::CPU, &pack_swiglu);
  m.impl("packed_swiglu", c10::DispatchKey::CPU, &packed_swiglu);
  // gemm_bf16.cpp
  m.def("team_begin() -> ()", &team_begin);
  m.def("team_end() -> ()", &team_end);
  m.def("claim_probe(int units, int fail, int unit_us, int run=1) -> Tensor", &claim_probe);
  m.def("bf16_gemm_supported() -> bool", &bf16_gemm_supported);
  m.def("pack_bf16(Tensor w) -> Tensor");
  m.def("pack_swiglu_bf16(Tensor gate, Tensor up) -> Tensor");
  m.def("packed_linear_bf16(Tensor x, Tensor packed, int n) -> Tensor");
  m.def("packed_swiglu_bf16(Tensor x, Tensor packed, int width) -> Tensor");
  m.impl("pack_bf16", c10::DispatchKey::CPU, &pack_bf16);
  m.impl("pack_swiglu_bf16", c10::DispatchKey::CPU, &pack_swiglu_bf16);
  m.impl("packed_linear_bf16", c10::DispatchKey::CPU, &packed_linear_bf16);
  m.impl("packed_swiglu_bf16", c10::DispatchKey::CPU, &packed_swiglu_bf16);
  // gemm_amx.cpp
  m.def("amx_ready() -> bool", &amx_ready);
  m.def("packed_linear_amx(Tensor x, Tensor packed, int n) -> Tensor");
  m.def("packed_swiglu_amx(Tensor x, Tensor packed, int width) -> Tensor");
  m.impl("packed_linear_amx", c10::DispatchKey::CPU, &packed_linear_amx);
  m.impl("packed_swiglu_amx", c10::DispatchKey::CPU, &packed_swiglu_amx);
  // decode_loop.cpp
  m.def(
      "decode_layers(Tensor(a!) x, Tensor[] weights, Tensor[] norms, Tensor(b!)[] k_caches, "
      "Tensor(c!)[] v_caches, Tensor cos, Tensor signed_sin, Tensor positions, Tensor slots, "
      "Tensor block_tables, Tensor seq_lens, int gemm, int num_heads, int intermediate, "
      "float eps, float scale, int window, int layout, int sum_width) -> ()");
  m.impl("decode_layers", c10::DispatchKey::CPU, &decode_layers);
  // sampling.cpp
  m.def("sample_rows(Tensor logits, Tensor inv_temperature, Tensor uniform) -> Tensor");
  m.impl("sample_rows", c10::DispatchKey::CPU, &sample_rows);
  // gemm_int8.cpp
  m.def("packed_linear_int8(Tensor x, Tensor packed, Tensor scale, int n, Tensor? bias) -> Tensor");
  m.impl("packed_linear_int8", c10::DispatchKey::CPU, &packed_linear_int8);
  m.def("packed_linear_bf16w(Tensor x, Tensor packed, int n, Tensor? bias) -> Tensor");
  m.impl("packed_linear_bf16w", c10::DispatchKey::CPU, &packed_linear_bf16w);
  // gemm_gguf.cpp
  m.def(
      "packed_linear_gguf(Tensor x, Tensor packed, int kind, int n, Tensor? bias, int dot=0) -> "
      "Tensor");
  m.def("packed_swiglu_gguf(Tensor x, Tensor packed, int kind, int width, int dot=0) -> Tensor");
  m.def("dequantize_gguf(Tensor packed, int kind, int n) -> Tensor");
  m.impl("packed_swiglu_gguf", c10::DispatchKey::CPU, &packed_swiglu_gguf);
  m.impl("packed_linear_gguf", c10::DispatchKey::CPU, &packed_linear_gguf);
  m.impl("dequantize_gguf", c10::DispatchKey::CPU, &dequantize_gguf);
}
