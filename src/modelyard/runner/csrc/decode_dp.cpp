// bfloat16 decode attention on AVX-512 BF16 hosts (`vdpbf16ps`), its scores on AMX tiles where
// the host has them and granted the tile state: decode_dp, reached through try_decode_dp
// (attention_bf16.h). The arithmetic is the widened path's (paged_decode.cpp), without widening.
#include "attention_bf16.h"

#if defined(MODELYARD_DP_ATTENTION)
#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "claim.h"
#include "ops.h"
#include "paged_kv.h"
#include "vec.h"

namespace modelyard::attention {
namespace {

// lane t of the result: the sum of the 16 lanes of v[t] (v is overwritten). Four levels, each
// folding pairs of vectors: 30 permutes and 15 adds for 16 sums.
inline __m512 reduce16(__m512* v) {
  auto level = [v](int count, __m512i lo, __m512i hi) {
    for (int i = 0; i < count; ++i) {
      v[i] = _mm512_add_ps(_mm512_permutex2var_ps(v[2 * i], lo, v[2 * i + 1]),
                           _mm512_permutex2var_ps(v[2 * i], hi, v[2 * i + 1]));
    }
  };
  level(8, _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23),
        _mm512_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31));
  level(4, _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27),
        _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31));
  level(2, _mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29),
        _mm512_setr_epi32(2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31));
  level(1, _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30),
        _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31));
  return v[0];
}

// Scores of the G query rows q (C vectors of bf16 pairs each) against n <= 16 consecutive key
// rows k (n, 32 C), scaled, into s[j * stride + t].
// FULL: n is 16, so the 16 accumulators stay in registers (a per-key test of n spilled them
// to the stack: 25-30 % of the kernel's time with K/V in cache)
template <int G, int C, bool FULL>
inline void dp_scores(const __m512bh* q, const at::BFloat16* k, int64_t n, float scale, float* s,
                      int64_t stride) {
  for (int j = 0; j < G; ++j) {
    __m512 acc[16];
#pragma GCC unroll 16
    for (int t = 0; t < 16; ++t) {
      acc[t] = _mm512_setzero_ps();
      if (!FULL && t >= n) continue;
      const auto* row = reinterpret_cast<const __m512i*>(k + t * 32 * C);
      for (int c = 0; c < C; ++c) {
        acc[t] = _mm512_dpbf16_ps(acc[t], q[j * C + c], (__m512bh)_mm512_loadu_si512(row + c));
      }
    }
    const __m512 scores = _mm512_mul_ps(reduce16(acc), _mm512_set1_ps(scale));
    if (FULL) {
      _mm512_storeu_ps(s + j * stride, scores);
    } else {
      _mm512_mask_storeu_ps(s + j * stride, head_mask(n), scores);
    }
  }
}

#if defined(MODELYARD_AMX_SCORES)
// Scores on AMX tiles (AMX hosts, where the tile state was granted: amx_ready), head size 64.
// C (16 keys x 16 query columns, float32) = K (16 key rows x 32 of the head size per tile, read
// in place from the block) times Q^T (the G query rows' pairs as a tile's columns): two tile
// multiplies per 16 keys and no horizontal reductions, which were most of dp_scores' work. The
// G columns of C are then gathered out as rows of scores. Two chunks are in flight on tiles of
// their own (a tile multiply's latency is several times its issue interval). Keys go in 16-row
// chunks aligned inside their block (block sizes a multiple of 16), so a chunk may hold rows
// before `first` or past the last key: their scores come from whatever the rows hold and are
// never stored. Over 30 layers x 32 requests x 191 keys read from memory: 0.89-0.94x the time
// of dp_scores (kernel_ab, three block layouts).

// tiles 0-1: C of chunks a, b; 2-3: K of a; 4-5: K of b; 6-7: Q^T; 16 rows of 64 bytes each
inline void configure_score_tiles() {
  configure_tiles({16, 16, 16, 16, 16, 16, 16, 16}, {64, 64, 64, 64, 64, 64, 64, 64});
}

// The B operand of the score tiles: qt[c][k][j] holds query row j's values 32 c + 2 k and
// 32 c + 2 k + 1 (columns past G stay zero); loaded into tiles 6 and 7
template <int G>
struct QueryTiles {
  alignas(64) uint32_t qt[2][16][16] = {};

