// y = x W^T for bfloat16 at decode sizes on AMX tiles (Intel Sapphire Rapids and later).
//
// A decode step streams every weight from memory once for a few dozen rows of x, so on a 2-core
// host its GEMMs are bound by memory bandwidth, not arithmetic; AMX's tile multiply makes the
// arithmetic nearly free and leaves the weight stream as the cost. The weight is pack_bf16's
// panels (16 output columns, k in pairs: exactly the B operand of `tdpbf16ps`, 16 pairs of k =
// one 1 KiB tile), so one packing serves this kernel and the AVX-512 BF16 one. A unit of work is
// two panels (32 columns); the threads claim units in turn (claim.h), and while a thread computes
// one unit it prefetches each panel's stream 8 KiB ahead into L2 (at the panels' end running on
// into the thread's next unit), and per 32 k the next 32 k's B tiles from L2 into L1 (tile
// loads then hit L1: 5-6 % less time over a decode step's weights at 1 and 32 rows, kernel_ab).
// Per 32 k it loads an A tile of up to 16 rows of x for each 16 rows, the two B tiles, and
// accumulates four 16 x 16 float32 C tiles; rows past 32 run as further row blocks over the same
// panels (then in cache). Up to 32 rows a thread configures the tiles once per call and releases
// them after its last unit (per unit cost ~4 %), and writes each unit's epilogue (the sums
// rounded to bf16, or SwiGLU's activation) a few rows per 32 k of its next unit (Pending).
//
// The sum over K runs in one float32 accumulator per output in AMX's own order (pairs of k
// within a tile, tiles in order of k): not oneDNN's order, so results differ from F.linear in
// the last bit now and then (runner.linear says where this kernel is used).
//
// Tiles need the kernel's permission first: a virtual machine may list the amx flags while the
// tile state must still be requested with arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA);
// `amx_ready` asks once and reports False where it is refused (the runner then keeps its
// AVX-512 path), so no tile instruction ever runs without it.
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "claim.h"
#include "ops.h"
#include "vec.h"

using namespace modelyard::ops;  // (the ops this file defines at its end, ops.h)

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define MODELYARD_AMX 1
#endif

namespace {

constexpr int64_t kCols = 16;    // output columns per panel
constexpr int64_t kTileK = 32;   // k per tile (16 pairs)
constexpr int64_t kBlockM = 32;  // rows of x per row block (two A tiles)
// how far ahead of its tile loads each panel's stream is prefetched into L2 (kernel_ab, against
// the whole next unit spread over this one: 0.92x the time at 32 rows, 0.95x at 1; 2 and 4 KiB
// ahead: ~3 % slower than 8 at 32 rows)
constexpr int64_t kAhead = 8192;

#if defined(MODELYARD_AMX)
// the palette-1 tile configuration: C tiles 0-3 (rows r0, r0, r1, r1), A tiles 4-5 (r0, r1),
// B tiles 6-7 (16 pairs); every row 64 bytes
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

void configure(int r0, int r1) {
  TileConfig cfg;
  const int rows[8] = {r0, r0, r1, r1, r0, r1, 16, 16};
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = static_cast<uint8_t>(rows[t]);
    cfg.colsb[t] = rows[t] > 0 ? 64 : 0;
  }
  _tile_loadconfig(&cfg);
}

// Row q (< r0 + r1) of C tiles c (float32 sums, 16 x 16 each; rows of the second 16-row block,
// tiles 2-3, from q = r0) -> y: plain bf16, or with SWIGLU silu(gate) * up of C tiles
// gate = 2h, up = 2h + 1 (16 columns)
template <bool SWIGLU>
inline void epilogue_row(const float (*c)[16][16], int r0, int q, at::BFloat16* y, int64_t ldy,
                         int64_t ncols) {
  const int h = q < r0 ? 0 : 1, i = h == 0 ? q : q - r0;
  at::BFloat16* out = y + (h * 16 + i) * ldy;
  if constexpr (SWIGLU) {
    modelyard::swiglu_out(_mm512_load_ps(c[2 * h][i]), _mm512_load_ps(c[2 * h + 1][i]), out,
                          ncols);
  } else {
    for (int p = 0; p < 2 && p * kCols < ncols; ++p) {
      modelyard::store_sums(out + p * kCols, _mm512_load_ps(c[2 * h + p][i]),
                            std::min(kCols, ncols - p * kCols));
    }
  }
}

// A row block's C tiles, stored, and the rows of its epilogue still to write. Up to 32 rows the
// epilogue of a unit is written a few rows per 32 k while the thread's next unit streams its
// weights: written at once, the conversions and stores left the weight stream idle (a pass over
// a decode step's weights at 32 rows took 1.1x the time, at one row 1.03x).
struct Pending {
  alignas(64) float c[4][16][16];
  at::BFloat16* y = nullptr;  // nullptr: nothing to write
  int64_t ldy = 0, ncols = 0;
  int r0 = 0, rows = 0, done = 0;
  bool swiglu = false;

