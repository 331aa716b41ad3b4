// One row of x times GGUF panels by int8 dot products (MODELYARD_GGUF_DOT=q8, the default), as
// llama.cpp computes its quantized matrix-vector products: the row is quantized once per call to
// int8 per 32-k block (x ~ dx q8, dx = max |x| / 127, q8 rounded to nearest), each column's
// 4-bit or 6-bit quants are multiplied with it as bytes (AVX2 vpmaddubsw + vpmaddwd, or one
// vpdpbusd with AVX-VNNI / AVX-512 VNNI) into int32 sums per sub-block, and only those are
// scaled in float32: per 32 k, d dx sum(q q8) + m dx sum(q8) (Q4_1, Q4_K), d dx (sum(q q8) -
// 8 sum(q8)) (Q4_0), and per 16 k with Q6_K's two scales, offset 32. A weight byte times an
// activation byte takes a fifth of the instructions of widening both to float32; the cost is
// the activations' rounding (relative error ~ 1 / 254 per element, a dot product's far less:
// tests/unit/runner/test_gguf_dot.py, and the perplexity in the quality test).
//
// The panels are gguf_blocks.h's: a group of 4 k rows holds each column's 4 quants in adjacent
// bytes (columns 0-7 as low nibbles, 8-15 as high ones), so one 32-byte load is 4 k of 16
// columns and the row's 4 bytes at those k are one broadcast dword.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "gguf_blocks.h"
#include "panels.h"

namespace modelyard::gguf {

// the layouts the dot products read (Q4_0, Q4_1, Q4_K, Q6_K); the others widen to float32
template <Layout L>
constexpr bool has_dot() {
#if defined(__AVX2__)
  return L == kMin4 || L == kMin4K || L == kOff4 || L == kOff6;
#else
  return false;
#endif
}

// rows of x as int8 per 32-k block: x ~ dx q8
struct Q8Rows {
  std::vector<int8_t> q;      // (M, K)
  std::vector<float> dx;      // (M, K / 32)
  std::vector<int32_t> sums;  // (M, K / 32, 2): sum(q8) over k 0-15, then over 16-31
};

// one of them
struct Q8Row {
  const int8_t* q;
  const float* dx;
  const int32_t* sums;
};

inline Q8Row row_of(const Q8Rows& rows, int64_t i, int64_t k) {
  const int64_t blocks = k / kBlockK;
  return {rows.q.data() + i * k, rows.dx.data() + i * blocks, rows.sums.data() + i * 2 * blocks};
}

// the m rows of x (k apart) into `out`, each 32-k block on its own scale
inline void quantize_rows(const float* x, int64_t m, int64_t k, Q8Rows& out) {
  const int64_t blocks = m * (k / kBlockK);
  out.q.resize(static_cast<size_t>(m * k));
  out.dx.resize(static_cast<size_t>(blocks));
  out.sums.resize(static_cast<size_t>(2 * blocks));
  for (int64_t b = 0; b < blocks; ++b) {
    const float* xb = x + b * kBlockK;
    float amax = 0.f;
    for (int64_t i = 0; i < kBlockK; ++i) amax = std::max(amax, std::fabs(xb[i]));
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    int32_t sum[2] = {0, 0};
    for (int64_t i = 0; i < kBlockK; ++i) {
      const int v = static_cast<int>(std::nearbyint(xb[i] * inv));
      out.q[b * kBlockK + i] = static_cast<int8_t>(std::clamp(v, -127, 127));
      sum[i / 16] += out.q[b * kBlockK + i];
    }
    out.dx[b] = amax / 127.f;
    out.sums[2 * b] = sum[0];
    out.sums[2 * b + 1] = sum[1];
  }
}

#if defined(__AVX2__)
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
constexpr bool kVnni = true;
#else
constexpr bool kVnni = false;
#endif

// groups of 4 k whose byte products one sum lane holds before it is widened: vpdpbusd sums in
// int32; AVX2's vpmaddubsw in int16, where pairs of |q| <= 15 (Q6_K: 63) times |q8| <= 127 stay
// below 2^15 over 8 groups of 4-bit quants (2 of 6-bit ones)
template <Layout L>
constexpr int64_t span() {
  return kVnni || L != kOff6 ? 8 : 2;
}

// sums + per lane the products of the weight bytes w (unsigned) and the row's bytes x (signed)
inline __m256i products(__m256i sums, __m256i w, __m256i x) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(sums, w, x);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(sums, w, x);
#else
  return _mm256_add_epi16(sums, _mm256_maddubs_epi16(w, x));
#endif
}

