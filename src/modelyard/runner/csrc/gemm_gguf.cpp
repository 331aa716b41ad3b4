// y = x W^T (+ b) with W kept in a GGUF file's own quantized blocks (MODELYARD_WEIGHTS=gguf):
// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (one d, and m, per 32 weights of a row) and the K-quants Q4_K,
// Q5_K (super-blocks of 256 with 6-bit sub-scales: per 32 weights w = (d sc) q - (dmin m)) and
// Q6_K (per 16 weights w = (d sc) (q - 32)).
//
// One request decoding streams every weight once per step. The blocks are repacked once at load
// into panels of 16 output columns (gguf_blocks.h: 4.75 bits a weight for Q4_K, 5 for Q4_0, 6.6
// for Q6_K, 9 for Q8_0, against float32's 32). Two products:
// - int8 activations (gguf_dot.h; Q4_0, Q4_1, Q4_K, Q6_K with MODELYARD_GGUF_DOT=q8): each row
//   rounded to int8 per 32 k, bytes times bytes into int32, scaled per block in float32;
// - float32 (the other kinds, or MODELYARD_GGUF_DOT=float): each k row widened in registers to
//   16 floats by the float32 operations of gguf's numpy dequantization (the GGUF's weights bit
//   for bit), each output summed over k in order. Up to kMR rows share each widened row; more
//   rows widen each panel once into a buffer.
// Work is split by units of panels claimed by the threads in turn (claim.h); the next unit's
// bytes are prefetched while one is computed.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "claim.h"
#include "gguf_blocks.h"
#include "gguf_dot.h"
#include "ops.h"
#include "panels.h"

using namespace modelyard::ops;  // (the ops this file defines at its end, ops.h)

namespace {

using modelyard::f16v;
using modelyard::joined;
using modelyard::kNR;  // output columns per panel
using modelyard::kPartCols;
using modelyard::load_part;
using modelyard::kParts;
using modelyard::part;
using modelyard::splat_part;
using modelyard::Trickle;
using namespace modelyard::gguf;  // Kind, Layout, the blocks' layout, weights()
constexpr int64_t kMR = modelyard::kPartRows;  // rows of x per micro-kernel call
constexpr int64_t kPanelsPerUnit = 4;
// more rows than this widen each panel once into a buffer (AVX2: two passes of 4 rows in
// registers beat widening at 5-8 rows, x1.1-1.7)
constexpr int64_t kWideAbove = 8;
// rows per call over a widened panel: AVX2 has registers for 6 rows' sums when no quants and
// scales are held
constexpr int64_t kWideMR = kMR == 4 ? 6 : kMR;
// weight panels one row of x runs through at once
constexpr int64_t kRowPanels = 4;
// rows a panel's bytes are multiplied with at once (gguf_dot.h), and panels one row is (their
// sums take 8 of AVX2's 16 registers; Q6_K's need twice the registers)
template <Layout K>
constexpr int64_t kDotMR = K == kOff6 ? 2 : 4;
constexpr int64_t kDotRowBlock = 32;
template <Layout K>
constexpr int64_t kDotPanels = K == kOff6 ? 2 : 4;

// rows (<= kMR) of x (float32, ldx apart) times one panel (`blocks` 32-k blocks) -> sums
template <Layout K, int MR>
inline void micro(const float* x, int64_t ldx, const uint8_t* panel, int64_t blocks, f16v* sums,
                  const char* pf, int64_t pf_every) {
  part acc[MR][kParts] = {};
  Trickle trickle{pf, pf_every};
  for (int64_t b = 0; b < blocks; ++b) {
    const Scales<K> scales(panel, b);
    const uint8_t* q = block_at<K>(panel, b) + scale_bytes(K);
    const float* xb = x + b * kBlockK;
    for (int64_t k = 0; k < kBlockK; ++k) {
      trickle.step();
      part w[kParts];
      weights<K>(q, k, scales, w);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const part xk = splat_part(xb[i * ldx + k]);
        for (int j = 0; j < kParts; ++j) acc[i][j] += xk * w[j];
      }
    }
  }
  for (int i = 0; i < MR; ++i) sums[i] = joined(acc[i]);
}