  void load(const at::BFloat16* q) {
    uint32_t pairs[G][32];
    std::memcpy(pairs, q, sizeof(pairs));
    for (int j = 0; j < G; ++j) {
      for (int c = 0; c < 2; ++c) {
        for (int k = 0; k < 16; ++k) qt[c][k][j] = pairs[j][16 * c + k];
      }
    }
    _tile_loadd(6, qt[0], 64);
    _tile_loadd(7, qt[1], 64);
  }
};

// One chunk's scores out of C (16 keys x 16 columns), scaled, stored for lanes [lo, hi) into
// s[j * stride + lane] (s: the chunk's position in the rows of scores)
template <int G>
inline void store_scores(const float (*c)[16], int lo, int hi, float scale, float* s,
                         int64_t stride) {
  const __m512i column = _mm512_slli_epi32(
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), 4);
  const auto lanes = static_cast<__mmask16>(((1u << hi) - 1u) & ~((1u << lo) - 1u));
  for (int j = 0; j < G; ++j) {
    const __m512 dots = _mm512_i32gather_ps(column, &c[0][j], 4);
    _mm512_mask_storeu_ps(s + j * stride, lanes, _mm512_mul_ps(dots, _mm512_set1_ps(scale)));
  }
}

// The scores of item (r, h) for the query rows in tiles 6-7 against the request's keys, into
// s[j * stride + t]
template <int G>
void amx_item_scores(const PagedKV<at::BFloat16>& kv, int64_t r, int64_t h, float scale,
                     float* s, int64_t stride) {
  constexpr int64_t hd = 64, row_bytes = 128;
  const auto [first, len] = kv.key_range(r);
  const int64_t bs = kv.bs, last_block = (len - 1) / bs;
  alignas(64) float c[2][16][16];
  const auto chunk = [&](int64_t cs) {
    const int64_t b = cs / bs;
    if (cs % bs == 0 && b < last_block) {
      prefetch_rows(kv.k + kv.block_row(r, h, b + 1) * hd, bs * hd);
    }
    return kv.k + (kv.block_row(r, h, b) + cs % bs) * hd;
  };
  const auto out = [&](int i, int64_t cs) {
    const int lo = static_cast<int>(std::max(first, cs) - cs);
    const int hi = static_cast<int>(std::min(len, cs + 16) - cs);
    store_scores<G>(c[i], lo, hi, scale, s + (cs - first), stride);
  };
  for (int64_t cs = first / 16 * 16; cs < len; cs += 32) {
    const bool two = cs + 16 < len;
    const at::BFloat16* ka = chunk(cs);
    _tile_zero(0);
    _tile_loadd(2, ka, row_bytes);
    _tile_loadd(3, ka + 32, row_bytes);
    _tile_dpbf16ps(0, 2, 6);
    if (two) {
      const at::BFloat16* kb = chunk(cs + 16);
      _tile_zero(1);
      _tile_loadd(4, kb, row_bytes);
      _tile_loadd(5, kb + 32, row_bytes);
      _tile_dpbf16ps(1, 4, 6);
      _tile_dpbf16ps(0, 3, 7);
      _tile_dpbf16ps(1, 5, 7);
    } else {
      _tile_dpbf16ps(0, 3, 7);
    }
    _tile_stored(0, c[0], 64);
    if (two) _tile_stored(1, c[1], 64);
    out(0, cs);
    if (two) out(1, cs + 16);
  }
}
#endif