  void store(bool two, bool lower) {
    _tile_stored(0, c[0], 64);
    if (two) _tile_stored(1, c[1], 64);
    if (lower) {
      _tile_stored(2, c[2], 64);
      if (two) _tile_stored(3, c[3], 64);
    }
  }

  // write the epilogue's rows up to `upto` (of rows)
  void until(int upto) {
    if (y == nullptr) return;
    for (; done < std::min(upto, rows); ++done) {
      if (swiglu) {
        epilogue_row<true>(c, r0, done, y, ldy, ncols);
      } else {
        epilogue_row<false>(c, r0, done, y, ldy, ncols);
      }
    }
    if (done >= rows) y = nullptr;
  }
};

// one row block (r0 + r1 <= 32 rows of x at x, ldx elements apart) times two panels a, b
// (b unused unless TWO) into the C tiles; with `stream` (the first row block) it prefetches the
// weight stream ahead: the panels' own lines, then those of next (the thread's next unit's first
// panel, its second right after; nullptr: none); `pending` (or nullptr): an earlier unit's
// epilogue, written in even shares over the steps of k
template <bool TWO, bool LOWER>
void block(const at::BFloat16* x, int64_t ldx, const at::BFloat16* a, const at::BFloat16* b,
           int64_t pairs, bool stream, const char* next, Pending* pending) {
  const int64_t steps = pairs / (kTileK / 2);
  _tile_zero(0);
  if (TWO) _tile_zero(1);
  if (LOWER) {
    _tile_zero(2);
    if (TWO) _tile_zero(3);
  }
  const int64_t stride = ldx * static_cast<int64_t>(sizeof(at::BFloat16));
  const int64_t bytes = pairs * 64;  // of one panel
  const char* pa = reinterpret_cast<const char*>(a);
  const char* pb = reinterpret_cast<const char*>(b);
  for (int64_t j = 0; j < pairs; j += kTileK / 2) {
    if (stream) {  // each panel's lines kAhead bytes on into L2, past its end the next unit's
      for (int64_t o = j * 64 + kAhead; o < (j + kTileK / 2) * 64 + kAhead; o += 64) {
        if (o < bytes) {
          _mm_prefetch(pa + o, _MM_HINT_T1);
          if (TWO) _mm_prefetch(pb + o, _MM_HINT_T1);
        } else if (next != nullptr) {
          _mm_prefetch(next + o - bytes, _MM_HINT_T1);
          _mm_prefetch(next + o, _MM_HINT_T1);
        }
      }
    }
    if (j + kTileK / 2 < pairs) {  // the next step's B tiles into L1 (from L2, see stream)
      const char* na = reinterpret_cast<const char*>(a + (j + kTileK / 2) * 2 * kCols);
      const char* nb = TWO ? reinterpret_cast<const char*>(b + (j + kTileK / 2) * 2 * kCols)
                           : nullptr;
      for (int l = 0; l < 16; ++l) {
        _mm_prefetch(na + l * 64, _MM_HINT_T0);
        if (TWO) _mm_prefetch(nb + l * 64, _MM_HINT_T0);
      }
    }
    _tile_loadd(6, a + j * 2 * kCols, 64);
    if (TWO) _tile_loadd(7, b + j * 2 * kCols, 64);
    _tile_loadd(4, x + 2 * j, stride);
    if (pending != nullptr) {
      const int64_t step = j / (kTileK / 2) + 1;
      pending->until(static_cast<int>((step * pending->rows + steps - 1) / steps));
    }
    _tile_dpbf16ps(0, 4, 6);
    if (TWO) _tile_dpbf16ps(1, 4, 7);
    if (LOWER) {
      _tile_loadd(5, x + 16 * ldx + 2 * j, stride);
      _tile_dpbf16ps(2, 5, 6);
      if (TWO) _tile_dpbf16ps(3, 5, 7);
    }
  }
}