// products' sums as int32 per 4 bytes
inline __m256i widened(__m256i sums) {
  if constexpr (kVnni) return sums;
  return _mm256_madd_epi16(sums, _mm256_set1_epi16(1));
}

// group g's quants of one panel block (q: its quants) as two vectors of unsigned bytes:
// columns 0-7 and 8-15, each column's 4 k adjacent
template <Layout L>
inline void group_bytes(const uint8_t* q, int64_t g, __m256i& first, __m256i& second) {
  const __m256i raw =
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + g * kGroupBytes));
  const __m256i low4 = _mm256_set1_epi8(15);
  first = _mm256_and_si256(raw, low4);
  second = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
  if constexpr (L == kOff6) {  // bits 4-5 of each byte from bits 0-1 (4-5) in lane 0, 2-3
    // (6-7) in lane 1: a dword shift keeps a byte's own bits there
    const __m256i two = _mm256_broadcastsi128_si256(_mm_loadu_si128(
        reinterpret_cast<const __m128i*>(q + kBlockK * 8 + g * kHighGroupBytes)));
    const __m256i bits45 = _mm256_set1_epi8(0x30);
    const __m256i h0 =
        _mm256_and_si256(_mm256_sllv_epi32(two, _mm256_setr_epi32(4, 4, 4, 4, 2, 2, 2, 2)), bits45);
    const __m256i h1 =
        _mm256_and_si256(_mm256_srlv_epi32(two, _mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2)), bits45);
    first = _mm256_or_si256(first, h0);
    second = _mm256_or_si256(second, h1);
  }
}

// acc's int32 sums of one row's (half) block scaled into out (16 floats): the block's float32
// scales `scale` (Off6: of half h), dx and the row's sums of q8
template <Layout L>
inline void fold_row(const __m256i (&acc)[2], const float* scale, int h, float dx,
                     const int32_t* xsum, float* out) {
  for (int j = 0; j < 2; ++j) {
    const __m256 o = _mm256_loadu_ps(out + 8 * j);
    const __m256 d = _mm256_mul_ps(_mm256_loadu_ps(scale + h * kNR + 8 * j), _mm256_set1_ps(dx));
    __m256 r;
    if constexpr (has_min(L)) {
      const __m256 m = _mm256_loadu_ps(scale + kNR + 8 * j);
      const float s = dx * static_cast<float>(xsum[0] + xsum[1]);
      r = _mm256_fmadd_ps(m, _mm256_set1_ps(s),
                          _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc[j]), d, o));
    } else {
      const int32_t off = L == kOff4 ? 8 * (xsum[0] + xsum[1]) : 32 * xsum[h];
      const __m256i v = _mm256_sub_epi32(acc[j], _mm256_set1_epi32(off));
      r = _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), d, o);
    }
    _mm256_storeu_ps(out + 8 * j, r);
  }
}

