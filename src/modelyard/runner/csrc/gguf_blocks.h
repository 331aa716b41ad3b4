// The GGUF blocks of gemm_gguf.cpp as its panels hold them. A file's block type (Kind) is
// repacked at load (runner.gguf_blocks.pack_gguf) into one of seven layouts, per panel of 16
// columns a run of 32-k blocks: the block's scales, then its quants. The scales are the 16
// columns' float32 d (then, with a min, 16 float32 m); in the K layouts (Q4_K, Q6_K) a header of
// float32 super-block scales opens every 8 blocks (256 k: d and dmin, Q6_K's d) and a block
// holds its 6-bit sub-scales as bytes (Q4_K: sc, then mn; Q6_K: the int8 scales of k 0-15, then
// of k 16-31), as the file does: 4.75 and 6.6 bits a weight where float32 sub-scales took 6 and
// 8. The quants: Int8 16 signed bytes per k; the others nibbles in groups of 4 k (below), then
// high bits (5-bit quants: per k a 2-byte word, column c at bit c; Q6_K: grouped, below).
// A weight is d (q - offset), or d q + m, with a K layout's d = d_super sc and m = -(dmin mn)
// formed as gguf's numpy dequantization forms them (exact products), so the same float32 bits.
// One k row is widened to float32 parts (panels.h).
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "panels.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace modelyard::gguf {

constexpr int64_t kBlockK = 32;

// the file's block types (runner.gguf_blocks' kinds)
enum Kind : int64_t { kQ4_1, kQ8_0, kQ4_0, kQ5_0, kQ5_1, kQ4_K, kQ5_K, kQ6_K, kKinds };

// the panels' layouts: Min4 d q + m (Q4_1: float d and m), Int8 d q (Q8_0), Off4 d (q - 8)
// (Q4_0), Min5 (Q5_1, Q5_K), Off5 d (q - 16) (Q5_0), Off6 d (q - 32) with one d per 16 k
// (Q6_K, a K layout), Min4K d q + m (Q4_K, a K layout)
enum Layout : int { kMin4, kInt8, kOff4, kMin5, kOff5, kOff6, kMin4K };

constexpr Layout layout_of(Kind kind) {
  constexpr Layout layouts[kKinds] = {kMin4, kInt8, kOff4, kOff5, kMin5, kMin4K, kMin5, kOff6};
  return layouts[kind];
}

constexpr bool has_min(Layout l) { return l == kMin4 || l == kMin5 || l == kMin4K; }
constexpr int high_bits(Layout l) { return l == kMin5 || l == kOff5 ? 1 : l == kOff6 ? 2 : 0; }
constexpr int offset(Layout l) { return l == kOff4 ? 8 : l == kOff5 ? 16 : l == kOff6 ? 32 : 0; }
constexpr bool is_k(Layout l) { return l == kMin4K || l == kOff6; }

// bytes of one (panel, 32-k block): the scales (and mins), then the quants
constexpr int64_t scale_bytes(Layout l) {
  return is_k(l) ? 2 * kNR : (has_min(l) ? 2 : 1) * kNR * 4;
}
constexpr int64_t quant_bytes(Layout l) {
  return l == kInt8 ? kBlockK * kNR : kBlockK * (kNR / 2 + kNR / 8 * high_bits(l));
}
constexpr int64_t block_bytes(Layout l) { return scale_bytes(l) + quant_bytes(l); }

// a panel is a run of units: one block, or in a K layout the header and 8 blocks
constexpr int64_t kSuperBlocks = 8;
constexpr int64_t header_bytes(Layout l) {
  return l == kMin4K ? 2 * kNR * 4 : l == kOff6 ? kNR * 4 : 0;
}
constexpr int64_t unit_blocks(Layout l) { return is_k(l) ? kSuperBlocks : 1; }
constexpr int64_t unit_bytes(Layout l) { return header_bytes(l) + unit_blocks(l) * block_bytes(l); }
constexpr int64_t panel_bytes_of(Layout l, int64_t blocks) {
  return blocks / unit_blocks(l) * unit_bytes(l);
}

