// Decode attention straight from the paged KV cache (float32 or bfloat16, CPU).
//
// One query token per request; the g = nh / nkv query heads that share a KV head are computed
// together, so each key and value row is read once from the cache, in place: no gather of the
// request's blocks into a contiguous copy first (that copy was the step's largest memory cost).
// Work items are (request, KV head) pairs claimed by the ATen thread pool's threads in turn. Two
// passes per item: scores for every allowed key, then softmax and the weighted sum of values.
// Keys come in runs of consecutive rows inside one block; the inner loops work on 8-float vectors.
// A bfloat16 cache is read as is (half the bytes of a float32 cache) and each block run widened
// once to float32 in a per-thread buffer that stays in L1. The arithmetic then follows SDPA's CPU
// flash kernel for bf16: float32 scores and softmax, the unnormalised probabilities rounded to
// bf16 for the sum over values (float32 accumulators), one multiply by 1 / sum, and the output
// rounded to bf16. On AVX-512 BF16 hosts the common shapes skip the widening: see decode_dp;
// on AMX hosts its scores run on tiles (amx_item_scores), and a cache in the tile layout
// (runner.kv_layout) has both products on tiles (decode_tiles).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "claim.h"
#include "ops.h"
#include "vec.h"

using namespace modelyard::ops;  // (the ops this file defines at its end, ops.h)

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace {

using modelyard::exp8;
using modelyard::hsum;
using modelyard::splat;
using modelyard::v8;

// rows of a bf16 cache block as float32 in buf (count a multiple of 8), each element widened
// once rather than once per query row; float32 rows are used in place
inline const float* as_float(const float* x, int64_t, float*) { return x; }
inline const float* as_float(const at::BFloat16* x, int64_t count, float* buf) {
  for (int64_t i = 0; i < count; i += 8) {
    *reinterpret_cast<v8*>(buf + i) = modelyard::load_bf16(x + i);
  }
  return buf;
}

// The four horizontal sums of a, b, c, d into s[0..3].
inline void hsum4(v8 a, v8 b, v8 c, v8 d, float* s) {
#if defined(__AVX__)
  const __m256 ab = _mm256_hadd_ps(reinterpret_cast<__m256>(a), reinterpret_cast<__m256>(b));
  const __m256 cd = _mm256_hadd_ps(reinterpret_cast<__m256>(c), reinterpret_cast<__m256>(d));
  const __m256 abcd = _mm256_hadd_ps(ab, cd);  // per 128-bit lane: a b c d partial sums
  _mm_storeu_ps(s, _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1)));
#else
  s[0] = hsum(a), s[1] = hsum(b), s[2] = hsum(c), s[3] = hsum(d);
#endif
}

// The widest vector of the build for the float32 loops below: 16 floats with AVX-512 (half the
// instructions of 8), folded to 8 for the horizontal sums
inline v8 fold(v8 x) { return x; }
#if defined(__AVX512F__)
using wide = modelyard::v16;
inline v8 fold(wide x) {
  return __builtin_shufflevector(x, x, 0, 1, 2, 3, 4, 5, 6, 7) +
         __builtin_shufflevector(x, x, 8, 9, 10, 11, 12, 13, 14, 15);
}
#else
using wide = v8;
#endif
constexpr int64_t kWide = sizeof(wide) / sizeof(float);
// Whether the float32 loops below take a KV head's query rows together (AVX-512's 32 vector
// registers hold their accumulators; with 16, one row at a time spills nothing: 1.2-1.5x less
// time on an AVX2 build)
#if defined(__AVX512F__)
constexpr bool kGroupRows = true;
#else
constexpr bool kGroupRows = false;
#endif

// fn(std::integral_constant<int, G>{}): G = g for 1-4 query rows a KV head where kGroupRows,
// else 0 (any g, one row at a time)
template <typename Fn>
inline void with_group_rows(int64_t g, const Fn& fn) {
  switch (kGroupRows ? g : 0) {
    case 1: return fn(std::integral_constant<int, 1>{});
    case 2: return fn(std::integral_constant<int, 2>{});
    case 3: return fn(std::integral_constant<int, 3>{});
    case 4: return fn(std::integral_constant<int, 4>{});
    default: return fn(std::integral_constant<int, 0>{});
  }
}

