// y = x (W_q * s)^T (+ b) with int8 weights and a float32 scale per output column (weight-only
// int8, an opt-in of the runner: MODELYARD_WEIGHTS=int8), and y = x W^T (+ b) with bf16 weights
// (the bf16 GEMM of hosts without AVX-512: widened exactly, summed in float32) for one row;
// calls of more rows of bf16 run gemm.cpp's float32 GEMM over chunks widened once
// (widened_linear). A bf16 row sums K in gemm.cpp's chunks (panels.h) either way, so its bits
// do not depend on the rows beside it.
//
// One request decoding (one row of x) is bound by streaming the weights from memory: int8 halves
// bf16's bytes and quarters float32's. The weight is packed as the float32 GEMM's panels (16
// output columns, k-major: 16 bytes per k), the int8 values widened to float32 in registers as
// they stream in (vpmovsxbd + vcvtdq2ps), multiplied with x in float32, and each column's sum
// scaled once at the end. x is float32 or bfloat16 (widened exactly), y has x's dtype (bf16:
// rounded to nearest even). Work is split by units of panels claimed by the threads in turn
// (claim.h); the next unit's panels are prefetched while one is computed. int8: up to kMR rows
// share each widened weight vector; more rows run as further row blocks over the same (cached)
// panel.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "claim.h"
#include "ops.h"
#include "panels.h"
#include "vec.h"

using namespace modelyard::ops;  // (the ops this file defines at its end, ops.h)

namespace {

using modelyard::f16v;
using modelyard::joined;
using modelyard::kNR;  // output columns per panel
using modelyard::kPartCols;
using modelyard::kParts;
using modelyard::part;
using modelyard::splat_part;
using modelyard::Trickle;
// rows of x per micro-kernel call: AVX2's 16 registers hold 6 rows' two accumulator parts, the
// panel's two weight parts and a broadcast
constexpr int64_t kMR = kParts == 1 ? 8 : 6;
constexpr int64_t kPanelsPerUnit = 4;

// m rows as the fewest calls of at most kMR rows, as even as can be (8 rows: 4 + 4, not 6 + 2)
inline int64_t blocks_of(int64_t m) { return (m + kMR - 1) / kMR; }

typedef int8_t i8x8 __attribute__((vector_size(8), aligned(1)));
typedef uint16_t u16x16 __attribute__((vector_size(32), aligned(2)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));

// columns [j * kPartCols, (j + 1) * kPartCols) of weights p as float32, exact
inline part widen(const int8_t* p, int j) {
#if defined(__AVX512F__)
  const __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
  return reinterpret_cast<const part&>(f);
#elif defined(__AVX2__)
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + j * kPartCols));
  const __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(bytes));
  return reinterpret_cast<const part&>(f);
#else
  return __builtin_convertvector(*reinterpret_cast<const i8x8*>(p + j * kPartCols), part);
#endif
}

inline part widen(const uint16_t* p, int j) {  // bf16 -> float32: the bits moved up, exact
#if defined(__AVX512F__)
  const u32x16 bits = __builtin_convertvector(*reinterpret_cast<const u16x16*>(p), u32x16) << 16;
  return reinterpret_cast<const f16v&>(bits);
#else
  return modelyard::load_bf16(p + j * kPartCols);
#endif
}

// the k steps one sum runs over before it is added to the row's total: gemm.cpp's chunks for
// bf16 (panels.h: a row's bits as in a call of more rows), all of K for int8
template <typename W>
int64_t sum_chunk(int64_t k_len) {
  return std::is_same_v<W, uint16_t> ? modelyard::k_chunk(k_len) : k_len;
}

// rows (<= kMR) of x (float32, ldx apart) times one panel (k_len x 16 weights) -> sums (rows x 16)
template <int MR, typename W>
inline void micro(const float* x, int64_t ldx, const W* panel, int64_t k_len, f16v* sums,
                  const char* pf, int64_t pf_every) {
  Trickle trickle{pf, pf_every};
  const int64_t chunk = sum_chunk<W>(k_len);
  for (int64_t k0 = 0; k0 < k_len; k0 += chunk) {
    part acc[MR][kParts] = {};
    for (int64_t k = k0; k < std::min(k_len, k0 + chunk); ++k) {
      trickle.step();
      part w[kParts];
      for (int j = 0; j < kParts; ++j) w[j] = widen(panel + k * kNR, j);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const part xk = splat_part(x[i * ldx + k]);
        for (int j = 0; j < kParts; ++j) acc[i][j] += xk * w[j];
      }
    }
    for (int i = 0; i < MR; ++i) sums[i] = k0 == 0 ? joined(acc[i]) : sums[i] + joined(acc[i]);
  }
}

template <int MR, typename W>
void micro_rows(int rows, const float* x, int64_t ldx, const W* panel, int64_t k_len,
                f16v* sums, const char* pf, int64_t pf_every) {
  if (rows == MR) return micro<MR>(x, ldx, panel, k_len, sums, pf, pf_every);
  if constexpr (MR > 1) micro_rows<MR - 1>(rows, x, ldx, panel, k_len, sums, pf, pf_every);
}