template <Layout K, int MR>
void micro_rows(int rows, const float* x, int64_t ldx, const uint8_t* panel, int64_t blocks,
                f16v* sums, const char* pf, int64_t pf_every) {
  if (rows == MR) return micro<K, MR>(x, ldx, panel, blocks, sums, pf, pf_every);
  if constexpr (MR > 1) micro_rows<K, MR - 1>(rows, x, ldx, panel, blocks, sums, pf, pf_every);
}

// one row of x times P panels (`panel_bytes` apart) at once -> sums, each column summed in
// micro's order: P sums in flight, where one panel's sum alone waits on its FMA at every k
template <Layout K, int P>
inline void one_row(const float* x, const uint8_t* panels, int64_t panel_bytes, int64_t blocks,
                    f16v* sums, const char* pf, int64_t pf_every) {
  part acc[P][kParts] = {};
  Trickle trickle{pf, pf_every};
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = block_at<K>(panels, b);
    Scales<K> scales[P];
    for (int p = 0; p < P; ++p) scales[p] = Scales<K>(panels + p * panel_bytes, b);
    const float* xb = x + b * kBlockK;
    for (int64_t k = 0; k < kBlockK; ++k) {
      trickle.step();
      const part xk = splat_part(xb[k]);
      for (int p = 0; p < P; ++p) {
        part w[kParts];
        weights<K>(block + p * panel_bytes + scale_bytes(K), k, scales[p], w);
        for (int j = 0; j < kParts; ++j) acc[p][j] += xk * w[j];
      }
    }
  }
  for (int p = 0; p < P; ++p) sums[p] = joined(acc[p]);
}

template <Layout K, int P>
void one_row_panels(int count, const float* x, const uint8_t* panels, int64_t panel_bytes,
                    int64_t blocks, f16v* sums, const char* pf, int64_t pf_every) {
  if (count == P) return one_row<K, P>(x, panels, panel_bytes, blocks, sums, pf, pf_every);
  if constexpr (P > 1) {
    one_row_panels<K, P - 1>(count, x, panels, panel_bytes, blocks, sums, pf, pf_every);
  }
}

// rows (<= kMR) of x times a widened panel w -> sums (the float32 sums in micro's order)
template <int MR>
inline void micro_wide(const float* x, int64_t ldx, const float* w, int64_t k_len, f16v* sums) {
  part acc[MR][kParts] = {};
  for (int64_t k = 0; k < k_len; ++k) {
    part wk[kParts];
    for (int j = 0; j < kParts; ++j) wk[j] = load_part(w + k * kNR, j);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const part xk = splat_part(x[i * ldx + k]);
      for (int j = 0; j < kParts; ++j) acc[i][j] += xk * wk[j];
    }
  }
  for (int i = 0; i < MR; ++i) sums[i] = joined(acc[i]);
}

template <int MR>
void wide_rows(int rows, const float* x, int64_t ldx, const float* w, int64_t k_len, f16v* sums) {
  if (rows == MR) return micro_wide<MR>(x, ldx, w, k_len, sums);
  if constexpr (MR > 1) wide_rows<MR - 1>(rows, x, ldx, w, k_len, sums);
}

typedef int32_t i32x16 __attribute__((vector_size(64), aligned(4)));

// one output row: the sums, or with a gate panel's sums g, silu(g) * up
template <typename T>
void store_row(T* out, const f16v& sum, const f16v* gate, const float* bias, int64_t cols) {
  f16v value = sum;
  if (gate != nullptr) {
    const f16v g = *gate;
    value = g / (f16v{} + 1.f + modelyard::exp_lanes<f16v, i32x16>(-g)) * sum;
    value = g < f16v{} - 88.f ? g * 0.f * sum : value;  // exp(-g) overflows: silu(g) is -0
  }
  alignas(64) float row[kNR];
  std::memcpy(row, &value, sizeof(row));
  for (int64_t c = 0; c < cols; ++c) {
    out[c] = static_cast<T>(bias != nullptr ? row[c] + bias[c] : row[c]);  // bf16: to nearest
  }
}

