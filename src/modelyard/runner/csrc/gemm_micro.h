// The float32 GEMM's micro-kernel (gemm.cpp): a block of MR rows of x (packed k-major) times
// NP weight panels, summed in registers and stored, added or biased into y; split_rows, the
// micro-kernel calls that cover a block of rows; pack_rows, x's rows k-major as those calls read
// them.
#pragma once

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "panels.h"
#include "vec.h"

namespace modelyard::gemm32 {

// A single row streams its panels from memory: each stream prefetches into L2 this many weights
// (2 KiB of float32) ahead of its loads (kernel_ab: 1 and 4 KiB were no faster, the prefetchers
// alone 8-12 % slower)
constexpr int64_t kAhead = 512;

// The micro-kernel's vector: 16 floats where the kernels are built for AVX-512 (one register
// per panel row: half the instructions per FMA, and on cores with two 512-bit FMA units twice
// the arithmetic per cycle), else 8. Either way each output sums its k in order, so both give
// the same bits.
#if defined(__AVX512F__)
using vec = modelyard::v16;
constexpr int64_t kMR = 12;  // rows of x per micro-kernel call: 12 accumulators
inline vec broadcast(float v) { return vec{v, v, v, v, v, v, v, v, v, v, v, v, v, v, v, v}; }
// two panels per micro-kernel call (24 accumulators of the 32 registers): each x broadcast
// feeds two FMAs, halving the loads per FMA
constexpr bool kPairs = true;
#else
using vec = v8;
constexpr int64_t kMR = 6;  // rows of x per micro-kernel call: 6 x 2 accumulators
inline vec broadcast(float v) { return splat(v); }
constexpr bool kPairs = false;  // 24 accumulators would not fit in 16 registers
#endif
constexpr int kVecs = kNR / (sizeof(vec) / sizeof(float));  // vectors per panel row
constexpr int kLanes = kNR / kVecs;

inline v8 load(const float* p) { return *reinterpret_cast<const v8*>(p); }
inline vec load_vec(const float* p) { return *reinterpret_cast<const vec*>(p); }
// a vector of bf16 weights (bits) widened to float32: exact
inline vec load_vec(const uint16_t* p) {
#if defined(__AVX512F__)
  return modelyard::load_bf16x16(p);
#else
  return modelyard::load_bf16(p);
#endif
}

// The panels a micro-kernel call reads: NP of them, `stride` elements apart. W float32, or bf16
// bits, which the call widens as it goes and, where `wide` is set, also writes, widened, to
// `wide` (the chunk's float32 copy, wide_stride floats between panels) for the calls after it.
template <typename W>
struct Panels {
  const W* at;
  int64_t stride;
  float* wide = nullptr;
  int64_t wide_stride = 0;
};

// Where one panel's products go: y (row stride ldy, ncols of the panel's 16 columns), and the
// bias to add (nullptr but in the last K chunk).
struct Target {
  float* y;
  int64_t ldy, ncols;
  const float* bias;
};

// One row of a micro-kernel's block into out (ncols of a panel's 16): stored by the first K
// chunk, added by later ones; bias (or nullptr) added by the last.
inline void store_row(const vec (&acc)[kVecs], bool first, const float* bias, float* out,
                      int64_t ncols) {
  if (ncols == kNR) {  // a whole panel: vector stores
    for (int h = 0; h < kVecs; ++h) {
      vec r = acc[h];
      if (!first) r = load_vec(out + h * kLanes) + r;
      if (bias != nullptr) r += load_vec(bias + h * kLanes);
      *reinterpret_cast<vec*>(out + h * kLanes) = r;
    }
    return;
  }
  alignas(64) float row[kNR];
  for (int h = 0; h < kVecs; ++h) *reinterpret_cast<vec*>(row + h * kLanes) = acc[h];
  for (int64_t j = 0; j < ncols; ++j) {
    const float prior = first ? 0.f : out[j];
    out[j] = bias != nullptr ? prior + row[j] + bias[j] : prior + row[j];
  }
}

// y[i][0..ncols) (+)= sum over k < k_len of x[k][i] * panel[k][..] for the rows i < MR (x packed
// k-major by pack_rows, so the MR values of one k are adjacent: each FMA takes its x value as a
// broadcast memory operand off one pointer, rather than a load and a shuffle off MR row pointers,
// which on Intel cores runs on an FMA port and halves the FMA rate): the
// first K chunk stores, later ones add to y; the last adds the bias. With PF == kChunkAhead, one
// 64-byte line from pf.at on is prefetched every pf.every steps of k; with kStreamAhead each
// panel's line kAhead elements ahead, into L2 (PF is a compile-time switch: a test in the loop
// costs ~10 % at prefill sizes).
enum Prefetch { kNone, kChunkAhead, kStreamAhead };

// Where kChunkAhead prefetches: the line at `at` (and at + stride for a second panel), the
// next line every `every` steps of k; into L1, or with `l2` into L2 only.
struct Ahead {
  const char* at;
  int64_t stride, every;
  bool l2;
};

template <int MR, int NP, int PF, typename W>
inline void micro(const float* x, Panels<W> panel, int64_t k_len, bool first, const Target* to,
                  Ahead pf) {
  vec acc[NP][MR][kVecs];
  for (int p = 0; p < NP; ++p) {
    for (int i = 0; i < MR; ++i) {
      for (int h = 0; h < kVecs; ++h) acc[p][i][h] = vec{};
    }
  }
  int64_t countdown = 1;
  for (int64_t k = 0; k < k_len; ++k) {
    if constexpr (PF == kStreamAhead) {
      for (int p = 0; p < NP; ++p) {
        __builtin_prefetch(panel.at + p * panel.stride + k * kNR + kAhead, 0, 2);
      }
    }
    if constexpr (PF == kChunkAhead) {
      if (--countdown == 0) {
        for (int p = 0; p < NP; ++p) {
          if (pf.l2) {
            __builtin_prefetch(pf.at + p * pf.stride, 0, 2);
          } else {
            __builtin_prefetch(pf.at + p * pf.stride, 0, 3);
          }
        }
        pf.at += 64;
        countdown = pf.every;
      }
    }
    vec b[NP][kVecs];
    for (int p = 0; p < NP; ++p) {
      const W* row = panel.at + p * panel.stride + k * kNR;
      for (int h = 0; h < kVecs; ++h) b[p][h] = load_vec(row + h * kLanes);
      if constexpr (std::is_same_v<W, uint16_t>) {
        if (panel.wide != nullptr) {
          float* wide = panel.wide + p * panel.wide_stride + k * kNR;
          for (int h = 0; h < kVecs; ++h) *reinterpret_cast<vec*>(wide + h * kLanes) = b[p][h];
        }
      }
    }
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      const vec a = broadcast(x[k * MR + i]);
      for (int p = 0; p < NP; ++p) {
        for (int h = 0; h < kVecs; ++h) acc[p][i][h] += a * b[p][h];
      }
    }
  }
  for (int p = 0; p < NP; ++p) {
    for (int i = 0; i < MR; ++i) {
      store_row(acc[p][i], first, to[p].bias, to[p].y + i * to[p].ldy, to[p].ncols);
    }
  }
}