// V's lanes from p, any alignment (a type passed as a template argument loses the aligned(4) of
// its typedef, so a load through V itself may assume the vector's full alignment)
template <typename V>
V loadu(const float* p);
template <>
inline v8 loadu<v8>(const float* p) {
  return *reinterpret_cast<const v8*>(p);
}
#if defined(__AVX512F__)
template <>
inline wide loadu<wide>(const float* p) {
  return *reinterpret_cast<const wide*>(p);
}
#endif

// Scores of the g query rows q (g, hd) against n consecutive key rows k (n, hd), scaled, into
// s[j * stride + t]. Four keys at a time per query row: four independent accumulators and one
// horizontal reduction for the four. V: the vector of the chunks (hd a multiple of its width).
// G > 0: the G rows together, each key chunk loaded once for all of them (G x 4 accumulators);
// G = 0: any g, one row at a time. Either way each score sums its chunks in the same order.
template <typename V, int G>
inline void scores_by_four(const float* q, const float* k, int64_t n, int64_t g, int64_t hd,
                           float scale, float* s, int64_t stride) {
  constexpr int64_t w = sizeof(V) / sizeof(float);
  constexpr int64_t rows = G > 0 ? G : 1;
  for (int64_t t = 0; t + 4 <= n; t += 4) {
    const float* k0 = k + t * hd;
    for (int64_t j0 = 0; j0 < g; j0 += rows) {
      V a[rows][4] = {};
      for (int64_t c = 0; c < hd; c += w) {
        V kc[4];
        for (int i = 0; i < 4; ++i) kc[i] = loadu<V>(k0 + i * hd + c);
        for (int64_t j = 0; j < rows; ++j) {
          const V qc = loadu<V>(q + (j0 + j) * hd + c);
          for (int i = 0; i < 4; ++i) a[j][i] += qc * kc[i];
        }
      }
      for (int64_t j = 0; j < rows; ++j) {
        float* out = s + (j0 + j) * stride + t;
        hsum4(fold(a[j][0]), fold(a[j][1]), fold(a[j][2]), fold(a[j][3]), out);
        for (int i = 0; i < 4; ++i) out[i] *= scale;
      }
    }
  }
}

inline void block_scores(const float* q, const float* k, int64_t n, int64_t g, int64_t hd,
                         float scale, float* s, int64_t stride) {
  const int64_t chunks = hd / 8;
  if (hd % kWide == 0) {
    with_group_rows(g, [&](auto rows) {
      scores_by_four<wide, decltype(rows)::value>(q, k, n, g, hd, scale, s, stride);
    });
  } else {
    scores_by_four<v8, 0>(q, k, n, g, hd, scale, s, stride);
  }
  int64_t t = n / 4 * 4;
  for (; t < n; ++t) {
    const float* key = k + t * hd;
    for (int64_t j = 0; j < g; ++j) {
      const float* qj = q + j * hd;
      v8 acc = {};
      for (int64_t c = 0; c < chunks; ++c) {
        acc += *reinterpret_cast<const v8*>(qj + c * 8) * *reinterpret_cast<const v8*>(key + c * 8);
      }
      s[j * stride + t] = hsum(acc) * scale;
    }
  }
}

// out (g, hd) += sum over t of p[j * stride + t] * v[t] for n consecutive value rows v (n, hd).
// Columns in groups of kCols `wide` vectors (64 with AVX-512, else 32), summed in registers over
// the n rows: each value row's group is loaded once for all G query rows (G x kCols independent
// chains, one broadcast weight per query row and value row; G = 0: any g, one row at a time);
// then any last 8-column chunks. Each column sums its rows in order whatever the width and G:
// the same bits.
constexpr int64_t kCols = 4;

