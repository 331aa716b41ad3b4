// The GGUF blocks of gemm_gguf.cpp as its panels hold them. A file's block type (Kind) is
// repacked at load (runner.gguf_blocks.pack_gguf) into one of six layouts; per (panel, 32-k block):
// the 16 columns' float32 scales d, then (with a min, or Q6_K's second scale for k 16..31) 16
// more floats, then per k the 16 columns' quants: Int8 16 signed bytes; the others 8 bytes of
// low nibbles (column c in the low nibble of byte c, column c + 8 in its high nibble), then after
// all 32 k rows of nibbles, per k the columns' high bits (1 a column for 5-bit quants, 2 for
// Q6_K's 6-bit ones; column c at bit c * bits of the k's little-endian 2- or 4-byte word).
// A weight is d (q - offset), or d q + min: the same float32 operations as gguf's own numpy
// dequantization (d q is exact), so the same bits. One k row is widened to float32 parts
// (panels.h).
#pragma once

#include <cstdint>
#include <cstring>

#include "panels.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace modelyard::gguf {

constexpr int64_t kBlockK = 32;

// the file's block types (runner.gguf_blocks' kinds)
enum Kind : int64_t { kQ4_1, kQ8_0, kQ4_0, kQ5_0, kQ5_1, kQ4_K, kQ5_K, kQ6_K, kKinds };

// the panels' layouts: Min4 d q + m (Q4_1, Q4_K: sub-blocks of 32 with float d and m), Int8
// d q (Q8_0), Off4 d (q - 8) (Q4_0), Min5 (Q5_1, Q5_K), Off5 d (q - 16) (Q5_0), Off6
// d (q - 32) with one d per 16 k (Q6_K)
enum Layout : int { kMin4, kInt8, kOff4, kMin5, kOff5, kOff6 };

constexpr Layout layout_of(Kind kind) {
  constexpr Layout layouts[kKinds] = {kMin4, kInt8, kOff4, kOff5, kMin5, kMin4, kMin5, kOff6};
  return layouts[kind];
}

constexpr bool has_min(Layout l) { return l == kMin4 || l == kMin5; }
constexpr int high_bits(Layout l) { return l == kMin5 || l == kOff5 ? 1 : l == kOff6 ? 2 : 0; }
constexpr int offset(Layout l) { return l == kOff4 ? 8 : l == kOff5 ? 16 : l == kOff6 ? 32 : 0; }

// bytes of one (panel, 32-k block): the scales (and mins), then the quants
constexpr int64_t scale_bytes(Layout l) {
  return (has_min(l) || l == kOff6 ? 2 : 1) * kNR * 4;
}
constexpr int64_t quant_bytes(Layout l) {
  return l == kInt8 ? kBlockK * kNR : kBlockK * (kNR / 2 + kNR / 8 * high_bits(l));
}
constexpr int64_t block_bytes(Layout l) { return scale_bytes(l) + quant_bytes(l); }

// the high bits of row k's 16 columns (column c at bit c * high_bits): one 2- or 4-byte load
template <Layout L>
inline uint32_t high_word(const uint8_t* q, int64_t k) {
  constexpr int hb = high_bits(L);
  const uint8_t* h = q + kBlockK * 8 + k * 2 * hb;
  if constexpr (hb == 1) {
    uint16_t word;
    std::memcpy(&word, h, sizeof(word));
    return word;
  } else {
    uint32_t word;
    std::memcpy(&word, h, sizeof(word));
    return word;
  }
}