template <int MR, int NP, int PF, typename W>
void micro_rows(const float* x, Panels<W> panel, int64_t k_len, bool first, const Target* to,
                int64_t rows, Ahead pf) {
  switch (rows) {
    case MR: micro<MR, NP, PF>(x, panel, k_len, first, to, pf); break;
    default:
      if constexpr (MR > 1) micro_rows<MR - 1, NP, PF>(x, panel, k_len, first, to, rows, pf);
  }
}

// The micro-kernel calls of a block of `rows` rows: fewest calls, of near-equal sizes (32 rows
// of at most 12: 11 11 10, not 12 12 8: a call of few rows has too few independent FMA chains
// to fill the pipes). Calls fn(call, calls, first_row, row_count) for each.
template <typename Fn>
inline void split_rows(int64_t rows, const Fn& fn) {
  const int64_t calls = (rows + kMR - 1) / kMR, base = rows / calls, extra = rows % calls;
  for (int64_t c = 0, i = 0; c < calls; ++c) {
    const int64_t r = base + (c < extra ? 1 : 0);
    fn(c, calls, i, r);
    i += r;
  }
}

#if defined(__AVX2__)
// v[t] = column t of the 8 x 8 block whose rows are v[0..7]
inline void transpose8(__m256 (&v)[8]) {
  __m256 t[8], s[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(v[2 * i], v[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(v[2 * i], v[2 * i + 1]);
  }
  for (int i = 0; i < 2; ++i) {
    for (int h = 0; h < 2; ++h) {
      s[4 * i + 2 * h] = _mm256_shuffle_ps(t[4 * i + h], t[4 * i + h + 2], _MM_SHUFFLE(1, 0, 1, 0));
      s[4 * i + 2 * h + 1] =
          _mm256_shuffle_ps(t[4 * i + h], t[4 * i + h + 2], _MM_SHUFFLE(3, 2, 3, 2));
    }
  }
  for (int c = 0; c < 4; ++c) {
    v[c] = _mm256_permute2f128_ps(s[c], s[c + 4], 0x20);
    v[c + 4] = _mm256_permute2f128_ps(s[c], s[c + 4], 0x31);
  }
}

// 8 k of n <= 8 rows (src, ldx apart) into 8 k-major rows of dst (r floats apart), n each
inline void pack_block8(const float* src, int64_t ldx, int64_t n, float* dst, int64_t r) {
  __m256 v[8];
  for (int64_t j = 0; j < 8; ++j) {
    v[j] = j < n ? _mm256_loadu_ps(src + j * ldx) : _mm256_setzero_ps();
  }
  transpose8(v);
  if (n == 8) {
    for (int t = 0; t < 8; ++t) _mm256_storeu_ps(dst + t * r, v[t]);
    return;
  }
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), lanes);
  for (int t = 0; t < 8; ++t) _mm256_maskstore_ps(dst + t * r, mask, v[t]);
}
#endif