template <int G>
inline void values_in_groups(const float* p, const float* v, int64_t n, int64_t g, int64_t hd,
                             int64_t stride, float* out) {
  constexpr int64_t rows = G > 0 ? G : 1, span = kCols * kWide;
  for (int64_t j0 = 0; j0 < g; j0 += rows) {
    for (int64_t c = 0; c + span <= hd; c += span) {
      wide a[rows][kCols];
      for (int64_t j = 0; j < rows; ++j) {
        for (int64_t i = 0; i < kCols; ++i) {
          a[j][i] = *reinterpret_cast<const wide*>(out + (j0 + j) * hd + c + i * kWide);
        }
      }
      for (int64_t t = 0; t < n; ++t) {
        wide row[kCols];
        for (int64_t i = 0; i < kCols; ++i) {
          row[i] = *reinterpret_cast<const wide*>(v + t * hd + c + i * kWide);
        }
        for (int64_t j = 0; j < rows; ++j) {
          const wide wt = p[(j0 + j) * stride + t] + wide{};
          for (int64_t i = 0; i < kCols; ++i) a[j][i] += wt * row[i];
        }
      }
      for (int64_t j = 0; j < rows; ++j) {
        for (int64_t i = 0; i < kCols; ++i) {
          *reinterpret_cast<wide*>(out + (j0 + j) * hd + c + i * kWide) = a[j][i];
        }
      }
    }
  }
}

inline void block_values(const float* p, const float* v, int64_t n, int64_t g, int64_t hd,
                         int64_t stride, float* out) {
  with_group_rows(g, [&](auto rows) {
    values_in_groups<decltype(rows)::value>(p, v, n, g, hd, stride, out);
  });
  for (int64_t c = hd / (kCols * kWide) * (kCols * kWide); c < hd; c += 8) {
    for (int64_t j = 0; j < g; ++j) {
      v8* o = reinterpret_cast<v8*>(out + j * hd + c);
      v8 acc = *o;
      const float* w = p + j * stride;
      for (int64_t t = 0; t < n; ++t) acc += w[t] * *reinterpret_cast<const v8*>(v + t * hd + c);
      *o = acc;
    }
  }
}

constexpr int64_t kPrefetchBytes = 128 * 1024;  // K+V of one item prefetched ahead, at most

// 64-byte lines into L2 (prefetcht1), not L1: the next item's 48 KiB of K/V would evict the
// current one's from a 48 KiB L1, and L2 prefetches keep more misses in flight. Against L1
// prefetches, on the default model's decode step (30 layers x 32 requests x 191 keys, K/V
// from memory): bf16 -11 % with blocks laid out as the engine's (-20 % scattered, +-2 % in
// order), float32 -29 % (-38 %, -20 %).
template <typename T>
inline void prefetch_rows(const T* x, int64_t count) {
  constexpr int64_t kLine = 64 / sizeof(T);
  for (int64_t i = 0; i < count; i += kLine) __builtin_prefetch(x + i, 0, 2);
}

