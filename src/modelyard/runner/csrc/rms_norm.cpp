// RMSNorm on CPU, fused (float32 or bfloat16): one pass per row where torch takes 3-8 ops (cast,
// pow, mean, add, rsqrt, mul, cast, mul), each a dispatch, an allocation and a pass over the rows.
//   rms_norm       y = w * (x / sqrt(mean(x^2) + eps))                    (HF LlamaRMSNorm)
//   add_rms_norm   x += delta in place, then rms_norm(x)                  (residual + norm)
//   mean_squares   the float32 mean of squares of each bf16 row
// In bfloat16 the residual sum is rounded where torch rounds it. A bf16 RMSNorm's result hangs on
// the float32 mean of squares, so that one reduction is torch's own (a one-ulp difference in it
// shifts a bf16 value now and then, and over 30 layers such shifts tip near-ties of greedy
// decoding): either torch's own (one more dispatch and pass per norm) or, where
// kernels.torch_sum_width() found it reproduced bit for bit, torch_sum_squares below.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "claim.h"
#include "fused_rows.h"
#include "ops.h"

using namespace modelyard::ops;  // (the ops this file defines at its end, ops.h)

namespace {

using namespace modelyard::fused;  // (fused_rows.h)

void norm_row(const float* x, const float* w, float* y, int64_t h, float eps) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t i = 0; i < h; ++i) sum += x[i] * x[i];
  const float r = 1.f / std::sqrt(sum / static_cast<float>(h) + eps);
#pragma omp simd
  for (int64_t i = 0; i < h; ++i) y[i] = w[i] * (x[i] * r);
}

// ATen's utils::CeilLog2
inline int64_t ceil_log2(int64_t x) {
  if (x <= 2) return 1;
  int64_t bits = 0;
  for (uint64_t v = static_cast<uint64_t>(x) - 1; v != 0; v >>= 1) ++bits;
  return bits;
}

// W floats, added lane by lane: one Vectorized<float> of ATen's
template <int W>
struct Lanes {
  float v[W] = {};
  Lanes& operator+=(const Lanes& o) {
    for (int l = 0; l < W; ++l) v[l] += o.v[l];
    return *this;
  }
};

// torch's x.float().pow(2).sum() over one contiguous row of h values, in the order of ATen's
// cascade sum (SumKernel.cpp, vectorized_inner_sum): vectors of W floats (torch's
// Vectorized<float> on this host), read as rows of 4 with 4 partial sums, each summed in chunks
// of 2^level_power over up to 4 levels; leftover vectors into the first partial sum; the 4 partials
// added in order; then the leftover scalars and the W lanes, in order, into one float.
// sq: room for h floats.
template <int W>
float torch_sum_squares(const bf16* x, int64_t h, float* sq) {
  for (int64_t e = 0; e < h; ++e) sq[e] = static_cast<float>(x[e]) * static_cast<float>(x[e]);
  // torch's pow(2) and sum are two ops: each square is a rounded float in memory before it is
  // added (the barrier keeps the compiler from fusing them into multiply-adds)
  asm volatile("" ::: "memory");
  auto load = [sq](int64_t vec) {
    Lanes<W> out;
    for (int l = 0; l < W; ++l) out.v[l] = sq[vec * W + l];
    return out;
  };
  constexpr int kLevels = 4, kIlp = 4;
  const int64_t vectors = h / W, rows = vectors / kIlp;
  const int64_t power = std::max<int64_t>(4, ceil_log2(rows) / kLevels);
  const int64_t step = int64_t(1) << power, mask = step - 1;
  Lanes<W> acc[kLevels][kIlp];
  int64_t i = 0;
  while (i + step <= rows) {
    for (int64_t j = 0; j < step; ++j, ++i) {
      for (int k = 0; k < kIlp; ++k) acc[0][k] += load(i * kIlp + k);
    }
    for (int j = 1; j < kLevels; ++j) {
      for (int k = 0; k < kIlp; ++k) {
        acc[j][k] += acc[j - 1][k];
        acc[j - 1][k] = Lanes<W>{};
      }
      if ((i & (mask << (j * power))) != 0) break;
    }
  }
  for (; i < rows; ++i) {
    for (int k = 0; k < kIlp; ++k) acc[0][k] += load(i * kIlp + k);
  }
  for (int j = 1; j < kLevels; ++j) {
    for (int k = 0; k < kIlp; ++k) acc[0][k] += acc[j][k];
  }
  for (int64_t v = rows * kIlp; v < vectors; ++v) acc[0][0] += load(v);
  for (int k = 1; k < kIlp; ++k) acc[0][0] += acc[0][k];
  float total = 0.f;
  for (int64_t e = vectors * W; e < h; ++e) total += sq[e];
  for (int l = 0; l < W; ++l) total += acc[0][0].v[l];
  return total;
}

