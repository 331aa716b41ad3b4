// y = x W^T for bfloat16 at decode sizes (a few dozen rows), on AVX-512 BF16 hosts.
//
// oneDNN's bf16 linear at 1-32 rows leaves ~30 % of the large-matmul rate unused in a decode step
// (each call streams its weight from memory with nothing prefetched). This kernel packs W once
// into panels of 16 output columns holding k in pairs (`vdpbf16ps`'s operand: 16 columns x 2 k
// = 64 bytes per pair of k) and prefetches the next panels while it computes. Its summation order
// is oneDNN's at these sizes (found by emulating candidate orders in float32 against oneDNN's
// outputs): K in blocks of 512 where K <= 1024 or x is one row, of 1024 otherwise (the last
// block takes the rest), each summed from zero into a float32 accumulator in order, each pair of
// k adding its odd product and then its even one (what one `vdpbf16ps` does); the block sums
// added in order; the total rounded to bf16 by `vcvtneps2bf16`. So it returns F.linear's bits
// (tested at every row count 1-64 for K up to 3072, and on many single rows).
// Larger row counts stay on oneDNN (runner.linear).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "claim.h"
#include "ops.h"
#include "vec.h"

using namespace modelyard::ops;  // (the ops this file defines at its end, ops.h)

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include <immintrin.h>
#define MODELYARD_BF16_GEMM 1
#endif

namespace {

constexpr int64_t kCols = 16;  // output columns per panel
constexpr int64_t kRows = 8;   // rows of x per micro-kernel call (2 panels: 16 accumulators)

#if defined(MODELYARD_BF16_GEMM)
// pairs of k per block summed from zero in oneDNN's order for x (m, k): 512 k, or 1024 where
// K > 1024 and there is more than one row
int64_t block_pairs(int64_t m, int64_t k) { return k <= 1024 || m == 1 ? 256 : 512; }

// rows x (MR, K) times panels a (and b when TWO) into y (MR rows, 16 or 32 columns, ldy; with
// SWIGLU, a and b are a gate and an up panel and y gets 16 columns of silu(gate) * up); x rows
// as 32-bit pairs (ldx pairs apart); pf: lines of the next panels to prefetch, `burst` of them
// every `every` pairs (2 every pair where one call of up to 8 rows makes the whole unit: one
// line a pair left half of the next unit to the hardware prefetchers, 10-37 % slower at 8 rows),
// into L2: a unit is 36-96 KiB, more than an L1, and prefetches into L1 evicted the lines in use
// (Zen 4, 32 KiB L1: 0.54-0.75x the time at 8 rows, 0.84-1.0x at 1, the same at 32; see
// docs/benchmarks.md, "Figures behind choices")
template <int MR, bool TWO, bool SWIGLU = false>
void micro(const uint32_t* x, int64_t ldx, const __m512bh* a, const __m512bh* b, int64_t pairs,
           at::BFloat16* y, int64_t ldy, int64_t ncols, const char* pf, int64_t every,
           int64_t burst, int64_t block) {
  __m512 acc[MR][2], total[MR][2];
  int64_t countdown = 1;
  for (int64_t j0 = 0; j0 < pairs; j0 += block) {
    for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int64_t j = j0; j < std::min(pairs, j0 + block); ++j) {
      if (pf != nullptr && --countdown == 0) {
        for (int64_t l = 0; l < burst; ++l) _mm_prefetch(pf + 64 * l, _MM_HINT_T1);
        pf += 64 * burst;
        countdown = every;
      }
      const __m512bh wa = a[j];
      const __m512bh wb = TWO ? b[j] : wa;
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const __m512bh xi = (__m512bh)_mm512_set1_epi32(static_cast<int>(x[i * ldx + j]));
        acc[i][0] = _mm512_dpbf16_ps(acc[i][0], xi, wa);
        if (TWO) acc[i][1] = _mm512_dpbf16_ps(acc[i][1], xi, wb);
      }
    }
    for (int i = 0; i < MR; ++i) {
      for (int h = 0; h < 2; ++h) {
        total[i][h] = j0 == 0 ? acc[i][h] : _mm512_add_ps(total[i][h], acc[i][h]);
      }
    }
  }
  if constexpr (SWIGLU) {
    for (int i = 0; i < MR; ++i) {
      modelyard::swiglu_out(total[i][0], total[i][1], y + i * ldy, ncols);
    }
    return;
  }
  for (int i = 0; i < MR; ++i) {
    for (int h = 0; h < (TWO ? 2 : 1); ++h) {
      const int64_t cols = std::min<int64_t>(kCols, ncols - h * kCols);
      if (cols <= 0) break;
      const __m256bh out = _mm512_cvtneps_pbh(total[i][h]);
      if (cols == kCols) {
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i * ldy + h * kCols), (__m256i)out);
      } else {
        alignas(32) at::BFloat16 row[kCols];
        _mm256_store_si256(reinterpret_cast<__m256i*>(row), (__m256i)out);
        std::memcpy(y + i * ldy + h * kCols, row, cols * sizeof(at::BFloat16));
      }
    }
  }
}

