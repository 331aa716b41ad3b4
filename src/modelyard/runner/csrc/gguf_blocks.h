// The GGUF blocks of gemm_gguf.cpp as its panels hold them: per (panel, 32-k block) the 16
// columns' float32 scales (Q4_1: then their mins), then per k the 16 columns' quants (Q4_1: 8
// bytes, column c in the low nibble of byte c and column c + 8 in its high nibble; Q8_0: 16
// signed bytes), and one k row of them widened to float32 parts (panels.h).
#pragma once

#include <cstdint>

#include "panels.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace modelyard::gguf {

constexpr int64_t kBlockK = 32;

enum Kind : int64_t { kQ4_1 = 0, kQ8_0 = 1 };

// bytes of one (panel, 32-k block): the scales (and mins), then the quants
constexpr int64_t scale_bytes(Kind kind) { return (kind == kQ4_1 ? 2 : 1) * kNR * 4; }
constexpr int64_t quant_bytes(Kind kind) { return kBlockK * (kind == kQ4_1 ? 8 : 16); }
constexpr int64_t block_bytes(Kind kind) { return scale_bytes(kind) + quant_bytes(kind); }

// part j of the 16 quants of one k row as float32, exact (GCC converts bytes in generic vectors
// lane by lane, so each instruction set's widening is spelled out)
template <Kind K>
inline part quants(const uint8_t* q, int j) {
#if defined(__AVX512F__)
  __m512i ints;
  if constexpr (K == kQ4_1) {  // the 8 bytes' low nibbles, then their high ones
    const __m128i packed = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q));
    const __m128i mask = _mm_set1_epi8(15);
    ints = _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(
        _mm_and_si128(packed, mask), _mm_and_si128(_mm_srli_epi16(packed, 4), mask)));
  } else {
    ints = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
  }
  const __m512 f = _mm512_cvtepi32_ps(ints);
  (void)j;
  return reinterpret_cast<const part&>(f);
#elif defined(__AVX2__)
  __m256i ints;
  if constexpr (K == kQ4_1) {
    const __m128i packed = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q));
    const __m256i bytes = _mm256_cvtepu8_epi32(packed);
    ints = j == 0 ? _mm256_and_si256(bytes, _mm256_set1_epi32(15)) : _mm256_srli_epi32(bytes, 4);
  } else {
    ints = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + j * 8)));
  }
  const __m256 f = _mm256_cvtepi32_ps(ints);
  return reinterpret_cast<const part&>(f);
#else
  part out;
  for (int64_t c = 0; c < kPartCols; ++c) {
    const int64_t col = j * kPartCols + c;
    out[c] = K == kQ4_1 ? static_cast<float>(col < 8 ? q[col] & 15 : q[col - 8] >> 4)
                        : static_cast<float>(static_cast<int8_t>(q[col]));
  }
  return out;
#endif
}

// one block's scales (d) and mins (m, Q4_1) as parts
template <Kind K>
struct Scales {
  part d[kParts], m[kParts];
  Scales() = default;
  explicit Scales(const uint8_t* block) {
    const float* scale = reinterpret_cast<const float*>(block);
    for (int j = 0; j < kParts; ++j) {
      d[j] = load_part(scale, j);
      m[j] = K == kQ4_1 ? load_part(scale + kNR, j) : part{};
    }
  }
};

// the 16 weights of row k of one block (q: the block's quants) as parts: d q (+ m), where d q
// is exact, so there is one rounding as in numpy's dequantization
template <Kind K>
inline void weights(const uint8_t* q, int64_t k, const Scales<K>& s, part* w) {
  const uint8_t* row = q + k * (K == kQ4_1 ? 8 : 16);
  for (int j = 0; j < kParts; ++j) {
    w[j] = K == kQ4_1 ? quants<K>(row, j) * s.d[j] + s.m[j] : quants<K>(row, j) * s.d[j];
  }
}

}  // namespace modelyard::gguf
