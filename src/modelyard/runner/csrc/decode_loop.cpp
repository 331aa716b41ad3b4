// Every decoder layer of a Llama-family step in one call (runner.decode_loop): the same kernels,
// in the same order, as DecoderModel._fused_layers runs them from Python, so the same bits; what
// goes is the interpreter and the dispatcher between them (eight calls a layer, ~1-1.5 ms of a
// 2-core decode step in which the Team's helper thread only spins).
#include <ATen/ATen.h>

#include "ops.h"

namespace modelyard::ops {

namespace {

// Which GEMM a layer's weights were packed for (runner.decode_loop.GEMM_KINDS)
enum Gemm : int64_t { kFloat32 = 0, kBf16 = 1, kAmx = 2 };

at::Tensor linear(int64_t kind, const at::Tensor& x, const at::Tensor& packed, int64_t n) {
  switch (kind) {
    case kFloat32: return packed_linear(x, packed, n, c10::nullopt);
    case kBf16: return packed_linear_bf16(x, packed, n);
    case kAmx: return packed_linear_amx(x, packed, n);
    default: TORCH_CHECK(false, "decode_layers: unknown GEMM kind ", kind);
  }
}

at::Tensor swiglu(int64_t kind, const at::Tensor& x, const at::Tensor& packed, int64_t width) {
  switch (kind) {
    case kFloat32: return packed_swiglu(x, packed, width);
    case kBf16: return packed_swiglu_bf16(x, packed, width);
    case kAmx: return packed_swiglu_amx(x, packed, width);
    default: TORCH_CHECK(false, "decode_layers: unknown GEMM kind ", kind);
  }
}

}  // namespace

void decode_layers(at::Tensor& x, at::TensorList weights, at::TensorList norms,
                   at::TensorList k_caches, at::TensorList v_caches, const at::Tensor& cos,
                   const at::Tensor& signed_sin, const at::Tensor& positions,
                   const at::Tensor& slots, const at::Tensor& block_tables,
                   const at::Tensor& seq_lens, int64_t gemm, int64_t num_heads,
                   int64_t intermediate, double eps, double scale, int64_t window,
                   int64_t layout, int64_t sum_width) {
  const auto layers = static_cast<int64_t>(k_caches.size());
  TORCH_CHECK(layers > 0 && static_cast<int64_t>(v_caches.size()) == layers &&
                  static_cast<int64_t>(weights.size()) == 4 * layers &&
                  static_cast<int64_t>(norms.size()) == 2 * layers,
              "decode_layers: 4 weights, 2 norms and a K and V cache per layer");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "decode_layers: x must be (T, H) contiguous");
  const int64_t t = x.size(0), hidden = x.size(1);
  const int64_t nkv = k_caches[0].size(0), hd = k_caches[0].size(3);
  const int64_t q_width = num_heads * hd, qkv_width = (num_heads + 2 * nkv) * hd;
  at::Tensor h = rms_norm(x, norms[0], eps, sum_width);
  for (int64_t i = 0; i < layers; ++i) {
    at::Tensor k_cache = k_caches[i], v_cache = v_caches[i];
    at::Tensor qkv = linear(gemm, h, weights[4 * i], qkv_width);
    rope_store(qkv, cos, signed_sin, positions, k_cache, v_cache, slots, num_heads, layout);
    const at::Tensor q = qkv.narrow(1, 0, q_width).view({t, num_heads, hd});
    const at::Tensor attn = paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens,
                                                   scale, window, layout);
    const at::Tensor o = linear(gemm, attn.view({t, q_width}), weights[4 * i + 1], hidden);
    h = add_rms_norm(x, o, norms[2 * i + 1], eps, sum_width);
    const at::Tensor act = swiglu(gemm, h, weights[4 * i + 2], intermediate);
    const at::Tensor mlp = linear(gemm, act, weights[4 * i + 3], hidden);
    if (i + 1 < layers) {
      h = add_rms_norm(x, mlp, norms[2 * i + 2], eps, sum_width);
    } else {
      x.add_(mlp);
    }
  }
}

}  // namespace modelyard::ops
