// y = x W^T (+ b) for float32 on CPU, with W packed once at load (the runner's linear layers).
//
// A decode step multiplies a few dozen rows by every weight of the model; general GEMM
// libraries tune for large square products and reach ~40 % of this host's FMA peak at 32 rows.
// Here W (N, K) is packed into panels of kNR = 16 output columns, k-major: panel p holds
// W[p*16 .. p*16+15][k] for k = 0..K-1, 16 floats per k (zero columns pad the last panel).
// The micro-kernel keeps a 6 x 16 block of y in 12 vector registers and, per k, loads two
// vectors of the panel and broadcasts six x values: 12 FMAs per 8 loads (the classic AVX2
// shape); built for AVX-512, a 12 x 32 block (two panels) in 24 registers of 16 floats. x's
// rows are first copied k-major per micro-kernel call (pack_rows), so the broadcasts read one
// stream. K is cut into near-equal chunks of at most kKC (panels.h), each chunk's panels read
// by every row block of x in turn; groups of panels are claimed by the ATen
// thread pool's threads in turn (claim.h). For a Llama MLP's gate and up projections
// (pack_swiglu, packed_swiglu) gate and up panels alternate and silu(gate) * up is applied to
// each tile pair while it is in L1, so the (M, 2I) projection is never written to memory.
// A single row (a decode step of one request) is bound by the weight stream alone: it takes
// four adjacent panels at a time, each its own stream with a software prefetch 2 KiB ahead,
// which reads the weights ~12 % faster than two streams left to the hardware prefetchers.
// The same GEMM serves bf16 weights where the kernels have no AVX-512 (runner.bf16_widen, more
// than one row; widened_linear): the panels hold bf16, the first micro-kernel call on each chunk
// widens it (exact) into an L1 buffer the calls for the other rows read, and y is rounded to
// bf16: the float32 GEMM's sums from half the bytes.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <type_traits>
#include <vector>

#include "claim.h"
#include "ops.h"
#include "panels.h"
#include "vec.h"

using namespace modelyard::ops;  // (the ops this file defines at its end, ops.h)