// y's 16 columns at col for the m rows of x, MR rows a call: rows_of(h, i, rows, sums) sums rows
// i.. of x times the output's panel h (SWIGLU: gate 0, up 1)
template <bool SWIGLU, int64_t MR, typename T, typename RowsOf>
void output_rows(int64_t m, T* y, int64_t n, int64_t col, const float* bias,
                 const RowsOf& rows_of) {
  constexpr int per = SWIGLU ? 2 : 1;
  for (int64_t i = 0, left = (m + MR - 1) / MR, step = 0; i < m; i += step, --left) {
    step = (m - i + left - 1) / left;  // the fewest calls, as even as can be
    const int rows = static_cast<int>(step);
    f16v sums[per][MR];
    for (int h = 0; h < per; ++h) rows_of(h, i, rows, sums[h]);
    for (int r = 0; r < rows; ++r) {
      store_row(y + (i + r) * n + col, sums[per - 1][r], SWIGLU ? &sums[0][r] : nullptr,
                bias ? bias + col : nullptr, std::min(kNR, n - col));
    }
  }
}

// y's columns from col for row i of x (as int8 rows xq: by dot products): a unit's `count` weight
// panels, kRowPanels (kDotPanels) at a time, each group prefetching its share of the next unit's
// bytes (at `next`)
template <Layout K, bool SWIGLU, typename T>
void one_row_unit(const float* x, const Q8Rows* xq, const uint8_t* panels, int64_t count,
                  int64_t panel_bytes, int64_t blocks, const char* next, T* y, int64_t n,
                  int64_t col, const float* bias) {
  constexpr int per = SWIGLU ? 2 : 1;
  const int64_t at_once = xq != nullptr ? kDotPanels<K> : kRowPanels;
  f16v sums[kPanelsPerUnit * per];
  for (int64_t g = 0; g < count; g += at_once) {
    const int64_t group = std::min(at_once, count - g);
    const int64_t lines = group * panel_bytes / 64;
    const int64_t every = std::max<int64_t>(1, blocks * kBlockK / lines);
    const char* pf = next != nullptr ? next + g * panel_bytes : nullptr;
    const uint8_t* first = panels + g * panel_bytes;
    if constexpr (has_dot<K>()) {
      if (xq != nullptr) {
        dot_panels<K, kDotPanels<K>>(static_cast<int>(group), *xq, 0, blocks * kBlockK, first,
                                     panel_bytes, blocks, sums + g, pf,
                                     std::max<int64_t>(1, every / kGroupK));
        continue;
      }
    }
    one_row_panels<K, kRowPanels>(static_cast<int>(group), x, first, panel_bytes, blocks,
                                  sums + g, pf, every);
  }
  for (int64_t q = 0; q < count / per; ++q) {
    const int64_t c = col + q * kNR;
    store_row(y + c, sums[q * per + per - 1], SWIGLU ? &sums[q * per] : nullptr,
              bias ? bias + c : nullptr, std::min(kNR, n - c));
  }
}

// y's columns of a unit's output panels q0..q1 for the m rows of xq by dot products, kDotMR rows
// a call; blocks of kDotRowBlock rows outermost, so that a block's bytes stay in cache across the
// unit's panels; `next` (the next unit's bytes, `share` lines an output panel, a line every
// `every` k) prefetched with the first block
template <Layout K, bool SWIGLU, typename T>
void dot_unit(const Q8Rows& xq, int64_t m, int64_t k, const uint8_t* wp, int64_t q0, int64_t q1,
              int64_t panel_bytes, const char* next, int64_t share, int64_t every,
              const float* bias, T* yp, int64_t n) {
  constexpr int per = SWIGLU ? 2 : 1;
  const int64_t blocks = k / kBlockK, pf_every = std::max<int64_t>(1, every / kGroupK);
  thread_local std::vector<uint8_t> placed;
  for (int64_t i0 = 0; i0 < m; i0 += kDotRowBlock) {
    const int64_t rows_here = std::min(kDotRowBlock, m - i0);
    const bool bytes = K == kOff6 && rows_here > kDotMR<K>;  // placing its bytes costs most
    if (bytes) placed.resize(static_cast<size_t>(per * blocks * kBlockK * kNR));
    for (int64_t q = q0; q < q1; ++q) {
      const uint8_t* panel = wp + q * per * panel_bytes;
      for (int h = 0; bytes && h < per; ++h) {
        byte_panel<K>(panel + h * panel_bytes, blocks, &placed[h * blocks * kBlockK * kNR]);
      }
      const char* pf = next != nullptr && i0 == 0 ? next + (q - q0) * share * 64 : nullptr;
      const auto rows_of = [&](int h, int64_t i, int rows, f16v* sums) {
        const char* lines = pf != nullptr && i == 0 ? pf + h * (share / per) * 64 : nullptr;
        const uint8_t* own = bytes ? &placed[h * blocks * kBlockK * kNR] : nullptr;
        dot_rows<K, kDotMR<K>>(rows, xq, i0 + i, k, panel + h * panel_bytes, blocks, sums,
                               lines, pf_every, own);
      };
      output_rows<SWIGLU, kDotMR<K>>(rows_here, yp + i0 * n, n, q * kNR, bias, rows_of);
    }
  }
}

