// sample_rows: one token per row of logits drawn from softmax(logits * inv_temperature), for the
// rows of a step that sample with no top-k / top-p / min-p filter (the OpenAI default:
// temperature 1). torch's softmax + cumsum + searchsorted take several passes and temporaries
// over a (32, 49152) batch (~5-9 ms on two cores); here three passes over each row in place:
//   1. m = the row's maximum;
//   2. e_j = exp((x_j - m) * inv_t) summed per chunk of kChunk tokens (chunk sums kept);
//   3. target = u x the total (the chunk sums added in order, in double); the first chunk whose
//      running sum passes the target is walked token by token, its e_j recomputed the same way,
//      to the first token whose running sum passes it.
// A token whose scaled logit is more than 87 below the maximum (exp < 1.6e-38, and -inf for
// masked tokens) has probability exactly 0 and is never drawn. A row whose maximum is not
// finite (all -inf, +inf or NaN) gives its first maximum, as argmax would.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "claim.h"
#include "ops.h"
#include "rows.h"
#include "vec.h"

using namespace modelyard::ops;  // (the op this file defines at its end, ops.h)

namespace {

using modelyard::load8;
using modelyard::splat;
using modelyard::v8;
using bf16 = at::BFloat16;

constexpr int64_t kChunk = 512;  // tokens per chunk sum (a multiple of 8)

// 8 logits from x (n of them valid, the rest as -inf)
template <typename T>
inline v8 load_tail(const T* x, int64_t n) {
  v8 v = splat(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < n; ++j) v[j] = static_cast<float>(x[j]);
  return v;
}

// exp((v - m) * inv_t) per lane, exactly 0 where the scaled difference is below -87
inline v8 weights8(v8 v, float m, float inv_t) {
  const v8 z = (v - splat(m)) * splat(inv_t);
  const v8 e = modelyard::exp8(z);
  return z < splat(-87.f) ? splat(0.f) : e;
}

// the weights of tokens [begin, end) (a chunk) into out
template <typename T>
void chunk_weights(const T* x, int64_t begin, int64_t end, float m, float inv_t, float* out) {
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    *reinterpret_cast<v8*>(out + (i - begin)) = weights8(load8(x + i), m, inv_t);
  }
  if (i < end) {
    const v8 w = weights8(load_tail(x + i, end - i), m, inv_t);
    for (int64_t j = 0; j < end - i; ++j) out[i - begin + j] = w[j];
  }
}

template <typename T>
int64_t sample_row(const T* x, int64_t n, float inv_t, double u) {
  const float m = modelyard::row_max(x, n);
  if (!std::isfinite(m)) return modelyard::first_index_of(x, n, m);
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  thread_local std::vector<float> sums, w;
  sums.resize(static_cast<size_t>(chunks));
  w.resize(static_cast<size_t>(kChunk));
  double total = 0.0;
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t begin = c * kChunk, end = std::min(n, begin + kChunk);
    chunk_weights(x, begin, end, m, inv_t, w.data());
    v8 acc = splat(0.f);
    int64_t j = 0;
    for (; j + 8 <= end - begin; j += 8) acc += load8(w.data() + j);
    float s = modelyard::hsum(acc);
    for (; j < end - begin; ++j) s += w[j];
    sums[c] = s;
    total += s;
  }
  const double target = u * total;  // < total: u < 1
  double running = 0.0;
  int64_t last = 0;  // the last token of positive weight seen (rounding fallback)
  for (int64_t c = 0; c < chunks; ++c) {
    if (sums[c] <= 0.f) continue;
    const int64_t begin = c * kChunk, end = std::min(n, begin + kChunk);
    if (running + sums[c] <= target && c + 1 < chunks) {
      running += sums[c];
      continue;
    }
    chunk_weights(x, begin, end, m, inv_t, w.data());
    for (int64_t j = 0; j < end - begin; ++j) {
      if (w[j] <= 0.f) continue;
      last = begin + j;
      running += w[j];
      if (running > target) return last;
    }
  }
  return last;
}

}  // namespace

namespace modelyard::ops {

// logits (R, V) float32 or bfloat16, contiguous; inv_temperature (R,) float32; uniform (R,)
// float64 in [0, 1) -> (R,) int64 tokens
at::Tensor sample_rows(const at::Tensor& logits, const at::Tensor& inv_temperature,
                       const at::Tensor& uniform) {
  TORCH_CHECK((logits.scalar_type() == at::kFloat || logits.scalar_type() == at::kBFloat16) &&
                  logits.dim() == 2 && logits.is_contiguous() && logits.size(1) > 0,
              "sample_rows: contiguous float32 or bfloat16 (R, V) logits");
  const int64_t rows = logits.size(0), n = logits.size(1);
  TORCH_CHECK(inv_temperature.scalar_type() == at::kFloat && inv_temperature.is_contiguous() &&
                  inv_temperature.numel() == rows,
              "sample_rows: inv_temperature is float32 (R,)");
  TORCH_CHECK(uniform.scalar_type() == at::kDouble && uniform.is_contiguous() &&
                  uniform.numel() == rows,
              "sample_rows: uniform is float64 (R,)");
  auto out = at::empty({rows}, logits.options().dtype(at::kLong));
  int64_t* op = out.data_ptr<int64_t>();
  const float* tp = inv_temperature.data_ptr<float>();
  const double* up = uniform.data_ptr<double>();
  auto run = [&](const auto* xp) {
    modelyard::parallel_chunks(rows, 1, 1, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) op[r] = sample_row(xp + r * n, n, tp[r], up[r]);
    });
  };
  if (logits.scalar_type() == at::kFloat) {
    run(logits.data_ptr<float>());
  } else {
    run(logits.data_ptr<bf16>());
  }
  return out;
}

}  // namespace modelyard::ops
