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
// rounded to bf16. On AVX-512 BF16 hosts the common shapes skip the widening (decode_dp.cpp);
// on AMX hosts its scores run on tiles, and a cache in the tile layout (runner.kv_layout) has
// both products on tiles (decode_tiles.cpp). The cache and its prefetches: paged_kv.h.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "attention_bf16.h"
#include "claim.h"
#include "ops.h"
#include "paged_kv.h"
#include "vec.h"

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

namespace modelyard::attention {
namespace {

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

}  // namespace
}  // namespace modelyard::attention

namespace modelyard::ops {

at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache,
                                  const at::Tensor& v_cache, const at::Tensor& block_tables,
                                  const at::Tensor& seq_lens, double scale, int64_t window,
                                  int64_t layout) {
  attention::check_operands(q, k_cache, v_cache, block_tables, seq_lens);
  const auto type = k_cache.scalar_type();
  TORCH_CHECK(layout == 0 || layout == 1, "paged_decode_attention: layout 0 (plain) or 1 (tiles)");
  if (layout == 1) {
    at::Tensor out;
#if defined(MODELYARD_AMX_SCORES)
    if (type == at::kBFloat16 && q.size(2) == 64 && k_cache.size(2) % 16 == 0 && amx_ready()) {
      out = attention::try_decode_tiles(q, k_cache, v_cache, block_tables, seq_lens, scale, window);
    }
#endif
    TORCH_CHECK(out.defined(), "paged_decode_attention: the tile layout needs bfloat16, head size "
                "64, a block size that is a multiple of 16, 1-4 query heads per KV head and AMX");
    return out;
  }
  if (type == at::kFloat) {
    return attention::decode<float>(q, k_cache, v_cache, block_tables, seq_lens, scale, window);
  }
#if defined(MODELYARD_DP_ATTENTION)
  auto dp = attention::try_decode_dp(q, k_cache, v_cache, block_tables, seq_lens, scale, window);
  if (dp.defined()) return dp;
#endif
  // bf16 elsewhere: float32 queries (exact), the float32 result rounded to bf16 once at the end
  return attention::decode<at::BFloat16>(q.to(at::kFloat), k_cache, v_cache, block_tables,
                                         seq_lens, scale, window)
      .to(at::kBFloat16);
}

}  // namespace modelyard::ops