// y (M, n) = x W^T (+ bias); with SWIGLU the panels come in (gate, up) pairs and y is
// silu(x Wg^T) * (x Wu^T). Up to kMR rows widen each panel's quants in registers as they
// stream in; more rows widen a panel once into a per-thread buffer and run from there.
template <Layout K, bool SWIGLU, typename T>
void gemm(const float* xp, const Q8Rows* xq, int64_t m, int64_t k, const uint8_t* wp,
          int64_t panels, const float* bias, T* yp, int64_t n) {
  constexpr int per = SWIGLU ? 2 : 1;  // weight panels per 16 output columns
  const int64_t blocks = k / kBlockK, panel_bytes = panel_bytes_of(K, blocks);
  const int64_t outs = panels / per, units = (outs + kPanelsPerUnit - 1) / kPanelsPerUnit;
  const int64_t unit_bytes = kPanelsPerUnit * per * panel_bytes;
  modelyard::for_each_claimed(units, [&](int64_t unit, int64_t following, bool) {
    thread_local std::vector<float> wide;
    const int64_t q0 = unit * kPanelsPerUnit, q1 = std::min(outs, q0 + kPanelsPerUnit);
    const char* next =
        following < units ? reinterpret_cast<const char*>(wp + following * unit_bytes) : nullptr;
    const int64_t share = per * panel_bytes / 64;  // lines of the next unit per output panel
    const int64_t every = std::max<int64_t>(1, per * k / std::max<int64_t>(1, share));
    if (m == 1) {
      return one_row_unit<K, SWIGLU>(xp, xq, wp + q0 * per * panel_bytes, (q1 - q0) * per,
                                     panel_bytes, blocks, next, yp, n, q0 * kNR, bias);
    }
    if constexpr (has_dot<K>()) {
      if (xq != nullptr) {
        return dot_unit<K, SWIGLU>(*xq, m, k, wp, q0, q1, panel_bytes, next, share, every, bias,
                                   yp, n);
      }
    }
    if (m > kWideAbove) wide.resize(static_cast<size_t>(per * k * kNR));
    for (int64_t q = q0; q < q1; ++q) {
      const int64_t col = q * kNR;
      const uint8_t* panel = wp + q * per * panel_bytes;
      if (m > kWideAbove) {
        for (int h = 0; h < per; ++h) {
          widen_panel<K>(panel + h * panel_bytes, blocks, &wide[h * k * kNR]);
        }
        output_rows<SWIGLU, kWideMR>(m, yp, n, col, bias, [&](int h, int64_t i, int rows,
                                                             f16v* sums) {
          wide_rows<kWideMR>(rows, xp + i * k, k, &wide[h * k * kNR], k, sums);
        });
        continue;
      }
      const char* pf = next != nullptr ? next + (q - q0) * share * 64 : nullptr;
      output_rows<SWIGLU, kMR>(m, yp, n, col, bias, [&](int h, int64_t i, int rows, f16v* sums) {
        const char* lines = pf != nullptr && i == 0 ? pf + h * (share / per) * 64 : nullptr;
        micro_rows<K, kMR>(rows, xp + i * k, k, panel + h * panel_bytes, blocks, sums, lines,
                           every);
      });
    }
  });
}

// the packed weight's layout, checked against its shape (panels, units, unit bytes); `per`
// weight panels make 16 output columns
Layout checked_layout(const at::Tensor& packed, int64_t kind, int64_t n, int64_t per,
                      const char* name) {
  TORCH_CHECK(kind >= 0 && kind < kKinds, name,
              ": kind 0 (Q4_1) to 7 (Q6_K): Q4_1, Q8_0, Q4_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K");
  const Layout l = layout_of(static_cast<Kind>(kind));
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 3 && packed.is_contiguous() &&
                  packed.size(2) == unit_bytes(l) && packed.size(0) % per == 0,
              name, ": weight not from pack_gguf for this kind");
  const int64_t outs = packed.size(0) / per;
  TORCH_CHECK(n > (outs - 1) * kNR && n <= outs * kNR, name, ": shapes do not match");
  return l;
}

