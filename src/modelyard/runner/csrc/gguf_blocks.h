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

// the high bit of row k's 16 columns (5-bit quants: column c at bit c): one 2-byte load
inline uint32_t high_word(const uint8_t* q, int64_t k) {
  uint16_t word;
  std::memcpy(&word, q + kBlockK * 8 + k * 2, sizeof(word));
  return word;
}

// the nibbles come in groups of 4 k rows, 32 bytes a group: columns c and c + 8 (c < 8) of row
// k in byte 4 c + k % 4 (low, high nibble), so one column's 4 k are adjacent bytes (gguf_dot.h's
// operand); Q6_K's high bits in groups of 4 k too, 16 bytes a group: with the group's nibble
// bytes as two vectors of 32 (columns 0-7, columns 8-15), byte j holds 2 bits of elements j and
// j + 16 of the first (bits 0-1, 2-3) and of the second (4-5, 6-7)
constexpr int64_t kGroupK = 4, kGroupBytes = 32, kHighGroupBytes = 16;

#if defined(__AVX2__)
// part j (columns 8 j .. 8 j + 7) of row k's quants as int32 lanes, less the offset
template <Layout L>
inline __m256i quant_part(const uint8_t* q, int64_t k, int j) {
  if constexpr (L == kInt8) {
    const uint8_t* row = q + k * 16 + j * 8;
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row)));
  } else {
    const int64_t g = k / kGroupK, kk = k % kGroupK;
    const __m256i group = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + g * kGroupBytes));
    const __m256i bytes = _mm256_and_si256(
        _mm256_srl_epi32(group, _mm_cvtsi32_si128(static_cast<int>(8 * kk))),
        _mm256_set1_epi32(255));
    __m256i ints = j == 0 ? _mm256_and_si256(bytes, _mm256_set1_epi32(15))
                          : _mm256_srli_epi32(bytes, 4);
    if constexpr (high_bits(L) == 1) {  // part j's columns from bit 8 j of the k's word
      const __m256i shifts =
          _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(8 * j));
      const __m256i high = _mm256_and_si256(
          _mm256_srlv_epi32(_mm256_set1_epi32(high_word(q, k)), shifts), _mm256_set1_epi32(1));
      ints = _mm256_or_si256(ints, _mm256_slli_epi32(high, 4));
    } else if constexpr (high_bits(L) == 2) {  // columns 8 j + c: byte 4 (c % 4) + kk
      const __m128i four = _mm_loadu_si128(
          reinterpret_cast<const __m128i*>(q + kBlockK * 8 + g * kHighGroupBytes));
      const int s = static_cast<int>(8 * kk) + 4 * j;
      const __m256i high = _mm256_and_si256(
          _mm256_srlv_epi32(_mm256_broadcastsi128_si256(four),
                            _mm256_setr_epi32(s, s, s, s, s + 2, s + 2, s + 2, s + 2)),
          _mm256_set1_epi32(3));
      ints = _mm256_or_si256(ints, _mm256_slli_epi32(high, 4));
    }
    if constexpr (offset(L) != 0) ints = _mm256_sub_epi32(ints, _mm256_set1_epi32(offset(L)));
    return ints;
  }
}
#endif

#if defined(__AVX512F__)
// the 16 quants of row k as int32 lanes, less the offset
template <Layout L>
inline __m512i quant_ints(const uint8_t* q, int64_t k) {
  if constexpr (L == kInt8) {
    return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + k * 16)));
  } else {
    return _mm512_inserti64x4(_mm512_castsi256_si512(quant_part<L>(q, k, 0)),
                              quant_part<L>(q, k, 1), 1);
  }
}
#endif

// the quant of column c of row k (the portable path)
template <Layout L>
inline int quant_of(const uint8_t* q, int64_t k, int64_t c) {
  if constexpr (L == kInt8) {
    return static_cast<int8_t>(q[k * 16 + c]);
  } else {
    const int64_t g = k / kGroupK, kk = k % kGroupK, cc = c % 8;
    const uint8_t byte = q[g * kGroupBytes + 4 * cc + kk];
    int v = c < 8 ? byte & 15 : byte >> 4;
    if constexpr (high_bits(L) == 1) {
      v |= static_cast<int>((high_word(q, k) >> c) & 1) << 4;
    } else if constexpr (high_bits(L) == 2) {
      const uint8_t two = q[kBlockK * 8 + g * kHighGroupBytes + 4 * (cc % 4) + kk];
      v |= ((two >> (4 * (c / 8) + 2 * (cc / 4))) & 3) << 4;
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
  const __m256 f = _mm256_cvtepi32_ps(quant_part<L>(q, k, j));
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