template <bool SWIGLU>
void gemm(const at::Tensor& x, const at::Tensor& packed, at::Tensor& y) {
  const int64_t m = x.size(0), k = x.size(1), panels = packed.size(0), pairs = packed.size(1);
  const int64_t n = y.size(1);
  const at::BFloat16* xp = x.data_ptr<at::BFloat16>();
  const at::BFloat16* wp = packed.data_ptr<at::BFloat16>();
  at::BFloat16* yp = y.data_ptr<at::BFloat16>();
  const int64_t units = (panels + 1) / 2, panel_elems = pairs * 2 * kCols;
  const int64_t unit_cols = SWIGLU ? kCols : 2 * kCols;
  const bool one_block = m <= kBlockM;  // one tile configuration for the whole call
  modelyard::for_each_claimed(units, [&](int64_t unit, int64_t following, bool opening) {
    const at::BFloat16* a = wp + 2 * unit * panel_elems;
    const bool two = 2 * unit + 1 < panels;
    const at::BFloat16* b = two ? a + panel_elems : nullptr;
    const char* next = following < units
                           ? reinterpret_cast<const char*>(wp + 2 * following * panel_elems)
                           : nullptr;
    const int64_t ncols = std::min(unit_cols, n - unit * unit_cols);
    thread_local Pending pending[2];  // per thread: this unit's row block and the previous's
    thread_local int current = 0;
    if (opening) pending[0].y = pending[1].y = nullptr;
    for (int64_t i = 0; i < m; i += kBlockM) {
      const int r0 = static_cast<int>(std::min<int64_t>(16, m - i));
      const int r1 = static_cast<int>(std::clamp<int64_t>(m - i - 16, 0, 16));
      if (!one_block || opening) configure(r0, r1);
      const bool stream = i == 0;  // later row blocks find the panels in cache
      const at::BFloat16* xi = xp + i * k;
      Pending* earlier = one_block ? &pending[current ^ 1] : nullptr;
      if (two && r1 > 0) block<true, true>(xi, k, a, b, pairs, stream, next, earlier);
      if (two && r1 == 0) block<true, false>(xi, k, a, b, pairs, stream, next, earlier);
      if (!two && r1 > 0) block<false, true>(xi, k, a, b, pairs, stream, next, earlier);
      if (!two && r1 == 0) block<false, false>(xi, k, a, b, pairs, stream, next, earlier);
      if (earlier != nullptr) earlier->until(kBlockM);
      Pending& now = pending[current];
      now.store(two, r1 > 0);
      now.y = yp + i * n + unit * unit_cols, now.ldy = n, now.ncols = ncols;
      now.r0 = r0, now.rows = r0 + r1, now.done = 0, now.swiglu = SWIGLU;
      if (one_block && following < units) {
        current ^= 1;  // written during the thread's next unit
      } else {
        now.until(kBlockM);
      }
    }
    if (!one_block || following >= units) _tile_release();  // this thread's last unit
  });
}
#endif

// y (M, cols) from x (M, K) bf16 contiguous, K a multiple of 32, and pack_bf16's panels (4-D),
// or with SWIGLU pack_swiglu_bf16's (5-D: a gate and an up panel make 16 columns)
template <bool SWIGLU>
at::Tensor packed_amx(const at::Tensor& x, const at::Tensor& packed, int64_t cols,
                      const char* name) {
  TORCH_CHECK(amx_ready(), name, ": AMX tiles not available (not built for them, or refused)");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.is_contiguous() &&
                  x.size(1) % kTileK == 0,
              name, ": contiguous bfloat16 (M, K) input, K a multiple of 32");
  TORCH_CHECK(packed.scalar_type() == at::kBFloat16 && packed.dim() == (SWIGLU ? 5 : 4) &&
                  (!SWIGLU || packed.size(1) == 2) && packed.is_contiguous() &&
                  packed.size(-2) == kCols && packed.size(-1) == 2 &&
                  x.size(1) == 2 * packed.size(-3),
              name, SWIGLU ? ": weight not from pack_swiglu_bf16 for this input"
                           : ": weight not from pack_bf16 for this input");
  const int64_t col_panels = packed.size(0);
  TORCH_CHECK(cols > (col_panels - 1) * kCols && cols <= col_panels * kCols, name,
              ": shapes do not match");
  auto y = at::empty({x.size(0), cols}, x.options());
#if defined(MODELYARD_AMX)
  if (x.size(0) > 0) gemm<SWIGLU>(x, SWIGLU ? packed.flatten(0, 1) : packed, y);
#endif
  return y;
}

}  // namespace

namespace modelyard::ops {

bool amx_ready() {
#if defined(MODELYARD_AMX)
  static const bool ready = [] {
    constexpr long kGetPerm = 0x1022, kRequestPerm = 0x1023, kTileData = 18;
    if (syscall(SYS_arch_prctl, kRequestPerm, kTileData) != 0) return false;
    unsigned long granted = 0;
    return syscall(SYS_arch_prctl, kGetPerm, &granted) == 0 && ((granted >> kTileData) & 1);
  }();
  return ready;
#else
  return false;
#endif
}

at::Tensor packed_linear_amx(const at::Tensor& x, const at::Tensor& packed, int64_t n) {
  return packed_amx<false>(x, packed, n, "packed_linear_amx");
}

at::Tensor packed_swiglu_amx(const at::Tensor& x, const at::Tensor& packed, int64_t width) {
  return packed_amx<true>(x, packed, width, "packed_swiglu_amx");
}

}  // namespace modelyard::ops