// the largest of x[0..n), n >= 1 (the same value in any order)
inline float max_of(const float* x, int64_t n) {
  int64_t i = 0;
  float m = x[0];
  if (n >= 8) {
    v8 m8 = *reinterpret_cast<const v8*>(x);
    for (i = 8; i + 8 <= n; i += 8) {
      const v8 y = *reinterpret_cast<const v8*>(x + i);
      m8 = m8 > y ? m8 : y;
    }
    alignas(32) float lanes[8];
    *reinterpret_cast<v8*>(lanes) = m8;
    m = *std::max_element(lanes, lanes + 8);
  }
  for (; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

// Each of the g rows of s (n wide) -> exp(s - max); returns 1 / sum of a row in inv[j]
void exp_rows(float* s, int64_t g, int64_t n, float* inv) {
  for (int64_t j = 0; j < g; ++j) {
    float* row = s + j * n;
    const float m = max_of(row, n);
    v8 sum8 = {};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      v8& x = *reinterpret_cast<v8*>(row + i);
      x = exp8(x - splat(m));
      sum8 += x;
    }
    float sum = hsum(sum8);
    for (; i < n; ++i) {
      row[i] = std::exp(row[i] - m);
      sum += row[i];
    }
    inv[j] = 1.f / sum;
  }
}

// float32: normalised probabilities; bf16 (SDPA's order): unnormalised, rounded to bf16, and
// the 1 / sum applied to the output instead (finish_rows)
template <typename T>
void softmax_rows(float* s, int64_t g, int64_t n, float* inv) {
  exp_rows(s, g, n, inv);
  for (int64_t j = 0; j < g; ++j) {
    float* row = s + j * n;
    int64_t i = 0;
    if constexpr (std::is_same_v<T, float>) {
      for (; i < n; ++i) row[i] *= inv[j];
    } else {
      for (; i + 8 <= n; i += 8) {
        v8& x = *reinterpret_cast<v8*>(row + i);
        x = modelyard::round_bf16(x);
      }
      for (; i < n; ++i) row[i] = static_cast<float>(static_cast<at::BFloat16>(row[i]));
    }
  }
}

template <typename T>
void finish_rows(float* out, int64_t g, int64_t hd, const float* inv) {
  if constexpr (!std::is_same_v<T, float>) {
    for (int64_t j = 0; j < g; ++j) {
      for (int64_t c = 0; c < hd; ++c) out[j * hd + c] *= inv[j];
    }
  }
}

// The paged caches as a decode reads them, for (request, KV head) work items.
template <typename T>
struct PagedKV {
  const T* k;
  const T* v;
  const int64_t* tables;
  const int64_t* lens;
  int64_t nkv, nblocks, bs, hd, nb_max, window;

  PagedKV(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& block_tables,
          const at::Tensor& seq_lens, int64_t window)
      : k(k_cache.data_ptr<T>()),
        v(v_cache.data_ptr<T>()),
        tables(block_tables.data_ptr<int64_t>()),
        lens(seq_lens.data_ptr<int64_t>()),
        nkv(k_cache.size(0)),
        nblocks(k_cache.size(1)),
        bs(k_cache.size(2)),
        hd(k_cache.size(3)),
        nb_max(block_tables.size(1)),
        window(window) {}

  // keys [first, len) of request r
  std::pair<int64_t, int64_t> key_range(int64_t r) const {
    const int64_t len = lens[r];
    return std::make_pair(window > 0 ? std::max<int64_t>(0, len - window) : 0, len);
  }

  // Whether row r attends row r - 1's keys and the one after them through the same blocks: the
  // next row of one prompt chunk, whose K/V row r - 1 (or the step's K/V store) just brought
  // into cache, so prefetching them again only costs instructions (the bulk of a prompt
  // chunk's attention time went to such prefetches)
  bool continues(int64_t r) const {
    if (r == 0 || lens[r] != lens[r - 1] + 1) return false;
    const int64_t* row = tables + r * nb_max;
    return std::equal(row, row + (lens[r - 1] + bs - 1) / bs, row - nb_max);
  }

  // The last block a loop over row r's keys prefetches the next block up to: none (-1) when
  // the row continues the previous one
  int64_t prefetch_until(int64_t r) const { return continues(r) ? -1 : (lens[r] - 1) / bs; }

  // the cache row of block b of request r's table, for KV head h
  int64_t block_row(int64_t r, int64_t h, int64_t b) const {
    return (h * nblocks + tables[r * nb_max + b]) * bs;
  }

  // Each block is its own 4 KiB run, where hardware prefetchers stop, and one block's compute is
  // far shorter than its fetch: so the next item's K/V blocks (up to kPrefetchBytes) are
  // prefetched while this item computes, and blocks past that budget one block ahead.
  void prefetch_item(int64_t item) const {
    const int64_t r = item / nkv, h = item % nkv;
    if (continues(r)) return;
    const auto [first, len] = key_range(r);
    const int64_t budget = kPrefetchBytes / (2 * bs * hd * int64_t(sizeof(T)));
    const int64_t stop = std::min((len - 1) / bs + 1, first / bs + budget);
    for (int64_t b = first / bs; b < stop; ++b) {
      prefetch_rows(k + block_row(r, h, b) * hd, bs * hd);
      prefetch_rows(v + block_row(r, h, b) * hd, bs * hd);
    }
  }

  // the blocks prefetch_item(item) would fetch: [begin, end), none when the row continues
  std::pair<int64_t, int64_t> item_blocks(int64_t item) const {
    const int64_t r = item / nkv;
    if (continues(r)) return {0, 0};
    const auto [first, len] = key_range(r);
    const int64_t budget = kPrefetchBytes / (2 * bs * hd * int64_t(sizeof(T)));
    return {first / bs, std::min((len - 1) / bs + 1, first / bs + budget)};
  }
};

// The following item's K/V lines (what prefetch_item fetches), issued a few at a time while the
// current item computes: issued at once, they fill the core's miss queue and the item waits
// for the fetch before it computes, so the fetch and the arithmetic do not overlap (figures:
// docs/benchmarks.md, "Figures behind choices").
template <typename T>
struct ItemTrickle {
  const PagedKV<T>* kv = nullptr;
  int64_t r = 0, h = 0, block = 0, stop = 0, line = 0, lines_per_block = 0;

  ItemTrickle(const PagedKV<T>& cache, int64_t item) : kv(&cache) {
    if (item < 0) return;
    r = item / cache.nkv;
    h = item % cache.nkv;
    std::tie(block, stop) = cache.item_blocks(item);
    lines_per_block = cache.bs * cache.hd * int64_t(sizeof(T)) / 64;
  }

  // lines left to issue
  int64_t left() const { return (stop - block) * 2 * lines_per_block - line; }

  // lines to issue with each block run of an item over keys [first, len), K and V passes alike
  // (0 where there are none, as after the rows of a prompt chunk)
  int64_t per_run(int64_t first, int64_t len) const {
    if (block >= stop) return 0;
    const int64_t bs = kv->bs, runs = 2 * ((len - 1) / bs - first / bs + 1);
    return (left() + runs - 1) / runs;
  }

  void issue(int64_t lines) {
    for (; lines > 0 && block < stop; --lines) {
      const bool is_k = line < lines_per_block;
      const T* base = (is_k ? kv->k : kv->v) + kv->block_row(r, h, block) * kv->hd;
      const int64_t at = is_k ? line : line - lines_per_block;
      __builtin_prefetch(reinterpret_cast<const char*>(base) + at * 64, 0, 2);
      if (++line == 2 * lines_per_block) {
        line = 0;
        ++block;
      }
    }
  }
};

// What a bf16 decode kernel reads and writes: the caches, the query rows (q, rows q_row apart,
// heads contiguous) and a new (D, nh, hd) output
struct Bf16Decode {
  using bf16 = at::BFloat16;
  PagedKV<bf16> kv;
  int64_t d, nh, hd, q_row;
  at::Tensor out;
  const bf16* q;
  bf16* o;
  float scale;

  Bf16Decode(const at::Tensor& query, const at::Tensor& k_cache, const at::Tensor& v_cache,
             const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale_,
             int64_t window)
      : kv(k_cache, v_cache, block_tables, seq_lens, window),
        d(query.size(0)),
        nh(query.size(1)),
        hd(kv.hd),
        q_row(query.stride(0)),
        out(at::empty({d, nh, hd}, query.options())),
        q(query.data_ptr<bf16>()),
        o(out.data_ptr<bf16>()),
        scale(static_cast<float>(scale_)) {}

  int64_t items() const { return d * kv.nkv; }

  // the first of the g query rows of item (r, h), and of its output rows
  const bf16* query_rows(int64_t r, int64_t h, int64_t g) const {
    return q + r * q_row + h * g * hd;
  }
  bf16* output_rows(int64_t r, int64_t h, int64_t g) const { return o + (r * nh + h * g) * hd; }

  // this item's K/V when it is a thread's first, and the next one's, into L2 ahead of use
  void prefetch(int64_t item, int64_t following, bool opening) const {
    if (opening) kv.prefetch_item(item);
    if (following < items()) kv.prefetch_item(following);
  }
};

// q (D, nh, hd) float32, rows q.stride(0) apart; caches (nkv, NB, bs, hd) of T; block_tables
// (D, nb_max) int64; seq_lens (D,) int64 (keys per request, the query being the last); window
// 0 = none. Returns (D, nh, hd) float32, contiguous.
template <typename T>
at::Tensor decode(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                  const at::Tensor& block_tables, const at::Tensor& seq_lens, double scale,
                  int64_t window) {
  const PagedKV<T> kv(k_cache, v_cache, block_tables, seq_lens, window);
  const int64_t d = q.size(0), nh = q.size(1), hd = kv.hd, nkv = kv.nkv, bs = kv.bs;
  const int64_t g = nh / nkv;
  auto out = at::zeros({d, nh, hd}, q.options());
  const float* qp = q.data_ptr<float>();
  const int64_t q_row = q.stride(0);
  float* op = out.data_ptr<float>();
  const float fscale = static_cast<float>(scale);

  // items are claimed by the threads in turn (claim.h); scores live in a per-thread buffer
  modelyard::for_each_short_unit(d * nkv, [&](int64_t item, int64_t following, bool opening) {
    thread_local std::vector<float> scores, widened;  // widened: one bf16 block as float32
    if (!std::is_same_v<T, float>) widened.resize(static_cast<size_t>(bs * hd));
    alignas(32) float inv[64];  // 1 / softmax sum of each of the g query rows
    if (opening) kv.prefetch_item(item);
    ItemTrickle<T> next(kv, following < d * nkv ? following : -1);
    const int64_t r = item / nkv, h = item % nkv;
    const auto [first, len] = kv.key_range(r);
    const int64_t n = len - first, last_block = kv.prefetch_until(r);
    const int64_t per_run = next.per_run(first, len);
    scores.resize(static_cast<size_t>(g * n));
    const float* qh = qp + r * q_row + h * g * hd;  // the g query rows of this KV head
    // keys come in runs that stay inside one block: contiguous rows
    for (int64_t p = first; p < len;) {
      const int64_t b = p / bs, run = std::min(len, (b + 1) * bs) - p;
      if (b < last_block) prefetch_rows(kv.k + kv.block_row(r, h, b + 1) * hd, bs * hd);
      const float* keys =
          as_float(kv.k + (kv.block_row(r, h, b) + p % bs) * hd, run * hd, widened.data());
      next.issue(per_run);
      block_scores(qh, keys, run, g, hd, fscale, scores.data() + (p - first), n);
      p += run;
    }
    softmax_rows<T>(scores.data(), g, n, inv);
    float* oh = op + (r * nh + h * g) * hd;
    for (int64_t p = first; p < len;) {
      const int64_t b = p / bs, run = std::min(len, (b + 1) * bs) - p;
      if (b < last_block) prefetch_rows(kv.v + kv.block_row(r, h, b + 1) * hd, bs * hd);
      const float* values =
          as_float(kv.v + (kv.block_row(r, h, b) + p % bs) * hd, run * hd, widened.data());
      next.issue(per_run);
      block_values(scores.data() + (p - first), values, run, g, hd, n, oh);
      p += run;
    }
    next.issue(next.left());
    finish_rows<T>(oh, g, hd, inv);
  });
  return out;
}

#if defined(__AVX512BF16__) && defined(__AVX512F__) && defined(__AVX512BW__) && \
    defined(__AVX512VL__)
// bfloat16 on AVX-512 BF16 hosts: `vdpbf16ps` multiplies bf16 pairs exactly and sums them in
// float32, the arithmetic of the widened path without widening anything. Scores: one key row
// against a query row in hd / 32 instructions, then 16 keys' lane sums at once by a transposing
// reduction. Values: two tokens per instruction, their rows interleaved by an unpack (the
// accumulators then hold the columns in unpack order, restored at the end). 30-45 % less time
// than the widened path on the default model's decode step.
#define MODELYARD_DP_ATTENTION 1

// exp16 of vec.h on an AVX-512 register
inline __m512 exp16(__m512 x) {
  const modelyard::v16 y = modelyard::exp16(reinterpret_cast<const modelyard::v16&>(x));
  return reinterpret_cast<const __m512&>(y);
}

// the first min(left, 16) lanes
inline __mmask16 head_mask(int64_t left) {
  return left >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << left) - 1u);
}