// acc[j][c] += sum over t of p[j * stride + t] * v[t] for n consecutive value rows v (n, 32 C):
// tokens t, t + 1 in one instruction on their rows interleaved (unpack order: lanes 4L + i of
// acc[j][c][0] and [1] hold columns 8L + i and 8L + 4 + i of chunk c)
template <int G, int C>
inline void dp_values(const at::BFloat16* p, int64_t stride, const at::BFloat16* v, int64_t n,
                      __m512 (&acc)[G][C][2]) {
  for (int64_t t = 0; t < n; t += 2) {
    const bool two = t + 1 < n;
    __m512bh w[G];  // (p[t], p[t + 1]) of each query row, or (p[t], 0)
    for (int j = 0; j < G; ++j) {
      uint32_t pair;  // p has room for a pair past the last key (stride is even and > n)
      std::memcpy(&pair, p + j * stride + t, sizeof(pair));
      if (!two) pair &= 0xFFFFu;  // (p[t], 0): the low half is the earlier token
      w[j] = (__m512bh)_mm512_set1_epi32(static_cast<int>(pair));
    }
    const auto* r0 = reinterpret_cast<const __m512i*>(v + t * 32 * C);
    for (int c = 0; c < C; ++c) {
      const __m512i a = _mm512_loadu_si512(r0 + c);
      const __m512i b = two ? _mm512_loadu_si512(r0 + C + c) : _mm512_setzero_si512();
      const __m512bh lo = (__m512bh)_mm512_unpacklo_epi16(a, b);
      const __m512bh hi = (__m512bh)_mm512_unpackhi_epi16(a, b);
      for (int j = 0; j < G; ++j) {
        acc[j][c][0] = _mm512_dpbf16_ps(acc[j][c][0], lo, w[j]);
        acc[j][c][1] = _mm512_dpbf16_ps(acc[j][c][1], hi, w[j]);
      }
    }
  }
}

// 32 output columns from unpack-ordered accumulators lo, hi, times f, rounded to bf16
inline void unscramble(__m512 lo, __m512 hi, float f, at::BFloat16* out) {
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second =
      _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  const __m512 scale = _mm512_set1_ps(f);
  const __m512 a = _mm512_mul_ps(_mm512_permutex2var_ps(lo, first, hi), scale);
  const __m512 b = _mm512_mul_ps(_mm512_permutex2var_ps(lo, second, hi), scale);
  modelyard::store_bf16x16(out, reinterpret_cast<const modelyard::v16&>(a));  // NaN as torch's
  modelyard::store_bf16x16(out + 16, reinterpret_cast<const modelyard::v16&>(b));
}

// The scores of item (r, h) by dp_scores: the G query rows at qh against the request's keys,
// scaled, into s[j * stride + t]
template <int G, int C>
void dp_item_scores(const PagedKV<at::BFloat16>& kv, int64_t r, int64_t h,
                    const at::BFloat16* qh, float scale, float* s, int64_t stride,
                    ItemTrickle<at::BFloat16>& next, int64_t per_run) {
  constexpr int64_t hd = 32 * C;
  const auto [first, len] = kv.key_range(r);
  const int64_t bs = kv.bs, last_block = kv.prefetch_until(r);
  __m512bh qv[G * C];
  for (int i = 0; i < G * C; ++i) {
    qv[i] = (__m512bh)_mm512_loadu_si512(reinterpret_cast<const __m512i*>(qh) + i);
  }
  for (int64_t p = first; p < len;) {
    const int64_t b = p / bs, run = std::min(len, (b + 1) * bs) - p;
    if (b < last_block) prefetch_rows(kv.k + kv.block_row(r, h, b + 1) * hd, bs * hd);
    const at::BFloat16* keys = kv.k + (kv.block_row(r, h, b) + p % bs) * hd;
    next.issue(per_run);
    int64_t o = 0;
    for (; o + 16 <= run; o += 16) {
      dp_scores<G, C, true>(qv, keys + o * hd, 16, scale, s + (p - first) + o, stride);
    }
    if (o < run) {
      dp_scores<G, C, false>(qv, keys + o * hd, run - o, scale, s + (p - first) + o, stride);
    }
    p += run;
  }
}

