// bfloat16 decode attention on AMX hosts for a cache in the tile layout (runner.kv_layout):
// both products on tiles, reached through try_decode_tiles (attention_bf16.h).
#include "attention_bf16.h"

#if defined(MODELYARD_AMX_SCORES)
#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "claim.h"
#include "paged_kv.h"
#include "vec.h"

namespace modelyard::attention {
namespace {

// Decode attention on a cache in the tile layout (kv layout 1, written so by rope_store: within
// a block, K as (hd / 2, bs, 2) and V as (bs / 2, hd, 2)), head size 64, block size a multiple
// of 16, on AMX hosts. Both products run on tiles with the G query rows as the A operand, so no
// lane of a tile is wasted on absent query columns and nothing is gathered or reduced after:
// scores S (G x 16 keys) = Q (G x 32 dims, twice) times K^T, read in place as the B operand
// (16 dim pairs x 16 keys); after the softmax, O (G x 64) += P (G x 16 keys, bf16 as SDPA rounds
// it) times V, read in place as four B operands (8 key pairs x 16 dims). 0.78x the time of
// decode_dp<G, 2, true> over 30 layers x 32 requests x ~190 keys (from memory and from cache
// alike). The arithmetic is decode_dp's: float32 scores and softmax, bf16 P, float32 sums, one
// multiply by 1 / sum, the output rounded to bf16; the sums' order is the tiles' own.
// Tiles: 0-1 S of two 16-key chunks (then O's first two 16-column groups), 2-3 Q (then O's
// other two), 4-5 K^T of one chunk, 6 P, 7 V.
template <int G>
inline void configure_layout_tiles() {
  configure_tiles({G, G, G, G, 16, 16, G, 8}, {64, 64, 64, 64, 64, 64, 32, 64});
}

// The scores of item (r, h) against the request's keys from chunk `base` on (a multiple of 16),
// unscaled, into s[j * stride + t - base], from the query rows in tiles 2-3: two 16-key chunks
// in flight on tiles 0 and 1 (a chunk may hold keys past the last: their scores are never read)
template <int G>
void tile_scores(const PagedKV<at::BFloat16>& kv, int64_t r, int64_t h, int64_t base,
                 float* s, int64_t stride) {
  constexpr int64_t hd = 64;
  const int64_t bs = kv.bs, len = kv.key_range(r).second, last_block = (len - 1) / bs;
  const auto keys = [&](int64_t cs) {  // K^T of chunk cs: dims 0-31 in tile 4, 32-63 in 5
    const int64_t b = cs / bs, o = cs % bs;
    if (o == 0 && b < last_block) prefetch_rows(kv.k + kv.block_row(r, h, b + 1) * hd, bs * hd);
    const at::BFloat16* kb = kv.k + kv.block_row(r, h, b) * hd;
    _tile_loadd(4, kb + o * 2, bs * 4);
    _tile_loadd(5, kb + (16 * bs + o) * 2, bs * 4);
  };
  for (int64_t cs = base; cs < len; cs += 32) {
    _tile_zero(0);
    keys(cs);
    _tile_dpbf16ps(0, 2, 4);
    _tile_dpbf16ps(0, 3, 5);
    if (cs + 16 < len) {
      _tile_zero(1);
      keys(cs + 16);
      _tile_dpbf16ps(1, 2, 4);
      _tile_dpbf16ps(1, 3, 5);
      _tile_stored(1, s + (cs + 16 - base), stride * 4);
    }
    _tile_stored(0, s + (cs - base), stride * 4);
  }
}

// O (G x 64, tiles 0-3) = P (bf16 rows pb, stride apart, zero outside the request's keys) times
// the values of item (r, h) from chunk `base` on. The last chunk's rows past the request's
// last key are left out (copied, zeroed): a stale row there may hold anything, even a NaN.
template <int G>
void tile_values(const PagedKV<at::BFloat16>& kv, int64_t r, int64_t h, int64_t base,
                 const at::BFloat16* pb, int64_t stride) {
  constexpr int64_t hd = 64;
  const int64_t bs = kv.bs, len = kv.key_range(r).second, last_block = (len - 1) / bs;
  alignas(64) at::BFloat16 tail[8 * hd * 2];
  _tile_zero(0);  // (tile numbers are immediates: no loops over them)
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t cs = base; cs < len; cs += 16) {
    const int64_t b = cs / bs, o = cs % bs;
    if (o == 0 && b < last_block) prefetch_rows(kv.v + kv.block_row(r, h, b + 1) * hd, bs * hd);
    const at::BFloat16* vb = kv.v + (kv.block_row(r, h, b) + o) * hd;  // key pair o / 2's row
    if (cs + 16 > len) {
      std::memcpy(tail, vb, sizeof(tail));
      for (int64_t i = len - cs; i < 16; ++i) {
        for (int64_t d = 0; d < hd; ++d) tail[(i / 2 * hd + d) * 2 + i % 2] = at::BFloat16(0.f);
      }
      vb = tail;
    }
    _tile_loadd(6, pb + (cs - base), stride * 2);
    _tile_loadd(7, vb, hd * 4);
    _tile_dpbf16ps(0, 6, 7);
    _tile_loadd(7, vb + 32, hd * 4);
    _tile_dpbf16ps(1, 6, 7);
    _tile_loadd(7, vb + 64, hd * 4);
    _tile_dpbf16ps(2, 6, 7);
    _tile_loadd(7, vb + 96, hd * 4);
    _tile_dpbf16ps(3, 6, 7);
  }
}

// O in tiles 0-3 (G x 64 float32 sums) times inv[j] per row, rounded to bf16 into out (G, 64)
template <int G>
void store_tile_output(const float* inv, at::BFloat16* out) {
  constexpr int64_t hd = 64;
  alignas(64) float sums[G][hd];
  _tile_stored(0, &sums[0][0], hd * 4);
  _tile_stored(1, &sums[0][16], hd * 4);
  _tile_stored(2, &sums[0][32], hd * 4);
  _tile_stored(3, &sums[0][48], hd * 4);
  for (int j = 0; j < G; ++j) {
    const __m512 f = _mm512_set1_ps(inv[j]);
    for (int c = 0; c < hd; c += 16) {
      const __m512 x = _mm512_mul_ps(_mm512_load_ps(&sums[j][c]), f);
      modelyard::store_bf16x16(out + j * hd + c, reinterpret_cast<const modelyard::v16&>(x));
    }
  }
}

// decode_dp<G, 2, true>'s contract on a cache in the tile layout (q (D, nh, 64) bf16, rows q_row
// apart -> (D, nh, 64) bf16, contiguous)
template <int G>
at::Tensor decode_tiles(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                        const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale,
                        int64_t window) {
  using bf16 = at::BFloat16;
  const Bf16Decode call(q, k_cache, v_cache, block_tables, seq_lens, scale, window);
  const PagedKV<bf16>& kv = call.kv;
  const int64_t nkv = kv.nkv;
  modelyard::for_each_short_unit(call.items(), [&](int64_t item, int64_t following,
                                                  bool opening) {
    thread_local std::vector<float> scores;  // G rows from chunk `base` on, stride apart
    thread_local std::vector<bf16> probs;    // the same as SDPA's P, zero outside the keys
    if (opening) configure_layout_tiles<G>();
    call.prefetch(item, following, opening);
    const int64_t r = item / nkv, h = item % nkv;
    const auto [first, len] = kv.key_range(r);
    const int64_t base = first / 16 * 16, stride = (len + 15) / 16 * 16 - base;
    scores.resize(static_cast<size_t>(G * stride));
    probs.assign(static_cast<size_t>(G * stride), bf16(0.f));
    const bf16* const qh = call.query_rows(r, h, G);
    _tile_loadd(2, qh, 64 * 2);
    _tile_loadd(3, qh + 32, 64 * 2);
    tile_scores<G>(kv, r, h, base, scores.data(), stride);
    float inv[G];
    for (int j = 0; j < G; ++j) {
      const int64_t row = j * stride + first - base;
      inv[j] = exp_probs(scores.data() + row, len - first, probs.data() + row, call.scale);
    }
    tile_values<G>(kv, r, h, base, probs.data(), stride);
    store_tile_output<G>(inv, call.output_rows(r, h, G));
    if (following >= call.items()) _tile_release();  // this thread's last item
  });
  return call.out;
}

}  // namespace

at::Tensor try_decode_tiles(const at::Tensor& q, const at::Tensor& k_cache,
                            const at::Tensor& v_cache, const at::Tensor& block_tables,
                            const at::Tensor& seq_lens, double scale, int64_t window) {
  switch (q.size(1) / k_cache.size(0)) {
    case 1: return decode_tiles<1>(q, k_cache, v_cache, block_tables, seq_lens, scale, window);
    case 2: return decode_tiles<2>(q, k_cache, v_cache, block_tables, seq_lens, scale, window);
    case 3: return decode_tiles<3>(q, k_cache, v_cache, block_tables, seq_lens, scale, window);
    case 4: return decode_tiles<4>(q, k_cache, v_cache, block_tables, seq_lens, scale, window);
    default: return at::Tensor();
  }
}

}  // namespace modelyard::attention
#endif
