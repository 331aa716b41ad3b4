// y = x W^T (+ b) for float32 on CPU, with W packed once at load (the runner's linear layers).
//
// A decode step multiplies a few dozen rows by every weight of the model; general GEMM
// libraries tune for large square products and reach ~40 % of this host's FMA peak at 32 rows.
// Here W (N, K) is packed into panels of kNR = 16 output columns, k-major: panel p holds
// W[p*16 .. p*16+15][k] for k = 0..K-1, 16 floats per k (zero columns pad the last panel).
// The micro-kernel keeps a 6 x 16 block of y in 12 vector registers and, per k, loads two
// vectors of the panel and broadcasts six x values: 12 FMAs per 8 loads (the classic AVX2
// shape); built for AVX-512, a 12 x 32 block (two panels) in 24 registers of 16 floats
// (gemm_micro.h). x's rows are first copied k-major per micro-kernel call (pack_rows), so the
// broadcasts read one stream. K is cut into near-equal chunks of at most kKC (panels.h), each
// chunk's panels read by every row block of x in turn; groups of panels are claimed by the ATen
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

#include "claim.h"
#include "gemm_micro.h"
#include "ops.h"
#include "panels.h"
#include "vec.h"

using namespace modelyard::ops;  // (the ops this file defines at its end, ops.h)

namespace {

using namespace modelyard::gemm32;  // the micro-kernel (gemm_micro.h)
using modelyard::exp8;
using modelyard::splat;
using modelyard::v8;

using modelyard::kKC;  // k per cache block, at most (a ~36 KiB panel chunk)
using modelyard::kNR;  // output columns per panel (two 8-float vectors, or one 16-float)
constexpr int64_t kMC = 96;  // rows of x per cache block (prefill sizes)

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

// Checks gemm's operands: x (M, K) float32, and a weight from pack_weight / pack_swiglu (W float32)
// or from pack_weight's bf16 form (W bf16 bits) with n of its 16-column blocks' columns.
void check_operands(const at::Tensor& x, const at::Tensor& packed, int64_t n, bool swiglu,
                    bool float32) {
  const int64_t per = swiglu ? 2 : 1;  // panels per 16 output columns
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(),
              "packed_linear: contiguous float32 (M, K) input");
  TORCH_CHECK(packed.scalar_type() == (float32 ? at::kFloat : at::kBFloat16) && packed.dim() == 3 &&
                  packed.is_contiguous() && packed.size(2) == kNR && packed.size(0) % per == 0,
              "packed_linear: weight not from pack_weight / pack_swiglu");
  const int64_t k_len = x.size(1), blocks = packed.size(0) / per;
  TORCH_CHECK(packed.size(1) == k_len && k_len > 0 && n > (blocks - 1) * kNR && n <= blocks * kNR,
              "packed_linear: shapes do not match");
  TORCH_CHECK(float32 || !swiglu, "packed_swiglu: float32 weights only");
}

// One gemm call: y (M, n) = x W^T (+ bias), or with swiglu y = silu(x Wg^T) * (x Wu^T) from
// pack_swiglu's weight: each gate / up panel pair is computed into two small per-thread tiles
// (L1-resident) and only their product is written, so the (M, 2n) intermediate never goes to
// memory.
// W float32, or bf16 (uint16_t bits; no swiglu): then the first micro-kernel call of each chunk
// widens its panels as it computes and leaves them, widened, in a per-thread float32 buffer (L1)
// that the calls for the other rows read: the sums are the float32 GEMM's, one widening serves
// all rows, and memory delivers half the bytes.
// y is float32, or with W bf16 bfloat16: each 16-column block is then summed into a per-thread
// float32 tile and rounded into y from there (as torch rounds: store_bf16).
// Units of work are (block of x rows, group of 16-column blocks), x-row-block-major, claimed by
// the threads in turn (claim.h): a few blocks each, so the last claims stay short (four for a
// single row, which streams four panels at once).
template <typename W>
struct Gemm {
  static constexpr bool kFloat32 = std::is_same_v<W, float>;
  const float* xp;
  const W* wp;
  float* yp;  // (float32 y)
  at::BFloat16* yb;  // (bf16 y)
  const float* bp;
  int64_t m, n, k_len, k_chunk, per, blocks, group = 0, groups = 0, units = 0;
  bool swiglu;
  uint64_t call;