// scores s (n) times scale -> exp(s scale - max) rounded to bf16 (SDPA's P) in pb; returns
// 1 / the float32 sum (scale 1 for scores already scaled: a multiply by 1 changes no bits)
inline float exp_probs(const float* s, int64_t n, at::BFloat16* pb, float scale = 1.f) {
  const __m512 f = _mm512_set1_ps(scale);
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 lanes = head_mask(n - i);
    m = _mm512_mask_max_ps(m, lanes, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, s + i), f));
  }
  const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(m));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 lanes = head_mask(n - i);
    const __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(lanes, s + i), f);
    const __m512 e = exp16(_mm512_sub_ps(x, top));
    sum = _mm512_mask_add_ps(sum, lanes, sum, e);
    const modelyard::v16 ev = reinterpret_cast<const modelyard::v16&>(e);  // rounded as SDPA's P
    const modelyard::u32x16 rounded = modelyard::round_bf16x16_bits(ev) >> 16;
    _mm256_mask_storeu_epi16(pb + i, lanes,
                             _mm512_cvtepi32_epi16(reinterpret_cast<const __m512i&>(rounded)));
  }
  return 1.f / _mm512_reduce_add_ps(sum);
}

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

#if defined(__AMX_TILE__) && defined(__AMX_BF16__)
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
#define MODELYARD_AMX_SCORES 1