// one row times a unit's four panels at once (int8; bf16: one_row4_bf16): four weight streams,
// each prefetched 2 KiB ahead into L2 (as the float32 GEMM's one-row path: a single stream per
// thread reads memory slower)
template <typename W>
inline void one_row4(const float* x, const W* panel, int64_t pstride, int64_t k_len, f16v* sums) {
  constexpr int64_t kPerLine = 64 / (kNR * sizeof(W));  // k steps per 64-byte line
  constexpr int64_t kAheadK = 2048 / (kNR * sizeof(W));
  const int64_t chunk = sum_chunk<W>(k_len);
  for (int64_t k0 = 0; k0 < k_len; k0 += chunk) {
    part acc[kPanelsPerUnit][kParts] = {};
    for (int64_t k = k0; k < std::min(k_len, k0 + chunk); ++k) {
      if (k % kPerLine == 0) {
        for (int p = 0; p < kPanelsPerUnit; ++p) {
          __builtin_prefetch(panel + p * pstride + (k + kAheadK) * kNR, 0, 2);
        }
      }
      const part xk = splat_part(x[k]);
      for (int p = 0; p < kPanelsPerUnit; ++p) {
        for (int j = 0; j < kParts; ++j) acc[p][j] += xk * widen(panel + p * pstride + k * kNR, j);
      }
    }
    for (int p = 0; p < kPanelsPerUnit; ++p) {
      sums[p] = k0 == 0 ? joined(acc[p]) : sums[p] + joined(acc[p]);
    }
  }
}

// one row times a unit's four bf16 panels, streamed as one_row4's: a 32-byte load holds 16
// columns' bf16 at k as 8 pairs; one shift widens the even columns and one mask the odd ones
// (exact, in place): two integer steps per 16 weights, where `widen` takes four and more
// registers than AVX2 has (0.59-0.65x the time on a Zen 3, now at the host's memory rate).
// Each panel sums in an even and an odd vector, put back in column order once per chunk: every
// column's sum runs over k in the same order as one_row4's, bit for bit.
inline void one_row4_bf16(const float* x, const uint16_t* panel, int64_t pstride, int64_t k_len,
                          f16v* sums) {
  using modelyard::u32x8;
  using modelyard::v8;
  constexpr int64_t kPerLine = 64 / (kNR * 2), kAheadK = 2048 / (kNR * 2);
  const int64_t chunk = modelyard::k_chunk(k_len);
  for (int64_t k0 = 0; k0 < k_len; k0 += chunk) {
    v8 even[kPanelsPerUnit] = {}, odd[kPanelsPerUnit] = {};
    for (int64_t k = k0; k < std::min(k_len, k0 + chunk); ++k) {
      if (k % kPerLine == 0) {
        for (int p = 0; p < kPanelsPerUnit; ++p) {
          __builtin_prefetch(panel + p * pstride + (k + kAheadK) * kNR, 0, 2);
        }
      }
      const v8 xk = modelyard::splat(x[k]);
      for (int p = 0; p < kPanelsPerUnit; ++p) {
        const u32x8 w = *reinterpret_cast<const u32x8*>(panel + p * pstride + k * kNR);
        const u32x8 lo = w << 16, hi = w & 0xFFFF0000u;
        even[p] += xk * reinterpret_cast<const v8&>(lo);
        odd[p] += xk * reinterpret_cast<const v8&>(hi);
      }
    }
    for (int p = 0; p < kPanelsPerUnit; ++p) {
      const f16v acc = __builtin_shufflevector(even[p], odd[p], 0, 8, 1, 9, 2, 10, 3, 11, 4, 12,
                                               5, 13, 6, 14, 7, 15);
      sums[p] = k0 == 0 ? acc : sums[p] + acc;
    }
  }
}

template <typename T>
void store_row(T* out, const f16v& sum, const float* scale, const float* bias, int64_t cols) {
  alignas(64) float row[kNR];
  *reinterpret_cast<f16v*>(row) = sum;
  for (int64_t c = 0; c < cols; ++c) {
    float v = scale != nullptr ? row[c] * scale[c] : row[c];
    if (bias != nullptr) v += bias[c];
    out[c] = static_cast<T>(v);  // bf16: c10's round-to-nearest-even
  }
}

