// Decode attention straight from the paged KV cache (float32, CPU).
//
// One query token per request; the g = nh / nkv query heads that share a KV head are computed
// together, so each key and value row is read once from the cache, in place: no gather of the
// request's blocks into a contiguous copy first (that copy was the step's largest memory cost).
// Work items are (request, KV head) pairs split across the ATen thread pool. Two passes per
// item: scores for every allowed key, then softmax and the weighted sum of values. Keys come in
// runs of consecutive rows inside one block; the inner loops work on 8-float vectors.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace {

// 8 floats: one AVX register where the host has AVX, otherwise whatever the compiler makes of it.
typedef float v8 __attribute__((vector_size(32), aligned(4)));

inline float hsum(v8 x) {
  return ((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7]));
}

// Scores of the g query rows q (g, hd) against n consecutive key rows k (n, hd), scaled, into
// s[j * stride + t]. hd is a multiple of 8.
inline void block_scores(const float* q, const float* k, int64_t n, int64_t g, int64_t hd,
                         float scale, float* s, int64_t stride) {
  const int64_t chunks = hd / 8;
  for (int64_t t = 0; t < n; ++t) {
    const v8* key = reinterpret_cast<const v8*>(k + t * hd);
    for (int64_t j = 0; j < g; ++j) {
      const v8* qj = reinterpret_cast<const v8*>(q + j * hd);
      v8 acc0 = key[0] * qj[0], acc1 = key[1] * qj[1];
      for (int64_t c = 2; c + 1 < chunks; c += 2) {
        acc0 += key[c] * qj[c];
        acc1 += key[c + 1] * qj[c + 1];
      }
      s[j * stride + t] = hsum(acc0 + acc1) * scale;
    }
  }
}

// out (g, hd) += sum over t of p[j * stride + t] * v[t] for n consecutive value rows v (n, hd).
inline void block_values(const float* p, const float* v, int64_t n, int64_t g, int64_t hd,
                         int64_t stride, float* out) {
  // one 8-float column chunk at a time, summed in registers over the n rows (two chains):
  // accumulating into `out` row by row would chain every add through a store and a load
  const int64_t chunks = hd / 8;
  for (int64_t j = 0; j < g; ++j) {
    const float* w = p + j * stride;
    v8* o = reinterpret_cast<v8*>(out + j * hd);
    for (int64_t c = 0; c < chunks; ++c) {
      v8 acc0 = o[c], acc1 = {};
      int64_t t = 0;
      for (; t + 1 < n; t += 2) {
        acc0 += w[t] * *reinterpret_cast<const v8*>(v + t * hd + c * 8);
        acc1 += w[t + 1] * *reinterpret_cast<const v8*>(v + (t + 1) * hd + c * 8);
      }
      if (t < n) acc0 += w[t] * *reinterpret_cast<const v8*>(v + t * hd + c * 8);
      o[c] = acc0 + acc1;
    }
  }
}

inline void prefetch_rows(const float* x, int64_t count) {
  for (int64_t i = 0; i < count; i += 16) __builtin_prefetch(x + i, 0, 3);  // 64-byte lines
}

void softmax_rows(float* s, int64_t g, int64_t n) {
  for (int64_t j = 0; j < g; ++j) {
    float* row = s + j * n;
    const float m = *std::max_element(row, row + n);
    float sum = 0.f;
    for (int64_t i = 0; i < n; ++i) {
      row[i] = std::exp(row[i] - m);
      sum += row[i];
    }
    const float inv = 1.f / sum;
    for (int64_t i = 0; i < n; ++i) row[i] *= inv;
  }
}

// q (D, nh, hd); caches (nkv, NB, bs, hd); block_tables (D, nb_max) int64; seq_lens (D,) int64
// (keys per request, the query being the last); window 0 = none. Returns (D, nh, hd).
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache,
                                  const at::Tensor& v_cache, const at::Tensor& block_tables,
                                  const at::Tensor& seq_lens, double scale, int64_t window) {
  TORCH_CHECK(q.scalar_type() == at::kFloat && k_cache.scalar_type() == at::kFloat &&
                  v_cache.scalar_type() == at::kFloat,
              "paged_decode_attention: float32 only");
  TORCH_CHECK(q.is_contiguous() && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  block_tables.is_contiguous() && seq_lens.is_contiguous(),
              "paged_decode_attention: contiguous tensors only");
  const int64_t d = q.size(0), nh = q.size(1), hd = q.size(2);
  const int64_t nkv = k_cache.size(0), nblocks = k_cache.size(1), bs = k_cache.size(2);
  const int64_t g = nh / nkv, nb_max = block_tables.size(1);
  TORCH_CHECK(nh % nkv == 0 && k_cache.size(3) == hd && hd % 16 == 0,
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
  auto out = at::zeros_like(q);
  const float* qp = q.data_ptr<float>();
  const float* kp = k_cache.data_ptr<float>();
  const float* vp = v_cache.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float fscale = static_cast<float>(scale);

  at::parallel_for(0, d * nkv, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t r = item / nkv, h = item % nkv, len = lens[r];
      const int64_t first = window > 0 ? std::max<int64_t>(0, len - window) : 0;
      const int64_t n = len - first;
      scores.resize(static_cast<size_t>(g * n));
      const float* qh = qp + (r * nh + h * g) * hd;  // the g query rows of this KV head
      const int64_t* table = tables + r * nb_max;
      // keys [first, len) come in runs that stay inside one block: contiguous rows. Each block
      // is its own few pages, where hardware prefetchers stop: the next block is prefetched.
      const int64_t last_block = (len - 1) / bs;
      auto block_row = [&](int64_t b) { return (h * nblocks + table[b]) * bs; };
      for (int64_t p = first; p < len;) {
        const int64_t b = p / bs, run = std::min(len, (b + 1) * bs) - p;
        if (b < last_block) prefetch_rows(kp + block_row(b + 1) * hd, bs * hd);
        block_scores(qh, kp + (block_row(b) + p % bs) * hd, run, g, hd, fscale,
                     scores.data() + (p - first), n);
        p += run;
      }
      if (first / bs <= last_block) prefetch_rows(vp + block_row(first / bs) * hd, bs * hd);
      softmax_rows(scores.data(), g, n);
      float* oh = op + (r * nh + h * g) * hd;
      for (int64_t p = first; p < len;) {
        const int64_t b = p / bs, run = std::min(len, (b + 1) * bs) - p;
        if (b < last_block) prefetch_rows(vp + block_row(b + 1) * hd, bs * hd);
        block_values(scores.data() + (p - first), vp + (block_row(b) + p % bs) * hd, run, g, hd,
                     n, oh);
        p += run;
      }
    }
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(modelyard_kernels, m) {
  m.def(
      "paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
      "Tensor seq_lens, float scale, int window) -> Tensor");
  m.impl("paged_decode_attention", c10::DispatchKey::CPU, &paged_decode_attention);
}