// palette 1 with tiles 0-7 of these rows and bytes per row
inline void configure_tiles(const std::array<uint8_t, 8>& rows,
                            const std::array<uint16_t, 8>& colsb) {
  struct alignas(64) {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
  } cfg;
  for (size_t t = 0; t < 8; ++t) cfg.colsb[t] = colsb[t], cfg.rows[t] = rows[t];
  _tile_loadconfig(&cfg);
}

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

#if defined(MODELYARD_AMX_SCORES)
// decode_tiles for 1-4 query heads per KV head, else an undefined tensor
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
#endif

// decode_dp where it is instantiated for the shapes (1-4 query heads per KV head, head size 64
// or 128), else an undefined tensor
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
        if (k_cache.size(2) % 16 == 0 && amx_ready()) {
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
#endif

}  // namespace

namespace modelyard::ops {

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache,
                                  const at::Tensor& v_cache, const at::Tensor& block_tables,
                                  const at::Tensor& seq_lens, double scale, int64_t window,
                                  int64_t layout) {
  const auto type = k_cache.scalar_type();
  TORCH_CHECK((type == at::kFloat || type == at::kBFloat16) && q.scalar_type() == type &&
                  v_cache.scalar_type() == type,
              "paged_decode_attention: float32 or bfloat16 q and caches, all of one dtype");
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1 && q.stride(1) == q.size(2) &&
                  k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  block_tables.is_contiguous() && seq_lens.is_contiguous(),
              "paged_decode_attention: contiguous tensors only (q: contiguous heads, any row "
              "stride)");
  const int64_t d = q.size(0), nh = q.size(1), hd = q.size(2);
  const int64_t nkv = k_cache.size(0), nblocks = k_cache.size(1), bs = k_cache.size(2);
  const int64_t nb_max = block_tables.size(1);
  TORCH_CHECK(nh % nkv == 0 && nh / nkv <= 64 && k_cache.size(3) == hd && hd % 8 == 0,
              "paged_decode_attention: bad shapes");
  const int64_t* tables = block_tables.data_ptr<int64_t>();
  const int64_t* lens = seq_lens.data_ptr<int64_t>();
  for (int64_t r = 0; r < d; ++r) {
    TORCH_CHECK(lens[r] >= 1 && lens[r] <= nb_max * bs, "paged_decode_attention: bad seq_len");
    for (int64_t b = 0; b < (lens[r] + bs - 1) / bs; ++b) {
      const int64_t block = tables[r * nb_max + b];
      TORCH_CHECK(block >= 0 && block < nblocks, "paged_decode_attention: bad block id");
    }
  }
  TORCH_CHECK(layout == 0 || layout == 1, "paged_decode_attention: layout 0 (plain) or 1 (tiles)");
  if (layout == 1) {
    at::Tensor out;
#if defined(MODELYARD_AMX_SCORES)
    if (type == at::kBFloat16 && hd == 64 && bs % 16 == 0 && amx_ready()) {
      out = try_decode_tiles(q, k_cache, v_cache, block_tables, seq_lens, scale, window);
    }
#endif
    TORCH_CHECK(out.defined(), "paged_decode_attention: the tile layout needs bfloat16, head size "
                "64, a block size that is a multiple of 16, 1-4 query heads per KV head and AMX");
    return out;
  }
  if (type == at::kFloat) {
    return decode<float>(q, k_cache, v_cache, block_tables, seq_lens, scale, window);
  }
#if defined(MODELYARD_DP_ATTENTION)
  auto dp = try_decode_dp(q, k_cache, v_cache, block_tables, seq_lens, scale, window);
  if (dp.defined()) return dp;
#endif
  // bf16 elsewhere: float32 queries (exact), the float32 result rounded to bf16 once at the end
  return decode<at::BFloat16>(q.to(at::kFloat), k_cache, v_cache, block_tables, seq_lens, scale,
                              window)
      .to(at::kBFloat16);
}

}  // namespace modelyard::ops