// block b of a panel
template <Layout L>
inline const uint8_t* block_at(const uint8_t* panel, int64_t b) {
  if constexpr (is_k(L)) {
    return panel + b / kSuperBlocks * unit_bytes(L) + header_bytes(L) +
           b % kSuperBlocks * block_bytes(L);
  } else {
    return panel + b * block_bytes(L);
  }
}

// block b's 16 columns' float32 scales d (s[0]) and mins m (Min*: s[1]) or second scales (Off6:
// of k 16..31); a K layout's formed as numpy forms them: d sc, -(dmin mn), exact products
template <Layout L>
inline void block_scales(const uint8_t* panel, int64_t b, float (&s)[2][kNR]) {
  const uint8_t* block = block_at<L>(panel, b);
  if constexpr (!is_k(L)) {
    std::memcpy(s, block, scale_bytes(L));
  } else {
    const float* head = reinterpret_cast<const float*>(panel + b / kSuperBlocks * unit_bytes(L));
#if defined(__AVX2__)
    for (int j = 0; j < 2; ++j) {  // columns 8 j .. 8 j + 7
      const __m128i one = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + 8 * j));
      const __m128i two = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + kNR + 8 * j));
      const __m256 d = _mm256_loadu_ps(head + 8 * j);
      if constexpr (L == kMin4K) {
        const __m256 m = _mm256_mul_ps(_mm256_loadu_ps(head + kNR + 8 * j),
                                       _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(two)));
        _mm256_storeu_ps(s[0] + 8 * j,
                         _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(one))));
        _mm256_storeu_ps(s[1] + 8 * j, _mm256_xor_ps(m, _mm256_set1_ps(-0.f)));
      } else {
        _mm256_storeu_ps(s[0] + 8 * j,
                         _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(one))));
        _mm256_storeu_ps(s[1] + 8 * j,
                         _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(two))));
      }
    }
#else
    for (int64_t c = 0; c < kNR; ++c) {
      if constexpr (L == kMin4K) {
        s[0][c] = head[c] * static_cast<float>(block[c]);
        s[1][c] = -(head[kNR + c] * static_cast<float>(block[kNR + c]));
      } else {
        s[0][c] = head[c] * static_cast<float>(static_cast<int8_t>(block[c]));
        s[1][c] = head[c] * static_cast<float>(static_cast<int8_t>(block[kNR + c]));
      }
    }
#endif
  }
}

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

// block b's scales (d) and mins (m; Off6: the scales of k 16..31) as parts
template <Layout L>
struct Scales {
  part d[kParts], m[kParts];
  Scales() = default;
  Scales(const uint8_t* panel, int64_t b) {
    alignas(64) float s[2][kNR] = {};
    block_scales<L>(panel, b, s);
    for (int j = 0; j < kParts; ++j) {
      d[j] = load_part(s[0], j);
      m[j] = load_part(s[1], j);
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

// f(std::integral_constant<Layout, L>{}) for the layout L of `kind`: each layout's code is
// compiled once, whatever file types share it
template <typename F>
void with_layout(Layout layout, const F& f) {
  switch (layout) {
    case kMin4: return f(std::integral_constant<Layout, kMin4>{});
    case kInt8: return f(std::integral_constant<Layout, kInt8>{});
    case kOff4: return f(std::integral_constant<Layout, kOff4>{});
    case kMin5: return f(std::integral_constant<Layout, kMin5>{});
    case kOff5: return f(std::integral_constant<Layout, kOff5>{});
    case kOff6: return f(std::integral_constant<Layout, kOff6>{});
    case kMin4K: return f(std::integral_constant<Layout, kMin4K>{});
  }
}

// one panel widened once into w (k_len x 16 floats, k-major), for many row blocks
template <Layout K>
void widen_panel(const uint8_t* panel, int64_t blocks, float* w) {
  for (int64_t b = 0; b < blocks; ++b) {
    const Scales<K> scales(panel, b);
    const uint8_t* q = block_at<K>(panel, b) + scale_bytes(K);
    for (int64_t k = 0; k < kBlockK; ++k) {
      part row[kParts];
      weights<K>(q, k, scales, row);
      float* out = w + (b * kBlockK + k) * kNR;
      for (int j = 0; j < kParts; ++j) *reinterpret_cast<part*>(out + j * kPartCols) = row[j];
    }
  }
}

}  // namespace modelyard::gguf