namespace {

using modelyard::exp8;
using modelyard::splat;
using modelyard::v8;

using modelyard::kKC;  // k per cache block, at most (a ~36 KiB panel chunk)
using modelyard::kNR;  // output columns per panel (two 8-float vectors, or one 16-float)
constexpr int64_t kMC = 96;  // rows of x per cache block (prefill sizes)
// A single row streams its panels from memory: each stream prefetches into L2 this many weights
// (2 KiB of float32) ahead of its loads (kernel_ab: 1 and 4 KiB were no faster, the prefetchers alone 8-12 %
// slower)
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
void pack_rows(const float* x, int64_t ldx, int64_t rows, int64_t k_len, float* out) {
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
const float* packed_rows(const float* x, int64_t m0, int64_t rows, int64_t k_len, uint64_t call) {
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

std::atomic<uint64_t> gemm_calls{0};

// The next chunk to prefetch while one is computed: its first byte (nullptr: none), the bytes
// between its panels, the k steps each 64-byte line of a panel holds (1 for float32 panels, 2
// for bf16) and whether into L2 only (Ahead).
struct NextChunk {
  const char* at;
  int64_t stride, k_per_line;
  bool l2;
};

// Call c of `calls` of row_blocks: rows [i, i + r) of the block.
template <int NP, typename W>
void row_call(const float* xb, int64_t rows, int64_t k_total, int64_t k0, Panels<W> panel,
              int64_t k_len, bool first, const Target* to, NextChunk next, int64_t c,
              int64_t calls, int64_t i, int64_t r) {
  const float* xi = xb + i * k_total + k0 * r;
  Target rows_to[NP];
  for (int p = 0; p < NP; ++p) {
    rows_to[p] = {to[p].y + i * to[p].ldy, to[p].ldy, to[p].ncols, to[p].bias};
  }
  constexpr Ahead none{nullptr, 0, 0, false};
  if constexpr (NP == 4) {  // a single row's four streams
    micro<1, 4, kStreamAhead>(xi, panel, k_len, first, rows_to, none);
    return;
  }
  if (next.at != nullptr) {
    const int64_t lines = k_len / next.k_per_line;
    const Ahead pf{next.at + c * lines / calls * 64, next.stride, calls * next.k_per_line,
                   next.l2};
    micro_rows<kMR, NP, kChunkAhead>(xi, panel, k_len, first, rows_to, r, pf);
  } else if (rows == 1) {
    micro_rows<kMR, NP, kStreamAhead>(xi, panel, k_len, first, rows_to, r, none);
  } else {
    micro_rows<kMR, NP, kNone>(xi, panel, k_len, first, rows_to, r, none);
  }
}

// The rows of a block (x packed by pack_rows, its k0 .. k0 + k_len chunk) times NP panel chunks
// into `to`. bf16 panels are widened by the first call, into panel.wide, and read from there by
// the calls after it. With next.at, the L = k_len / k_per_line lines of each of the next
// chunk's panels are prefetched, spread evenly over all the calls: call c of C takes lines
// [c L / C, (c + 1) L / C), one every C k_per_line steps of k.
template <int NP, typename W>
void row_blocks(const float* xb, int64_t rows, int64_t k_total, int64_t k0, Panels<W> panels,
                int64_t k_len, bool first, const Target* to, NextChunk next) {
  split_rows(rows, [&](int64_t c, int64_t calls, int64_t i, int64_t r) {
    if constexpr (std::is_same_v<W, uint16_t>) {
      if (c > 0) {
        const Panels<float> wide{panels.wide, panels.wide_stride};
        return row_call<NP>(xb, rows, k_total, k0, wide, k_len, first, to, next, c, calls, i, r);
      }
      if (calls == 1) panels.wide = nullptr;  // no call after this one: nothing to leave
    }
    row_call<NP>(xb, rows, k_total, k0, panels, k_len, first, to, next, c, calls, i, r);
  });
}

// out[r][0..ncols) = silu(gate[r]) * up[r] for the rows of two (rows, 16) tiles (ldy: out's
// row stride)
void swiglu_tile(const float* gate, const float* up, int64_t rows, float* out, int64_t ldy,
                 int64_t ncols) {
  for (int64_t r = 0; r < rows; ++r) {
    alignas(32) float row[kNR];
    for (int64_t c = 0; c < kNR; c += 8) {
      const v8 g = load(gate + r * kNR + c), u = load(up + r * kNR + c);
      *reinterpret_cast<v8*>(row + c) = g / (splat(1.f) + exp8(-g)) * u;
    }
    std::copy(row, row + ncols, out + r * ldy);
  }
}

// out[r][0..ncols) = tile[r] (+ bias) rounded to bf16 for the rows of a (rows, 16) tile (ldy:
// out's row stride)
void round_tile(const float* tile, const float* bias, int64_t rows, at::BFloat16* out,
                int64_t ldy, int64_t ncols) {
  alignas(32) float b[kNR] = {};
  if (bias != nullptr) std::copy(bias, bias + ncols, b);
  for (int64_t r = 0; r < rows; ++r) {
    alignas(32) at::BFloat16 row[kNR];
    for (int64_t c = 0; c < kNR; c += 8) {
      const v8 v = load(tile + r * kNR + c);
      modelyard::store_bf16(row + c, bias != nullptr ? v + load(b + c) : v);
    }
    std::copy(row, row + ncols, out + r * ldy);
  }
}

// y (M, n) = x W^T (+ bias), or with swiglu y = silu(x Wg^T) * (x Wu^T) from pack_swiglu's
// weight: each gate / up panel pair is computed into two small per-thread tiles (L1-resident)
// and only their product is written, so the (M, 2n) intermediate never goes to memory.
// W float32, or bf16 (uint16_t bits; no swiglu): then the first micro-kernel call of each chunk
// widens its panels as it computes and leaves them, widened, in a per-thread float32 buffer (L1)
// that the calls for the other rows read: the sums are the float32 GEMM's, one widening serves
// all rows, and memory delivers half the bytes.
// y is float32, or with W bf16 bfloat16: each 16-column block is then summed into a per-thread
// float32 tile and rounded into y from there (as torch rounds: store_bf16).
template <typename W>
at::Tensor gemm(const at::Tensor& x, const at::Tensor& packed, int64_t n, const float* bp,
                bool swiglu) {
  constexpr bool kFloat32 = std::is_same_v<W, float>;
  const int64_t per = swiglu ? 2 : 1;  // panels per 16 output columns
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(),
              "packed_linear: contiguous float32 (M, K) input");
  TORCH_CHECK(packed.scalar_type() == (kFloat32 ? at::kFloat : at::kBFloat16) && packed.dim() == 3 &&
                  packed.is_contiguous() && packed.size(2) == kNR && packed.size(0) % per == 0,
              "packed_linear: weight not from pack_weight / pack_swiglu");
  const int64_t m = x.size(0), k_len = x.size(1), blocks = packed.size(0) / per;
  TORCH_CHECK(packed.size(1) == k_len && k_len > 0 && n > (blocks - 1) * kNR && n <= blocks * kNR,
              "packed_linear: shapes do not match");
  TORCH_CHECK(kFloat32 || !swiglu, "packed_swiglu: float32 weights only");
  auto y = at::empty({m, n}, x.options().dtype(kFloat32 ? at::kFloat : at::kBFloat16));
  if (m == 0) return y;
  const float* xp = x.data_ptr<float>();
  const W* wp = static_cast<const W*>(packed.data_ptr());
  float* yp = kFloat32 ? y.data_ptr<float>() : nullptr;
  const int64_t k_chunk = modelyard::k_chunk(k_len);
  const bool prefetch = m > 1;
  // Units of work are (block of x rows, group of 16-column blocks), x-row-block-major, claimed
  // by the threads in turn (claim.h): a few blocks each, so the last claims stay short (four
  // for a single row, which streams four panels at once).
  // Where the micro-kernel takes panels in pairs, a group of an odd count (qkv's 60 blocks on two
  // threads: 3) would leave one in three panels to a call of half the accumulators: even counts.
  const int64_t threads = at::get_num_threads();
  int64_t group = m == 1 ? 4 : std::clamp<int64_t>(blocks / (8 * threads), 1, 4);
  if (kPairs && !swiglu && m > 1 && blocks > 1) group = std::max<int64_t>(2, group / 2 * 2);
  const int64_t groups = (blocks + group - 1) / group, units = (m + kMC - 1) / kMC * groups;
  const uint64_t call = gemm_calls.fetch_add(1, std::memory_order_relaxed) + 1;
  modelyard::for_each_claimed(units, [&](int64_t unit, int64_t following, bool) {
    const int64_t m0 = unit / groups * kMC, rows = std::min(kMC, m - m0);
    const float* xb = packed_rows(xp, m0, rows, k_len, call);
    const int64_t begin = unit % groups * group, end = std::min(blocks, begin + group);
    // where this thread goes after this group: the first panel of its next claim
    const W* after =
        following < units ? wp + following % groups * group * per * k_len * kNR : nullptr;
    // panels p .. p + np - 1 times the rows into to[0 .. np)
    auto panels = [&](int64_t p, int np, const Target* to) {
      for (int64_t k0 = 0; k0 < k_len; k0 += k_chunk) {
        const int64_t kc = std::min(k_chunk, k_len - k0);
        const bool last = k0 + kc == k_len;
        const W* chunk = wp + (p * k_len + k0) * kNR;
        // decode sizes (one block of rows) read each panel chunk from memory once and compute
        // on it briefly, and hardware prefetchers stop at each 4 KiB page: so the chunk that
        // comes next is prefetched while this one is computed, a line every few k over all the
        // row blocks (a burst in the first block alone stalls it). A single row streams its
        // panels with a prefetch a little ahead in each (micro's kStreamAhead). At prefill
        // sizes many row blocks reuse the chunk from L1, so the next one goes to L2 only
        // (kernel_ab at 2048 rows, five runs: SwiGLU 4-11 % faster, the others -8..+7 %,
        // 2-3 % faster on average).
        const W* next = nullptr;
        if (prefetch) {
          const bool more = p + np < end * per;  // this claim's next panel, else the next claim's
          next = !last ? chunk + kc * kNR : more ? wp + (p + np) * k_len * kNR : after;
        }
        const NextChunk ahead{reinterpret_cast<const char*>(next), k_len * kNR * int64_t{sizeof(W)},
                              int64_t{64 / (kNR * sizeof(W))}, m > kMC};
        // bf16: the chunk of the one panel (np 1) widened by the first row call (Panels)
        alignas(64) thread_local float wide[kFloat32 ? 1 : kKC * kNR];
        const Panels<W> from{chunk, k_len * kNR, kFloat32 ? nullptr : wide, kc * kNR};
        Target chunk_to[4];
        for (int i = 0; i < np; ++i) {
          chunk_to[i] = {to[i].y, to[i].ldy, to[i].ncols, last ? to[i].bias : nullptr};
        }
        if constexpr (!kFloat32) {
          row_blocks<1>(xb, rows, k_len, k0, from, kc, k0 == 0, chunk_to, ahead);
        } else if (np == 4) {
          row_blocks<4>(xb, rows, k_len, k0, from, kc, k0 == 0, chunk_to, ahead);
        } else if (kPairs && np == 2) {
          row_blocks<2>(xb, rows, k_len, k0, from, kc, k0 == 0, chunk_to, ahead);
        } else {
          row_blocks<1>(xb, rows, k_len, k0, from, kc, k0 == 0, chunk_to, ahead);
        }
      }
    };
    alignas(64) thread_local float gate[kMC * kNR], up[kMC * kNR];
    auto target = [&](int64_t q) -> Target {
      const int64_t col = q * kNR;
      return {yp + m0 * n + col, n, std::min(kNR, n - col), bp != nullptr ? bp + col : nullptr};
    };
    alignas(64) thread_local float gate2[kNR], up2[kNR];
    for (int64_t q = begin; q < end;) {
      if constexpr (!kFloat32) {  // bf16 out: the block into a tile, then rounded
        const int64_t col = q * kNR, ncols = std::min(kNR, n - col);
        const Target to[1] = {{gate, kNR, kNR, nullptr}};  // (gate: no swiglu here)
        panels(q, 1, to);
        round_tile(gate, bp != nullptr ? bp + col : nullptr, rows,
                   y.data_ptr<at::BFloat16>() + m0 * n + col, n, ncols);
        ++q;
        continue;
      }
      if (m == 1 && swiglu && q + 1 < end) {  // one row: blocks q and q + 1's pairs at once
        const Target to[4] = {{gate, kNR, kNR, nullptr}, {up, kNR, kNR, nullptr},
                              {gate2, kNR, kNR, nullptr}, {up2, kNR, kNR, nullptr}};
        panels(2 * q, 4, to);
        Target out = target(q);
        swiglu_tile(gate, up, rows, out.y, n, out.ncols);
        out = target(q + 1);
        swiglu_tile(gate2, up2, rows, out.y, n, out.ncols);
        q += 2;
      } else if (m == 1 && !swiglu && q + 3 < end) {  // one row: four blocks at once
        const Target to[4] = {target(q), target(q + 1), target(q + 2), target(q + 3)};
        panels(q, 4, to);
        q += 4;
      } else if (swiglu) {  // the gate and up panels of block q: one pair
        const Target to[2] = {{gate, kNR, kNR, nullptr}, {up, kNR, kNR, nullptr}};
        if (kPairs) {
          panels(2 * q, 2, to);
        } else {
          panels(2 * q, 1, to);
          panels(2 * q + 1, 1, to + 1);
        }
        const Target out = target(q);
        swiglu_tile(gate, up, rows, out.y, n, out.ncols);
        ++q;
      } else if (kPairs && q + 1 < end) {  // blocks q and q + 1 (adjacent panels): one pair
        const Target to[2] = {target(q), target(q + 1)};
        panels(q, 2, to);
        q += 2;
      } else {
        const Target to[1] = {target(q)};
        panels(q, 1, to);
        ++q;
      }
    }
  });
  return y;
}

}  // namespace

namespace modelyard::ops {

// w (N, K) float32 -> packed (ceil(N / 16), K, 16)
at::Tensor pack_weight(const at::Tensor& w) {
  TORCH_CHECK(w.scalar_type() == at::kFloat && w.dim() == 2, "pack_weight: float32 (N, K) only");
  const int64_t n = w.size(0), k = w.size(1), panels = (n + kNR - 1) / kNR;
  auto padded = at::zeros({panels * kNR, k}, w.options());
  padded.narrow(0, 0, n).copy_(w);
  return padded.view({panels, kNR, k}).transpose(1, 2).contiguous();
}

// x (M, K), packed from pack_weight, n = N, bias (N,) or undefined -> (M, N)
at::Tensor packed_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n,
                         const c10::optional<at::Tensor>& bias) {
  const float* bp = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->scalar_type() == at::kFloat && bias->is_contiguous() && bias->numel() == n,
                "packed_linear: bias must be float32 (N,)");
    bp = bias->data_ptr<float>();
  }
  return gemm<float>(x, packed, n, bp, false);
}