  Gemm(const at::Tensor& x, const at::Tensor& packed, at::Tensor& y, int64_t n_, const float* bp_,
       bool swiglu_)
      : xp(x.data_ptr<float>()),
        wp(static_cast<const W*>(packed.data_ptr())),
        yp(kFloat32 ? y.data_ptr<float>() : nullptr),
        yb(kFloat32 ? nullptr : y.data_ptr<at::BFloat16>()),
        bp(bp_),
        m(x.size(0)),
        n(n_),
        k_len(x.size(1)),
        k_chunk(modelyard::k_chunk(k_len)),
        per(swiglu_ ? 2 : 1),
        blocks(packed.size(0) / per),
        swiglu(swiglu_),
        call(gemm_calls.fetch_add(1, std::memory_order_relaxed) + 1) {
    // Where the micro-kernel takes panels in pairs, a group of an odd count (qkv's 60 blocks on
    // two threads: 3) would leave one in three panels to a call of half the accumulators: even
    // counts.
    const int64_t threads = at::get_num_threads();
    group = m == 1 ? 4 : std::clamp<int64_t>(blocks / (8 * threads), 1, 4);
    if (kPairs && !swiglu && m > 1 && blocks > 1) group = std::max<int64_t>(2, group / 2 * 2);
    groups = (blocks + group - 1) / group;
    units = (m + kMC - 1) / kMC * groups;
  }

  // What a claimed unit covers: rows [m0, m0 + rows) of x (xb: packed), 16-column blocks
  // [begin, end), and `after`, the first panel of the thread's next claim (nullptr: none).
  struct Unit {
    int64_t m0, rows;
    const float* xb;
    int64_t begin, end;
    const W* after;
  };

  // unit `unit` of `units`, with `following` the thread's next claim (units: none)
  void run(int64_t unit, int64_t following) const {
    Unit u{};
    u.m0 = unit / groups * kMC;
    u.rows = std::min(kMC, m - u.m0);
    u.xb = packed_rows(xp, u.m0, u.rows, k_len, call);
    u.begin = unit % groups * group;
    u.end = std::min(blocks, u.begin + group);
    u.after = following < units ? wp + following % groups * group * per * k_len * kNR : nullptr;
    for (int64_t q = u.begin; q < u.end;) q = step(u, q);
  }

  // where y's 16-column block q goes, in the unit's rows
  Target target(const Unit& u, int64_t q) const {
    const int64_t col = q * kNR;
    return {yp + u.m0 * n + col, n, std::min(kNR, n - col), bp != nullptr ? bp + col : nullptr};
  }

  // y's blocks from block q on, as many as one pass over the panels takes: returns the next
  int64_t step(const Unit& u, int64_t q) const {
    alignas(64) thread_local float gate[kMC * kNR], up[kMC * kNR], gate2[kNR], up2[kNR];
    if constexpr (!kFloat32) {  // bf16 out: the block into a tile, then rounded
      const int64_t col = q * kNR;
      const Target to[1] = {{gate, kNR, kNR, nullptr}};  // (gate: no swiglu here)
      panels(u, q, 1, to);
      round_tile(gate, bp != nullptr ? bp + col : nullptr, u.rows, yb + u.m0 * n + col, n,
                 std::min(kNR, n - col));
      return q + 1;
    }
    if (m == 1 && swiglu && q + 1 < u.end) {  // one row: blocks q and q + 1's pairs at once
      const Target to[4] = {{gate, kNR, kNR, nullptr}, {up, kNR, kNR, nullptr},
                            {gate2, kNR, kNR, nullptr}, {up2, kNR, kNR, nullptr}};
      panels(u, 2 * q, 4, to);
      const Target first = target(u, q), second = target(u, q + 1);
      swiglu_tile(gate, up, u.rows, first.y, n, first.ncols);
      swiglu_tile(gate2, up2, u.rows, second.y, n, second.ncols);
      return q + 2;
    }
    if (m == 1 && !swiglu && q + 3 < u.end) {  // one row: four blocks at once
      const Target to[4] = {target(u, q), target(u, q + 1), target(u, q + 2), target(u, q + 3)};
      panels(u, q, 4, to);
      return q + 4;
    }
    if (swiglu) {  // the gate and up panels of block q: one pair
      const Target to[2] = {{gate, kNR, kNR, nullptr}, {up, kNR, kNR, nullptr}};
      if (kPairs) {
        panels(u, 2 * q, 2, to);
      } else {
        panels(u, 2 * q, 1, to);
        panels(u, 2 * q + 1, 1, to + 1);
      }
      const Target out = target(u, q);
      swiglu_tile(gate, up, u.rows, out.y, n, out.ncols);
      return q + 1;
    }
    const int np = kPairs && q + 1 < u.end ? 2 : 1;  // blocks q and q + 1: adjacent panels
    const Target to[2] = {target(u, q), np == 2 ? target(u, q + 1) : Target{}};
    panels(u, q, np, to);
    return q + np;
  }