// part j of the 16 quants of row k of a block's quants q as int32 lanes, less the offset
#if defined(__AVX512F__)
template <Layout L>
inline __m512i quant_ints(const uint8_t* q, int64_t k) {
  if constexpr (L == kInt8) {
    return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + k * 16)));
  } else {  // the 8 bytes' low nibbles, then their high ones
    const __m128i packed = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + k * 8));
    const __m128i mask = _mm_set1_epi8(15);
    __m512i ints = _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(
        _mm_and_si128(packed, mask), _mm_and_si128(_mm_srli_epi16(packed, 4), mask)));
    constexpr int hb = high_bits(L);
    if constexpr (hb > 0) {
      const uint32_t word = high_word<L>(q, k);
      const __m512i shifts = _mm512_mullo_epi32(
          _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
          _mm512_set1_epi32(hb));
      const __m512i high = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32(word), shifts),
                                            _mm512_set1_epi32((1 << hb) - 1));
      ints = _mm512_or_si512(ints, _mm512_slli_epi32(high, 4));
    }
    if constexpr (offset(L) != 0) ints = _mm512_sub_epi32(ints, _mm512_set1_epi32(offset(L)));
    return ints;
  }
}
#elif defined(__AVX2__)
template <Layout L>
inline __m256i quant_ints(const uint8_t* q, int64_t k, int j) {
  if constexpr (L == kInt8) {
    const uint8_t* row = q + k * 16 + j * 8;
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row)));
  } else {
    const __m256i bytes =
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + k * 8)));
    __m256i ints =
        j == 0 ? _mm256_and_si256(bytes, _mm256_set1_epi32(15)) : _mm256_srli_epi32(bytes, 4);
    constexpr int hb = high_bits(L);
    if constexpr (hb > 0) {  // the k's word, one broadcast for both parts; part j's columns
      // from bit 8 j hb
      const __m256i word = _mm256_set1_epi32(high_word<L>(q, k));
      const __m256i shifts = _mm256_add_epi32(
          _mm256_setr_epi32(0, hb, 2 * hb, 3 * hb, 4 * hb, 5 * hb, 6 * hb, 7 * hb),
          _mm256_set1_epi32(8 * hb * j));
      const __m256i high =
          _mm256_and_si256(_mm256_srlv_epi32(word, shifts), _mm256_set1_epi32((1 << hb) - 1));
      ints = _mm256_or_si256(ints, _mm256_slli_epi32(high, 4));
    }
    if constexpr (offset(L) != 0) ints = _mm256_sub_epi32(ints, _mm256_set1_epi32(offset(L)));
    return ints;
  }
}
#endif

// the quant of column c of row k (the portable path)
template <Layout L>
inline int quant_of(const uint8_t* q, int64_t k, int64_t c) {
  if constexpr (L == kInt8) {
    return static_cast<int8_t>(q[k * 16 + c]);
  } else {
    const uint8_t* row = q + k * 8;
    int v = c < 8 ? row[c] & 15 : row[c - 8] >> 4;
    constexpr int hb = high_bits(L);
    if constexpr (hb > 0) {
      const uint32_t word = high_word<L>(q, k);
      v |= static_cast<int>((word >> (c * hb)) & ((1u << hb) - 1)) << 4;
    }
    return v - offset(L);
  }
}

// part j of the 16 quants of row k (less the offset) as float32, exact (GCC converts bytes in
// generic vectors lane by lane, so each instruction set's widening is spelled out)
template <Layout L>
inline part quants(const uint8_t* q, int64_t k, int j) {
#if defined(__AVX512F__)
  (void)j;
  const __m512 f = _mm512_cvtepi32_ps(quant_ints<L>(q, k));
  return reinterpret_cast<const part&>(f);
#elif defined(__AVX2__)
  const __m256 f = _mm256_cvtepi32_ps(quant_ints<L>(q, k, j));
  return reinterpret_cast<const part&>(f);
#else
  part out;
  for (int64_t c = 0; c < kPartCols; ++c) {
    out[c] = static_cast<float>(quant_of<L>(q, k, j * kPartCols + c));
  }
  return out;
#endif
}

// one block's scales (d) and mins (m; Off6: the scales of k 16..31) as parts
template <Layout L>
struct Scales {
  part d[kParts], m[kParts];
  Scales() = default;
  explicit Scales(const uint8_t* block) {
    const float* scale = reinterpret_cast<const float*>(block);
    for (int j = 0; j < kParts; ++j) {
      d[j] = load_part(scale, j);
      m[j] = scale_bytes(L) > kNR * 4 ? load_part(scale + kNR, j) : part{};
    }
  }
};

// the 16 weights of row k of one block (q: the block's quants) as parts: d q (+ m), where d q
// is exact, so there is one rounding as in numpy's dequantization
template <Layout L>
inline void weights(const uint8_t* q, int64_t k, const Scales<L>& s, part* w) {
  for (int j = 0; j < kParts; ++j) {
    if constexpr (has_min(L)) {
      w[j] = quants<L>(q, k, j) * s.d[j] + s.m[j];
    } else if constexpr (L == kOff6) {
      w[j] = quants<L>(q, k, j) * (k < kBlockK / 2 ? s.d[j] : s.m[j]);
    } else {
      w[j] = quants<L>(q, k, j) * s.d[j];
    }
  }
}

}  // namespace modelyard::gguf