// x (M, K) float32, packed (ceil(N / 16), K, 16) bfloat16 (runner.bf16_widen.pack), n = N,
// bias (N,) float32 or nullptr -> (M, N) bfloat16
at::Tensor widened_linear(const at::Tensor& x, const at::Tensor& packed, int64_t n,
                          const float* bias) {
  return gemm<uint16_t>(x, packed, n, bias, false);
}

// SwiGLU's gate and up weights (I, K) each -> one packed weight whose panels alternate: gate
// rows 0..15, up rows 0..15, gate rows 16..31, ... (zero rows pad the last pair)
at::Tensor pack_swiglu(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(gate.scalar_type() == at::kFloat && gate.dim() == 2 && gate.sizes() == up.sizes() &&
                  up.scalar_type() == at::kFloat,
              "pack_swiglu: two float32 (I, K) weights of one shape");
  const int64_t n = gate.size(0), k = gate.size(1), blocks = (n + kNR - 1) / kNR;
  auto pad = [&](const at::Tensor& w) {
    auto padded = at::zeros({blocks * kNR, k}, w.options());
    padded.narrow(0, 0, n).copy_(w);
    return padded.view({blocks, kNR, k});
  };
  return pack_weight(at::stack({pad(gate), pad(up)}, 1).view({2 * blocks * kNR, k}));
}

// x (M, K), packed from pack_swiglu of (I, K) weights, n = I -> (M, I)
at::Tensor packed_swiglu(const at::Tensor& x, const at::Tensor& packed, int64_t n) {
  return gemm<float>(x, packed, n, nullptr, true);
}

}  // namespace modelyard::ops