// MR rows (from row i0 of x) times P panels (`panel_bytes` apart) -> sums[r * P + p], their 16
// columns' float32 sums; each group of quants is widened to bytes once for the MR rows; the next
// unit's lines are prefetched meanwhile
template <Layout L, int MR, int P>
inline void dot_tile(const Q8Rows& x, int64_t i0, int64_t k, const uint8_t* panels,
                     int64_t panel_bytes, int64_t blocks, f16v* sums, const char* pf,
                     int64_t pf_every, const uint8_t* placed = nullptr) {
  constexpr int64_t kHalves = L == kOff6 ? 2 : 1, kGroups = kBlockK / kGroupK / kHalves;
  constexpr int64_t kSpan = std::min(span<L>(), kGroups);
  alignas(64) float out[MR * P][kNR] = {};
  Q8Row rows[MR];
  for (int r = 0; r < MR; ++r) rows[r] = row_of(x, i0 + r, k);
  Trickle trickle{pf, pf_every};
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = block_at<L>(panels, b);  // of panel 0; panel p's panel_bytes on
    alignas(32) float scales[P][2][kNR];
    for (int p = 0; p < P; ++p) block_scales<L>(panels + p * panel_bytes, b, scales[p]);
    for (int h = 0; h < kHalves; ++h) {
      __m256i acc[MR * P][2];
      for (int64_t s = 0; s < kGroups; s += kSpan) {
        __m256i part[MR * P][2];
        for (int t = 0; t < MR * P; ++t) part[t][0] = part[t][1] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int64_t g = h * kGroups + s; g < h * kGroups + s + kSpan; ++g) {
          trickle.step();
          __m256i xv[MR];
          for (int r = 0; r < MR; ++r) {
            int32_t four;
            std::memcpy(&four, rows[r].q + b * kBlockK + g * kGroupK, sizeof(four));
            xv[r] = _mm256_set1_epi32(four);
          }
          for (int p = 0; p < P; ++p) {
            __m256i first, second;
            if (placed != nullptr) {  // one panel's bytes (byte_panel)
              const uint8_t* at = placed + (b * kGroups * kHalves + g) * 2 * kGroupBytes;
              first = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at));
              second = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + kGroupBytes));
            } else {
              group_bytes<L>(block + p * panel_bytes + scale_bytes(L), g, first, second);
            }
            for (int r = 0; r < MR; ++r) {
              part[r * P + p][0] = products(part[r * P + p][0], first, xv[r]);
              part[r * P + p][1] = products(part[r * P + p][1], second, xv[r]);
            }
          }
        }
        for (int t = 0; t < MR * P; ++t) {
          for (int j = 0; j < 2; ++j) {
            acc[t][j] = s == 0 ? widened(part[t][j])
                               : _mm256_add_epi32(acc[t][j], widened(part[t][j]));
          }
        }
      }
      for (int t = 0; t < MR * P; ++t) {
        const Q8Row& row = rows[t / P];
        fold_row<L>(acc[t], &scales[t % P][0][0], h, row.dx[b], row.sums + 2 * b, out[t]);
      }
    }
  }
  for (int t = 0; t < MR * P; ++t) std::memcpy(&sums[t], out[t], sizeof(out[t]));
}

// `rows` (<= MR) rows times one panel (its bytes from `placed` where given: byte_panel)
template <Layout L, int MR>
void dot_rows(int rows, const Q8Rows& x, int64_t i0, int64_t k, const uint8_t* panel,
              int64_t blocks, f16v* sums, const char* pf, int64_t pf_every,
              const uint8_t* placed) {
  if (rows == MR) {
    return dot_tile<L, MR, 1>(x, i0, k, panel, 0, blocks, sums, pf, pf_every, placed);
  }
  if constexpr (MR > 1) {
    dot_rows<L, MR - 1>(rows, x, i0, k, panel, blocks, sums, pf, pf_every, placed);
  }
}

// one panel's quants as group_bytes gives them (per block and group 2 x 32 bytes) into out: where
// placing the bytes costs more than multiplying them (Q6_K), once for a block of rows
template <Layout L>
void byte_panel(const uint8_t* panel, int64_t blocks, uint8_t* out) {
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* q = block_at<L>(panel, b) + scale_bytes(L);
    for (int64_t g = 0; g < kBlockK / kGroupK; ++g) {
      __m256i first, second;
      group_bytes<L>(q, g, first, second);
      uint8_t* at = out + (b * (kBlockK / kGroupK) + g) * 2 * kGroupBytes;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(at), first);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(at + kGroupBytes), second);
    }
  }
}

// row i0 times `count` (<= P) panels
template <Layout L, int P>
void dot_panels(int count, const Q8Rows& x, int64_t i0, int64_t k, const uint8_t* panels,
                int64_t panel_bytes, int64_t blocks, f16v* sums, const char* pf,
                int64_t pf_every) {
  if (count == P) {
    return dot_tile<L, 1, P>(x, i0, k, panels, panel_bytes, blocks, sums, pf, pf_every);
  }
  if constexpr (P > 1) {
    dot_panels<L, P - 1>(count, x, i0, k, panels, panel_bytes, blocks, sums, pf, pf_every);
  }
}
#endif

}  // namespace modelyard::gguf