// the mean of squares of one bf16 row in torch's order (sum_width 8 or 16; sq: room for h)
float row_mean_squares(const bf16* row, int64_t h, int64_t sum_width, float* sq) {
  // rows shorter than one vector: ATen's scalar cascade (the same order on 1-wide vectors)
  const float sum = h < sum_width       ? torch_sum_squares<1>(row, h, sq)
                    : sum_width == 16   ? torch_sum_squares<16>(row, h, sq)
                                        : torch_sum_squares<8>(row, h, sq);
  return sum / static_cast<float>(h);  // torch's mean: the sum, then a true division
}

// y = w * (x * inv) over one bf16 row, x * inv rounded to bf16 first (HF's cast), then the
// product rounded (plain loops: the compiler vectorizes them at the host's full width)
void scale_row_bf16(const bf16* x, const bf16* w, float inv, bf16* y, int64_t h) {
  for (int64_t i = 0; i < h; ++i) {
    y[i] = static_cast<bf16>(static_cast<float>(w[i]) * bf(static_cast<float>(x[i]) * inv));
  }
}

// x += delta over one bf16 row as torch's bf16 add rounds it (float32 sum, then to bf16)
void add_row_bf16(bf16* x, const bf16* delta, int64_t h) {
  for (int64_t i = 0; i < h; ++i) {
    x[i] = static_cast<bf16>(static_cast<float>(x[i]) + static_cast<float>(delta[i]));
  }
}

// bfloat16 RMSNorm with torch's bits, as HF computes it: w * (x.float() * rsqrt(mean(x.float()^2)
// + eps)).to(bf16), with delta (if given) first added to x in place. The result hangs on the
// float32 mean of squares: torch's own reduction where its order was not reproduced (sum_width
// 0), then a pass to scale; else one pass per row chunk: add, mean of squares, scale.
at::Tensor rms_norm_bf16(const at::Tensor& x, const at::Tensor& weight, double eps,
                         int64_t sum_width, const bf16* delta = nullptr) {
  const int64_t t = x.size(0), h = x.size(1);
  bf16* xp = static_cast<bf16*>(x.data_ptr());
  const bf16* wp = weight.data_ptr<bf16>();
  const float feps = static_cast<float>(eps);  // torch adds the Python float as a float32
  auto y = at::empty_like(x);
  bf16* yp = y.data_ptr<bf16>();
  // one long row on several threads: torch splits its sum across them (another order)
  const bool split = t == 1 && h >= at::internal::GRAIN_SIZE && at::get_num_threads() > 1;
  if (sum_width == 0 || split) {
    if (delta != nullptr) {
      modelyard::parallel_chunks(t, row_grain(h), kRowsPerChunk, [&](int64_t begin, int64_t end) {
        for (int64_t r = begin; r < end; ++r) add_row_bf16(xp + r * h, delta + r * h, h);
      });
    }
    const at::Tensor var = mean_squares(x, sum_width);
    const float* vp = var.data_ptr<float>();
    modelyard::parallel_chunks(t, row_grain(h), kRowsPerChunk, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        scale_row_bf16(xp + r * h, wp, 1.f / std::sqrt(vp[r] + feps), yp + r * h, h);
      }
    });
    return y;
  }
  modelyard::parallel_chunks(t, row_grain(h), kRowsPerChunk, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> squares;
    squares.resize(static_cast<size_t>(h));
    for (int64_t r = begin; r < end; ++r) {
      bf16* row = xp + r * h;
      if (delta != nullptr) add_row_bf16(row, delta + r * h, h);
      const float var = row_mean_squares(row, h, sum_width, squares.data());
      scale_row_bf16(row, wp, 1.f / std::sqrt(var + feps), yp + r * h, h);
    }
  });
  return y;
}

}  // namespace