template <int MR, bool TWO, bool SWIGLU>
void micro_rows(int rows, const uint32_t* x, int64_t ldx, const __m512bh* a, const __m512bh* b,
                int64_t pairs, at::BFloat16* y, int64_t ldy, int64_t ncols, const char* pf,
                int64_t every, int64_t burst, int64_t block) {
  if (rows == MR) {
    return micro<MR, TWO, SWIGLU>(x, ldx, a, b, pairs, y, ldy, ncols, pf, every, burst, block);
  }
  if constexpr (MR > 1) {
    micro_rows<MR - 1, TWO, SWIGLU>(rows, x, ldx, a, b, pairs, y, ldy, ncols, pf, every, burst,
                                    block);
  }
}

// y (M, out_cols) from x (M, K) and panels: units of two panels, claimed by the threads in turn;
// each makes 32 columns of x W^T, or with SWIGLU 16 columns of silu(gate) * up
template <bool SWIGLU>
void gemm(const at::Tensor& x, const at::Tensor& packed, at::Tensor& y) {
  const int64_t m = x.size(0), k = x.size(1), panels = packed.size(0), pairs = packed.size(1);
  const int64_t n = y.size(1);
  const auto* xp = reinterpret_cast<const uint32_t*>(x.data_ptr<at::BFloat16>());
  const auto* wp = reinterpret_cast<const __m512bh*>(packed.data_ptr<at::BFloat16>());
  at::BFloat16* yp = y.data_ptr<at::BFloat16>();
  const int64_t units = (panels + 1) / 2;  // pairs of panels
  const int64_t calls = (m + kRows - 1) / kRows;
  const int64_t block = block_pairs(m, k);
  const int64_t unit_cols = SWIGLU ? kCols : 2 * kCols;
  modelyard::for_each_claimed(units, [&](int64_t unit, int64_t following, bool) {
    const int64_t p = 2 * unit;
    const bool two = p + 1 < panels;
    const __m512bh* a = wp + p * pairs;
    const __m512bh* b = two ? a + pairs : nullptr;
    // the next claimed unit's panels (two * pairs lines), spread over this unit's row calls
    const char* next = following < units
                           ? reinterpret_cast<const char*>(wp + 2 * following * pairs)
                           : nullptr;
    const int64_t lines = 2 * pairs, per_call = (lines + calls - 1) / calls;
    const int64_t every = std::max<int64_t>(1, pairs / std::max<int64_t>(1, per_call));
    const int64_t burst = (per_call + pairs - 1) / pairs;  // lines per prefetch (2: one call)
    const int64_t ncols = std::min<int64_t>(unit_cols, n - unit * unit_cols);
    for (int64_t c = 0, i = 0; i < m; ++c, i += kRows) {
      const int rows = static_cast<int>(std::min<int64_t>(kRows, m - i));
      const char* pf = next != nullptr ? next + c * per_call * 64 : nullptr;
      if (pf != nullptr && c * per_call >= lines) pf = nullptr;
      const uint32_t* xi = xp + i * pairs;
      at::BFloat16* yi = yp + i * n + unit * unit_cols;
      if (two) {
        micro_rows<kRows, true, SWIGLU>(rows, xi, pairs, a, b, pairs, yi, n, ncols, pf, every,
                                        burst, block);
      } else if constexpr (!SWIGLU) {  // pack_swiglu_bf16 makes whole units
        micro_rows<kRows, false, false>(rows, xi, pairs, a, b, pairs, yi, n, ncols, pf, every,
                                        burst, block);
      }
    }
  });
}
#endif

