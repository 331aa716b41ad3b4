// The ops the kernels library registers with torch (bindings.cpp), one definition each in
// the file named above its group.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace modelyard::ops {

// paged_decode.cpp
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache,
                                  const at::Tensor& v_cache, const at::Tensor& block_tables,
                                  const at::Tensor& seq_lens, double scale, int64_t window,
                                  int64_t layout);

// rms_norm.cpp
at::Tensor mean_squares(const at::Tensor& x, int64_t sum_width);
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps, int64_t sum_width);
at::Tensor add_rms_norm(at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight,
                        double eps, int64_t sum_width);

// fused_ops.cpp
at::Tensor silu_mul(const at::Tensor& x);
at::Tensor argmax_rows(const at::Tensor& x);
void rope_store(at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& signed_sin,
                const at::Tensor& positions, at::Tensor& k_cache, at::Tensor& v_cache,
                const at::Tensor& slots, int64_t num_heads, int64_t layout);

// gemm.cpp
at::Tensor pack_weight(const at::Tensor& w);
at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n,
                         const c10::optional<at::Tensor>& bias);
at::Tensor pack_swiglu(const at::Tensor& gate, const at::Tensor& up);
at::Tensor packed_swiglu(const at::Tensor& x, const at::Tensor& packed, int64_t n);
// (not an op: gemm_int8.cpp's packed_linear_bf16w runs its calls of more than one row here)
at::Tensor widened_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n,
                          const float* bias);

// gemm_bf16.cpp
bool bf16_gemm_supported();
at::Tensor pack_bf16(const at::Tensor& w);
at::Tensor pack_swiglu_bf16(const at::Tensor& gate, const at::Tensor& up);
at::Tensor packed_linear_bf16(const at::Tensor& x, const at::Tensor& packed, int64_t n);
at::Tensor packed_swiglu_bf16(const at::Tensor& x, const at::Tensor& packed, int64_t width);

// decode_loop.cpp
void decode_layers(at::Tensor& x, at::TensorList weights, at::TensorList norms,
                   at::TensorList k_caches, at::TensorList v_caches, const at::Tensor& cos,
                   const at::Tensor& signed_sin, const at::Tensor& positions,
                   const at::Tensor& slots, const at::Tensor& block_tables,
                   const at::Tensor& seq_lens, int64_t gemm, int64_t num_heads,
                   int64_t intermediate, double eps, double scale, int64_t window,
                   int64_t layout, int64_t sum_width);

// team.cpp
void team_begin();
void team_end();
at::Tensor claim_probe(int64_t units, int64_t fail, int64_t unit_us, int64_t run);

// gemm_amx.cpp
bool amx_ready();
at::Tensor packed_linear_amx(const at::Tensor& x, const at::Tensor& packed, int64_t n);
at::Tensor packed_swiglu_amx(const at::Tensor& x, const at::Tensor& packed, int64_t width);

// sampling.cpp
at::Tensor sample_rows(const at::Tensor& logits, const at::Tensor& inv_temperature,
                       const at::Tensor& uniform);

// gemm_int8.cpp
at::Tensor packed_linear_int8(const at::Tensor& x, const at::Tensor& packed,
                              const at::Tensor& scale, int64_t n,
                              const c10::optional<at::Tensor>& bias);
at::Tensor packed_linear_bf16w(const at::Tensor& x, const at::Tensor& packed, int64_t n,
                               const c10::optional<at::Tensor>& bias);

// gemm_gguf.cpp
at::Tensor packed_linear_gguf(const at::Tensor& x, const at::Tensor& packed, int64_t kind,
                              int64_t n, const c10::optional<at::Tensor>& bias, int64_t dot);
at::Tensor packed_swiglu_gguf(const at::Tensor& x, const at::Tensor& packed, int64_t kind,
                              int64_t width, int64_t dot);
at::Tensor dequantize_gguf(const at::Tensor& packed, int64_t kind, int64_t n);

}  // namespace modelyard::ops