  // panels p .. p + np - 1 times the unit's rows into to[0 .. np), a K chunk at a time
  void panels(const Unit& u, int64_t p, int np, const Target* to) const {
    for (int64_t k0 = 0; k0 < k_len; k0 += k_chunk) {
      const int64_t kc = std::min(k_chunk, k_len - k0);
      const bool last = k0 + kc == k_len;
      const W* chunk = wp + (p * k_len + k0) * kNR;
      const NextChunk ahead = next_chunk(u, p, np, chunk, kc, last);
      // bf16: the chunk of the one panel (np 1) widened by the first row call (Panels)
      alignas(64) thread_local float wide[kFloat32 ? 1 : kKC * kNR];
      const Panels<W> from{chunk, k_len * kNR, kFloat32 ? nullptr : wide, kc * kNR};
      Target chunk_to[4];
      for (int i = 0; i < np; ++i) {
        chunk_to[i] = {to[i].y, to[i].ldy, to[i].ncols, last ? to[i].bias : nullptr};
      }
      const bool first = k0 == 0;
      if constexpr (!kFloat32) {
        row_blocks<1>(u.xb, u.rows, k_len, k0, from, kc, first, chunk_to, ahead);
      } else if (np == 4) {
        row_blocks<4>(u.xb, u.rows, k_len, k0, from, kc, first, chunk_to, ahead);
      } else if (kPairs && np == 2) {
        row_blocks<2>(u.xb, u.rows, k_len, k0, from, kc, first, chunk_to, ahead);
      } else {
        row_blocks<1>(u.xb, u.rows, k_len, k0, from, kc, first, chunk_to, ahead);
      }
    }
  }

  // What to prefetch while the chunk at `chunk` (kc k steps of panels p .. p + np - 1) is
  // computed. Decode sizes (one block of rows) read each panel chunk from memory once and
  // compute on it briefly, and hardware prefetchers stop at each 4 KiB page: so the chunk that
  // comes next is prefetched while this one is computed, a line every few k over all the row
  // blocks (a burst in the first block alone stalls it). A single row streams its panels with a
  // prefetch a little ahead in each (micro's kStreamAhead): nothing here. At prefill sizes many
  // row blocks reuse the chunk from L1, so the next one goes to L2 only (kernel_ab at 2048
  // rows, five runs: SwiGLU 4-11 % faster, the others -8..+7 %, 2-3 % faster on average).
  NextChunk next_chunk(const Unit& u, int64_t p, int np, const W* chunk, int64_t kc,
                       bool last) const {
    const W* next = nullptr;
    if (m > 1) {
      const bool more = p + np < u.end * per;  // this claim's next panel, else the next claim's
      next = !last ? chunk + kc * kNR : more ? wp + (p + np) * k_len * kNR : u.after;
    }
    return {reinterpret_cast<const char*>(next), k_len * kNR * int64_t{sizeof(W)},
            int64_t{64 / (kNR * sizeof(W))}, m > kMC};
  }
};

template <typename W>
at::Tensor gemm(const at::Tensor& x, const at::Tensor& packed, int64_t n, const float* bp,
                bool swiglu) {
  constexpr bool kFloat32 = std::is_same_v<W, float>;
  check_operands(x, packed, n, swiglu, kFloat32);
  auto y = at::empty({x.size(0), n}, x.options().dtype(kFloat32 ? at::kFloat : at::kBFloat16));
  if (x.size(0) == 0) return y;
  const Gemm<W> g(x, packed, y, n, bp, swiglu);
  modelyard::for_each_claimed(
      g.units, [&](int64_t unit, int64_t following, bool) { g.run(unit, following); });
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