// panels from pack_bf16 (4-D) or, with SWIGLU, from pack_swiglu_bf16 (5-D) for x (M, K)
template <bool SWIGLU>
void check_packed(const at::Tensor& x, const at::Tensor& packed, const char* name) {
  TORCH_CHECK(bf16_gemm_supported(), name, ": built without AVX-512 BF16");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.is_contiguous(), name,
              ": contiguous bfloat16 (M, K) input");
  TORCH_CHECK(packed.scalar_type() == at::kBFloat16 && packed.dim() == (SWIGLU ? 5 : 4) &&
                  (!SWIGLU || packed.size(1) == 2) && packed.is_contiguous() &&
                  packed.size(-2) == kCols && packed.size(-1) == 2 &&
                  x.size(1) == 2 * packed.size(-3),
              name, SWIGLU ? ": weight not from pack_swiglu_bf16 for this input"
                           : ": weight not from pack_bf16 for this input");
}

// y (M, cols) from x (M, K) bf16 contiguous and its panels, once `cols` is checked against them
// (16 columns a panel; with SWIGLU a gate and an up panel make 16)
template <bool SWIGLU>
at::Tensor packed_gemm(const at::Tensor& x, const at::Tensor& packed, int64_t cols,
                       const char* name) {
  check_packed<SWIGLU>(x, packed, name);
  const int64_t col_panels = packed.size(0);  // with SWIGLU, pairs of a gate and an up panel
  TORCH_CHECK(cols > (col_panels - 1) * kCols && cols <= col_panels * kCols, name,
              ": shapes do not match");
  auto y = at::empty({x.size(0), cols}, x.options());
#if defined(MODELYARD_BF16_GEMM)
  if (x.size(0) > 0) gemm<SWIGLU>(x, SWIGLU ? packed.flatten(0, 1) : packed, y);
#endif
  return y;
}

}  // namespace

namespace modelyard::ops {

bool bf16_gemm_supported() {
#if defined(MODELYARD_BF16_GEMM)
  return true;
#else
  return false;
#endif
}

// w (N, K) bf16, K even -> (ceil(N / 16), K / 2, 16, 2): panel p, pair j, column c holds
// w[16p + c][2j], w[16p + c][2j + 1] (zero columns pad the last panel)
at::Tensor pack_bf16(const at::Tensor& w) {
  TORCH_CHECK(w.scalar_type() == at::kBFloat16 && w.dim() == 2 && w.size(1) % 2 == 0,
              "pack_bf16: bfloat16 (N, K) with K even only");
  const int64_t n = w.size(0), k = w.size(1), panels = (n + kCols - 1) / kCols;
  auto padded = at::zeros({panels * kCols, k}, w.options());
  padded.narrow(0, 0, n).copy_(w);
  return padded.view({panels, kCols, k / 2, 2}).permute({0, 2, 1, 3}).contiguous();
}

// SwiGLU's gate and up (I, K) -> pack_bf16 panels alternating 16 gate rows and the same 16 up
// rows (zero-padded), so one unit of two panels makes 16 columns of silu(gate) * up; as
// (ceil(I / 16), 2, K / 2, 16, 2)
at::Tensor pack_swiglu_bf16(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(gate.sizes() == up.sizes() && gate.dim() == 2 &&
                  up.scalar_type() == gate.scalar_type(),
              "pack_swiglu_bf16: gate and up of one shape (I, K) and dtype");
  const int64_t width = gate.size(0), k = gate.size(1), units = (width + kCols - 1) / kCols;
  const auto padded = [&](const at::Tensor& w) {  // (units, 1, 16, K)
    auto out = at::zeros({units * kCols, k}, w.options());
    out.narrow(0, 0, width).copy_(w);
    return out.view({units, 1, kCols, k});
  };
  const auto both = at::cat({padded(gate), padded(up)}, 1).view({units * 2 * kCols, k});
  const auto panels = pack_bf16(both);
  return panels.view({units, 2, k / 2, kCols, 2});  // 5-D: told apart from pack_bf16's panels
}

// x (M, K) packed from pack_bf16, n = N -> (M, N) bf16
at::Tensor packed_linear_bf16(const at::Tensor& x, const at::Tensor& packed, int64_t n) {
  return packed_gemm<false>(x, packed, n, "packed_linear_bf16");
}

// x (M, K) packed from pack_swiglu_bf16, width = I -> (M, I) bf16 silu(x Wg^T) * (x Wu^T) with
// the bits of those torch ops (each linear's, silu's and the product's rounding), the (M, 2I)
// projections never written out
at::Tensor packed_swiglu_bf16(const at::Tensor& x, const at::Tensor& packed, int64_t width) {
  return packed_gemm<true>(x, packed, width, "packed_swiglu_bf16");
}

}  // namespace modelyard::ops