template <typename W, typename T>
void gemm(const float* xp, int64_t m, int64_t k, const at::Tensor& packed, const float* scale,
          const float* bias, T* yp, int64_t n) {
  const int64_t panels = packed.size(0);
  const W* wp = static_cast<const W*>(packed.data_ptr());
  const int64_t units = (panels + kPanelsPerUnit - 1) / kPanelsPerUnit;
  const int64_t panel_size = k * kNR, panel_bytes = panel_size * int64_t{sizeof(W)};
  modelyard::for_each_claimed(units, [&](int64_t unit, int64_t following, bool) {
    const int64_t p0 = unit * kPanelsPerUnit, p1 = std::min(panels, p0 + kPanelsPerUnit);
    const char* next = following < units ? reinterpret_cast<const char*>(
                                               wp + following * kPanelsPerUnit * panel_size)
                                         : nullptr;
    const int64_t next_lines = kPanelsPerUnit * panel_bytes / 64;
    if (m == 1 && p1 - p0 == kPanelsPerUnit) {
      f16v sums[kPanelsPerUnit];
      if constexpr (std::is_same_v<W, uint16_t>) {
        one_row4_bf16(xp, wp + p0 * panel_size, panel_size, k, sums);
      } else {
        one_row4(xp, wp + p0 * panel_size, panel_size, k, sums);
      }
      for (int64_t p = p0; p < p1; ++p) {
        const int64_t col = p * kNR;
        store_row(yp + col, sums[p - p0], scale ? scale + col : nullptr,
                  bias ? bias + col : nullptr, std::min(kNR, n - col));
      }
      return;
    }
    for (int64_t p = p0; p < p1; ++p) {
      const W* panel = wp + p * panel_size;
      const int64_t col = p * kNR, cols = std::min(kNR, n - col);
      // this panel's share of the next unit's lines, one every few k of the first row block
      const int64_t share = next_lines / kPanelsPerUnit;
      const char* pf = next != nullptr ? next + (p - p0) * share * 64 : nullptr;
      const int64_t every = std::max<int64_t>(1, k / std::max<int64_t>(1, share));
      for (int64_t i = 0, left = blocks_of(m), rows = 0; i < m; i += rows, --left) {
        rows = (m - i + left - 1) / left;
        f16v sums[kMR];
        micro_rows<kMR, W>(static_cast<int>(rows), xp + i * k, k, panel, k, sums,
                           i == 0 ? pf : nullptr, every);
        for (int64_t r = 0; r < rows; ++r) {
          store_row(yp + (i + r) * n + col, sums[r], scale ? scale + col : nullptr,
                    bias ? bias + col : nullptr, cols);
        }
      }
    }
  });
}

// x float32 or bfloat16, widened once; y of x's dtype
template <typename W>
at::Tensor run(const at::Tensor& x, const at::Tensor& packed, const float* scale,
               const float* bias, int64_t n) {
  const at::Tensor xf = x.scalar_type() == at::kFloat ? x : x.to(at::kFloat);
  auto y = at::empty({x.size(0), n}, x.options());
  if (x.size(0) == 0) return y;
  const float* xp = xf.data_ptr<float>();
  if (x.scalar_type() == at::kFloat) {
    gemm<W>(xp, x.size(0), x.size(1), packed, scale, bias, y.data_ptr<float>(), n);
  } else {
    gemm<W>(xp, x.size(0), x.size(1), packed, scale, bias, y.data_ptr<at::BFloat16>(), n);
  }
  return y;
}

}  // namespace

namespace modelyard::ops {

// x (M, K) float32 or bfloat16; packed (ceil(N / 16), K, 16) int8; scale (>= N,) float32;
// bias (N,) float32 or undefined -> (M, N) of x's dtype
at::Tensor packed_linear_int8(const at::Tensor& x, const at::Tensor& packed,
                              const at::Tensor& scale, int64_t n,
                              const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "packed_linear_int8: contiguous float32 or bfloat16 (M, K) input");
  TORCH_CHECK(packed.scalar_type() == at::kChar && packed.dim() == 3 && packed.is_contiguous() &&
                  packed.size(2) == kNR && packed.size(1) == x.size(1),
              "packed_linear_int8: weight not from pack_int8 for this input");
  TORCH_CHECK(n > (packed.size(0) - 1) * kNR && n <= packed.size(0) * kNR,
              "packed_linear_int8: shapes do not match");
  TORCH_CHECK(scale.scalar_type() == at::kFloat && scale.is_contiguous() && scale.numel() >= n,
              "packed_linear_int8: float32 scale per output column");
  const float* bp = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == n,
                "packed_linear_int8: float32 bias (N,)");
    bp = bias->data_ptr<float>();
  }
  return run<int8_t>(x, packed, scale.data_ptr<float>(), bp, n);
}

// x (M, K) bfloat16; packed (ceil(N / 16), K, 16) bfloat16; bias (N,) float32 or undefined ->
// (M, N) bfloat16
at::Tensor packed_linear_bf16w(const at::Tensor& x, const at::Tensor& packed, int64_t n,
                               const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.scalar_type() == at::kBFloat16,
              "packed_linear_bf16w: contiguous bfloat16 (M, K) input");
  TORCH_CHECK(packed.scalar_type() == at::kBFloat16 && packed.dim() == 3 &&
                  packed.is_contiguous() && packed.size(2) == kNR && packed.size(1) == x.size(1),
              "packed_linear_bf16w: weight not from pack_bf16w for this input");
  TORCH_CHECK(n > (packed.size(0) - 1) * kNR && n <= packed.size(0) * kNR,
              "packed_linear_bf16w: shapes do not match");
  const float* bp = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == n,
                "packed_linear_bf16w: float32 bias (N,)");
    bp = bias->data_ptr<float>();
  }
  if (x.size(0) == 1) return run<uint16_t>(x, packed, nullptr, bp, n);
  return widened_linear(x.to(at::kFloat), packed, n, bp);
}

}  // namespace modelyard::ops