// decode<bf16> for G query heads per KV head and head size 32 C; q (D, nh, hd) bf16 (rows
// q_row apart) -> (D, nh, hd) bf16, contiguous
template <int G, int C, bool AMX>
at::Tensor decode_dp(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                     const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale,
                     int64_t window) {
  using bf16 = at::BFloat16;
  constexpr int64_t hd = 32 * C;
  const Bf16Decode call(q, k_cache, v_cache, block_tables, seq_lens, scale, window);
  const PagedKV<bf16>& kv = call.kv;
  const int64_t nkv = kv.nkv, bs = kv.bs;
  const float fscale = call.scale;
  modelyard::for_each_short_unit(call.items(), [&](int64_t item, int64_t following,
                                                  bool opening) {
    thread_local std::vector<float> scores;  // G rows, stride apart
    thread_local std::vector<bf16> probs;    // the same, exponentiated and rounded
    if (opening) kv.prefetch_item(item);
    ItemTrickle<bf16> next(kv, following < call.items() ? following : -1);
    const int64_t r = item / nkv, h = item % nkv;
    const auto [first, len] = kv.key_range(r);
    const int64_t n = len - first, last_block = kv.prefetch_until(r);
    const int64_t per_run = next.per_run(first, len);
    const int64_t stride = (n + 2) & ~int64_t(1);  // even: room for a pair past the last key
    constexpr int64_t front = AMX ? 16 : 0;  // AMX: room for a chunk's lanes before `first`
    scores.resize(static_cast<size_t>(G * stride + front));
    probs.resize(static_cast<size_t>(G * stride));
    float* const s = scores.data() + front;
    const bf16* const qh = call.query_rows(r, h, G);
#if defined(MODELYARD_AMX_SCORES)
    if constexpr (AMX) {
      if (opening) configure_score_tiles();
      thread_local QueryTiles<G> tiles;
      tiles.load(qh);
      amx_item_scores<G>(kv, r, h, fscale, s, stride);
      if (following >= call.items()) _tile_release();  // this thread's last item
    }
#endif
    if constexpr (!AMX) dp_item_scores<G, C>(kv, r, h, qh, fscale, s, stride, next, per_run);
    float inv[G];
    for (int j = 0; j < G; ++j) inv[j] = exp_probs(s + j * stride, n, probs.data() + j * stride);
    __m512 acc[G][C][2];
    for (int j = 0; j < G; ++j) {
      for (int c = 0; c < C; ++c) acc[j][c][0] = acc[j][c][1] = _mm512_setzero_ps();
    }
    for (int64_t p = first; p < len;) {
      const int64_t b = p / bs, run = std::min(len, (b + 1) * bs) - p;
      if (b < last_block) prefetch_rows(kv.v + kv.block_row(r, h, b + 1) * hd, bs * hd);
      const bf16* values = kv.v + (kv.block_row(r, h, b) + p % bs) * hd;
      next.issue(per_run);
      dp_values<G, C>(probs.data() + (p - first), stride, values, run, acc);
      p += run;
    }
    next.issue(next.left());  // what the runs left (AMX scores issue none)
    bf16* oh = call.output_rows(r, h, G);
    for (int j = 0; j < G; ++j) {
      for (int c = 0; c < C; ++c) {
        unscramble(acc[j][c][0], acc[j][c][1], inv[j], oh + j * hd + 32 * c);
      }
    }
  });
  return call.out;
}

}  // namespace

at::Tensor try_decode_dp(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                         const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale,
                         int64_t window) {
  const int64_t g = q.size(1) / k_cache.size(0), hd = q.size(2);
  at::Tensor out;
  auto attempt = [&](auto gv, auto cv) {
    constexpr int G = decltype(gv)::value, C = decltype(cv)::value;
    if (!out.defined() && g == G && hd == 32 * C) {
#if defined(MODELYARD_AMX_SCORES)
      if constexpr (C == 2) {  // AMX scores: head size 64
        if (k_cache.size(2) % 16 == 0 && modelyard::ops::amx_ready()) {
          out = decode_dp<G, C, true>(q, k_cache, v_cache, block_tables, seq_lens, scale, window);
          return;
        }
      }
#endif
      out = decode_dp<G, C, false>(q, k_cache, v_cache, block_tables, seq_lens, scale, window);
    }
  };
  using std::integral_constant;
  auto for_g = [&](auto cv) {
    attempt(integral_constant<int, 1>{}, cv), attempt(integral_constant<int, 2>{}, cv);
    attempt(integral_constant<int, 3>{}, cv), attempt(integral_constant<int, 4>{}, cv);
  };
  for_g(integral_constant<int, 2>{});
  for_g(integral_constant<int, 4>{});
  return out;
}

}  // namespace modelyard::attention
#endif
