// The bfloat16 decode attention of AVX-512 BF16 hosts (decode_dp.cpp) and of AMX hosts with a
// cache in the tile layout (decode_tiles.cpp): what both share, and their entry points, which
// paged_decode_attention (paged_decode.cpp) tries before the widened path.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <limits>

#include "vec.h"

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__) && \
    defined(__AVX512VL__)
// bfloat16 on AVX-512 BF16 hosts: `vdpbf16ps` multiplies bf16 pairs exactly and sums them in
// float32, the arithmetic of the widened path without widening anything. Scores: one key row
// against a query row in hd / 32 instructions, then 16 keys' lane sums at once by a transposing
// reduction. Values: two tokens per instruction, their rows interleaved by an unpack (the
// accumulators then hold the columns in unpack order, restored at the end). 30-45 % less time
// than the widened path on the default model's decode step.
#define MODELYARD_DP_ATTENTION 1
#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
// AMX tiles for the scores of a plain cache (decode_dp<G, C, true>) and for both products on a
// cache in the tile layout (decode_tiles)
#define MODELYARD_AMX_SCORES 1
#endif
#include <immintrin.h>

namespace modelyard::attention {

// decode_dp where it is instantiated for the shapes (1-4 query heads per KV head, head size 64
// or 128), else an undefined tensor
at::Tensor try_decode_dp(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                         const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale,
                         int64_t window);

// exp16 of vec.h on an AVX-512 register
inline __m512 exp16(__m512 x) {
  const modelyard::v16 y = modelyard::exp16(reinterpret_cast<const modelyard::v16&>(x));
  return reinterpret_cast<const __m512&>(y);
}

// the first min(left, 16) lanes
inline __mmask16 head_mask(int64_t left) {
  return left >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << left) - 1u);
}

// scores s (n) times scale -> exp(s scale - max) rounded to bf16 (SDPA's P) in pb; returns
// 1 / the float32 sum (scale 1 for scores already scaled: a multiply by 1 changes no bits)
inline float exp_probs(const float* s, int64_t n, at::BFloat16* pb, float scale = 1.f) {
  const __m512 f = _mm512_set1_ps(scale);
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 lanes = head_mask(n - i);
    m = _mm512_mask_max_ps(m, lanes, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, s + i), f));
  }
  const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(m));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 lanes = head_mask(n - i);
    const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, s + i), f);
    const __m512 e = exp16(_mm512_sub_ps(x, top));
    sum = _mm512_mask_add_ps(sum, lanes, sum, e);
    const modelyard::v16 ev = reinterpret_cast<const modelyard::v16&>(e);  // rounded as SDPA's P
    const modelyard::u32x16 rounded = modelyard::round_bf16x16_bits(ev) >> 16;
    _mm256_mask_storeu_epi16(pb + i, lanes,
                             _mm512_cvtepi32_epi16(reinterpret_cast<const __m512i&>(rounded)));
  }
  return 1.f / _mm512_reduce_add_ps(sum);
}

#if defined(MODELYARD_AMX_SCORES)
// decode_tiles for 1-4 query heads per KV head, else an undefined tensor
at::Tensor try_decode_tiles(const at::Tensor& q, const at::Tensor& k_cache,
                            const at::Tensor& v_cache, const at::Tensor& block_tables,
                            const at::Tensor& seq_lens, double scale, int64_t window);

// palette 1 with tiles 0-7 of these rows and bytes per row
inline void configure_tiles(const std::array<uint8_t, 8>& rows,
                            const std::array<uint16_t, 8>& colsb) {
  struct alignas(64) {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
  } cfg;
  for (size_t t = 0; t < 8; ++t) cfg.colsb[t] = colsb[t], cfg.rows[t] = rows[t];
  _tile_loadconfig(&cfg);
}
#endif

}  // namespace modelyard::attention
#endif