namespace modelyard::ops {

// the mean of squares of each bf16 row: torch's reduction (sum_width 0) or its order reproduced
at::Tensor mean_squares(const at::Tensor& x, int64_t sum_width) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.is_contiguous(),
              "mean_squares: contiguous bfloat16 (T, H) only");
  TORCH_CHECK(sum_width == 0 || sum_width == 8 || sum_width == 16,
              "mean_squares: sum_width is 0, 8 or 16");
  const int64_t t = x.size(0), h = x.size(1);
  // one long row on several threads: torch splits its sum across them (another order)
  const bool split = t == 1 && h >= at::internal::GRAIN_SIZE && at::get_num_threads() > 1;
  if (sum_width == 0 || split) return x.to(at::kFloat).pow(2).mean(-1);
  auto out = at::empty({t}, x.options().dtype(at::kFloat));
  const bf16* xp = x.data_ptr<bf16>();
  float* op = out.data_ptr<float>();
  modelyard::parallel_chunks(t, row_grain(h), kRowsPerChunk, [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> squares;
    squares.resize(static_cast<size_t>(h));
    for (int64_t r = begin; r < end; ++r) {
      op[r] = row_mean_squares(xp + r * h, h, sum_width, squares.data());
    }
  });
  return out;
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps,
                    int64_t sum_width) {
  if (x.scalar_type() == at::kBFloat16) {
    check_rows(x, {weight}, "rms_norm");
    TORCH_CHECK(weight.numel() == x.size(1), "rms_norm: weight must be (H,)");
    return rms_norm_bf16(x, weight, eps, sum_width);
  }
  check_float_rows(x, "rms_norm");
  const int64_t t = x.size(0), h = x.size(1);
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == h, "rms_norm: weight must be (H,)");
  auto y = at::empty_like(x);
  const float* xp = x.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  modelyard::parallel_chunks(t, row_grain(h), kRowsPerChunk, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) norm_row(xp + r * h, wp, yp + r * h, h, eps);
  });
  return y;
}

at::Tensor add_rms_norm(at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight,
                        double eps, int64_t sum_width) {
  if (x.scalar_type() == at::kBFloat16) {  // x += delta (torch's bf16 add), then the norm
    check_rows(x, {delta, weight}, "add_rms_norm");
    TORCH_CHECK(delta.sizes() == x.sizes() && weight.numel() == x.size(1),
                "add_rms_norm: bad shapes");
    return rms_norm_bf16(x, weight, eps, sum_width, delta.data_ptr<bf16>());
  }
  check_float_rows(x, "add_rms_norm");
  check_float_rows(delta, "add_rms_norm");
  TORCH_CHECK(delta.sizes() == x.sizes(), "add_rms_norm: x and delta differ in shape");
  const int64_t t = x.size(0), h = x.size(1);
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == h, "add_rms_norm: weight must be (H,)");
  auto y = at::empty_like(x);
  float* xp = x.data_ptr<float>();
  const float* dp = delta.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  modelyard::parallel_chunks(t, row_grain(h), kRowsPerChunk, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* row = xp + r * h;
#pragma omp simd
      for (int64_t i = 0; i < h; ++i) row[i] += dp[r * h + i];
      norm_row(row, wp, yp + r * h, h, eps);
    }
  });
  return y;
}

}  // namespace modelyard::ops