template <bool SWIGLU>
at::Tensor linear(const at::Tensor& x, const at::Tensor& packed, int64_t kind, int64_t n,
                  const float* bias, int64_t dot, const char* name) {
  const Layout l = checked_layout(packed, kind, n, SWIGLU ? 2 : 1, name);
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() &&
                  (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) &&
                  x.size(1) == packed.size(1) * unit_blocks(l) * kBlockK,
              name, ": contiguous float32 or bfloat16 (M, K) input, K = 32 x the blocks");
  const at::Tensor xf = x.scalar_type() == at::kFloat ? x : x.to(at::kFloat);
  auto y = at::empty({x.size(0), n}, x.options());
  if (x.size(0) == 0) return y;
  const float* xp = xf.data_ptr<float>();
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  const int64_t m = x.size(0), kk = x.size(1), panels = packed.size(0);
  TORCH_CHECK(dot == 0 || dot == 1, name, ": dot 0 (float32) or 1 (int8 activations)");
  with_layout(l, [&](auto layout) {
    constexpr Layout L = decltype(layout)::value;
    thread_local Q8Rows rows;
    const Q8Rows* xq = nullptr;
    if (has_dot<L>() && dot == 1) {
      quantize_rows(xp, m, kk, rows);
      xq = &rows;
    }
    if (x.scalar_type() == at::kFloat) {
      gemm<L, SWIGLU>(xp, xq, m, kk, wp, panels, bias, y.data_ptr<float>(), n);
    } else {
      gemm<L, SWIGLU>(xp, xq, m, kk, wp, panels, bias, y.data_ptr<at::BFloat16>(), n);
    }
  });
  return y;
}

// every panel widened (widen_panel) and written out as rows of (N, K)
template <Layout K>
void dequantize_into(const uint8_t* wp, int64_t panels, int64_t blocks, int64_t n, float* out) {
  const int64_t k_len = blocks * kBlockK;
  at::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> wide(static_cast<size_t>(k_len * kNR));
    for (int64_t p = begin; p < end; ++p) {
      widen_panel<K>(wp + p * panel_bytes_of(K, blocks), blocks, wide.data());
      for (int64_t c = 0; c < std::min(kNR, n - p * kNR); ++c) {
        for (int64_t k = 0; k < k_len; ++k) out[(p * kNR + c) * k_len + k] = wide[k * kNR + c];
      }
    }
  });
}

}  // namespace

namespace modelyard::ops {

// x (M, K) float32 or bfloat16, K a multiple of 32; packed (ceil(N / 16), K / 32, block bytes)
// from pack_gguf; bias (N,) float32 or undefined -> (M, N) of x's dtype
at::Tensor packed_linear_gguf(const at::Tensor& x, const at::Tensor& packed, int64_t kind,
                              int64_t n, const c10::optional<at::Tensor>& bias, int64_t dot) {
  const float* bp = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == n,
                "packed_linear_gguf: float32 bias (N,)");
    bp = bias->data_ptr<float>();
  }
  return linear<false>(x, packed, kind, n, bp, dot, "packed_linear_gguf");
}

// the same with pack_gguf's panels of gate and up rows in turn (16 each) -> (M, width)
// silu(x Wg^T) * (x Wu^T)
at::Tensor packed_swiglu_gguf(const at::Tensor& x, const at::Tensor& packed, int64_t kind,
                              int64_t width, int64_t dot) {
  return linear<true>(x, packed, kind, width, nullptr, dot, "packed_swiglu_gguf");
}

// pack_gguf's panels back to the (N, K) float32 weight they hold (the GGUF's dequantization)
at::Tensor dequantize_gguf(const at::Tensor& packed, int64_t kind, int64_t n) {
  const Layout l = checked_layout(packed, kind, n, 1, "dequantize_gguf");
  const int64_t blocks = packed.size(1) * unit_blocks(l);
  auto out = at::empty({n, blocks * kBlockK}, packed.options().dtype(at::kFloat));
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  with_layout(l, [&](auto layout) {
    dequantize_into<decltype(layout)::value>(wp, packed.size(0), blocks, n, out.data_ptr<float>());
  });
  return out;
}

}  // namespace modelyard::ops