// Rows [0, rows) of x (row stride ldx) as split_rows calls them, each call's rows k-major:
// call (i, r) at out + i * k_len, x[i + j][k] at k * r + j. With AVX2, 8 x 8 blocks
// transposed in registers (a scalar copy of one element per cycle cost a decode step ~2 %).
inline void pack_rows(const float* x, int64_t ldx, int64_t rows, int64_t k_len, float* out) {
  split_rows(rows, [&](int64_t, int64_t, int64_t i, int64_t r) {
    float* dst = out + i * k_len;
    int64_t k0 = 0;
#if defined(__AVX2__)
    for (; k0 + 8 <= k_len; k0 += 8) {
      for (int64_t j = 0; j < r; j += 8) {
        pack_block8(x + (i + j) * ldx + k0, ldx, std::min<int64_t>(8, r - j), dst + k0 * r + j, r);
      }
    }
#endif
    for (int64_t j = 0; j < r; ++j) {
      const float* src = x + (i + j) * ldx;
      for (int64_t k = k0; k < k_len; ++k) dst[k * r + j] = src[k];
    }
  });
}

// This thread's copy of rows [m0, m0 + rows) of x packed by pack_rows, made once per gemm call
// (`call` numbers the calls) and row block: a thread claims a row block's units in a run.
inline const float* packed_rows(const float* x, int64_t m0, int64_t rows, int64_t k_len,
                               uint64_t call) {
  if (rows == 1) return x + m0 * k_len;  // one row k-major is the row itself
  thread_local std::vector<float> buffer;
  thread_local uint64_t packed_call = 0;
  thread_local int64_t packed_m0 = -1;
  if (packed_call != call || packed_m0 != m0) {
    buffer.resize(rows * k_len);
    pack_rows(x + m0 * k_len, k_len, rows, k_len, buffer.data());
    packed_call = call;
    packed_m0 = m0;
  }
  return buffer.data();
}

}  // namespace modelyard::gemm32
