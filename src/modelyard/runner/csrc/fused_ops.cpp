// The element-wise steps of a Llama decoder layer, fused (float32 or bfloat16, CPU).
//
// In torch each of these is 3-8 ops (RMSNorm alone is cast, pow, mean, add, rsqrt, mul, cast,
// mul), each a dispatch, an allocation and a pass over the rows; at decode sizes (32 rows of 576)
// that overhead, not arithmetic, is the cost. Each op here is one pass, rows split across the
// ATen thread pool only when there are enough of them to pay for the wake-up.
//   rms_norm       y = w * (x / sqrt(mean(x^2) + eps))                    (HF LlamaRMSNorm)
//   add_rms_norm   x += delta in place, then rms_norm(x)                  (residual + norm)
//   rope_store     rotate-half RoPE on the q and k heads of the fused qkv rows in place, then
//                  write the step's k and v rows into their paged-cache slots (plain rows, or
//                  the tile layout of AMX hosts: store_tile_layout)
//   argmax_rows    torch.argmax(x, -1) for greedy sampling (the first maximum; a NaN counts as
//                  the maximum, as in torch): a vector max, then a scan for its first index
//   silu_mul       bfloat16 SwiGLU activation: silu(gate) * up for (T, 2I) rows [gate | up]
//                  (float32 applies it inside the GEMM: csrc/gemm.cpp)
// Each also takes bfloat16, rounding where the torch ops of HF's Llama do (float32 inside one op,
// a bf16 result out of it), so it gives torch's bits: the residual sum; each RoPE product before
// their sum; silu(gate) before its product with up. A bf16 RMSNorm's result hangs on the float32
// mean of squares, so that one reduction is torch's own (a one-ulp difference in it shifts a
// bf16 value now and then, and over 30 layers such shifts tip near-ties of greedy decoding).
// That reduction is either torch's own (one more dispatch and pass per norm) or, where
// kernels.torch_sum_width() found it reproduced bit for bit, torch_sum_squares below.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <type_traits>
#include <vector>

#include "claim.h"
#include "ops.h"
#include "rows.h"
#include "vec.h"

using namespace modelyard::ops;  // (the ops this file defines at its end, ops.h)

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

using modelyard::splat;
using modelyard::v8;

// Below this many elements per task a pass runs inline: waking the second thread (passive OpenMP
// waits) costs ~20-25 us, so a decode step's SwiGLU (32 x 2 x 1536) takes ~40 us on one thread
// and ~55 us on two.
constexpr int64_t kElementsPerTask = 1 << 17;

// Inside a decode step (claim.h's Team) passes split into chunks of this many rows.
constexpr int64_t kRowsPerChunk = 4;

int64_t row_grain(int64_t row_elements) {
  return std::max<int64_t>(1, kElementsPerTask / std::max<int64_t>(1, row_elements));
}

using bf16 = at::BFloat16;

void check_float_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(), name,
              ": contiguous float32 (T, H) only");
}

// float32 or bfloat16 rows, and every other tensor of the op in the same dtype
void check_rows(const at::Tensor& x, std::initializer_list<at::Tensor> same, const char* name) {
  const auto type = x.scalar_type();
  TORCH_CHECK((type == at::kFloat || type == at::kBFloat16) && x.dim() == 2 && x.is_contiguous(),
              name, ": contiguous float32 or bfloat16 (T, H) only");
  for (const auto& t : same) {
    TORCH_CHECK(t.scalar_type() == type && t.is_contiguous(), name,
                ": contiguous tensors of one dtype only");
  }
}

// to bf16 with round-to-nearest-even and back: where a bf16 torch op stores its result
inline float bf(float x) { return static_cast<float>(static_cast<bf16>(x)); }

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

// one head x (hd) rotated in place: x1' = x1 c1 + x2 s1, x2' = x2 c2 + x1 s2 (s = signed sin);
// in bf16 each product is rounded, then their sum (HF: q * cos + rotate_half(q) * sin)
template <typename T>
inline void rotate(T* x, const T* c, const T* s, int64_t half) {
  int64_t i = 0;
  if constexpr (!std::is_same_v<T, float>) {
    using modelyard::load_bf16, modelyard::round_bf16, modelyard::store_bf16;
    for (; i + 8 <= half; i += 8) {
      const v8 a = load_bf16(x + i), b = load_bf16(x + i + half);
      store_bf16(x + i, round_bf16(a * load_bf16(c + i)) + round_bf16(b * load_bf16(s + i)));
      store_bf16(x + i + half, round_bf16(b * load_bf16(c + i + half)) +
                                   round_bf16(a * load_bf16(s + i + half)));
    }
  }
  for (; i < half; ++i) {
    if constexpr (std::is_same_v<T, float>) {
      const float a = x[i], b = x[i + half];
      x[i] = a * c[i] + b * s[i];
      x[i + half] = b * c[i + half] + a * s[i + half];
    } else {
      const float a = x[i], b = x[i + half];
      x[i] = static_cast<T>(bf(a * static_cast<float>(c[i])) + bf(b * static_cast<float>(s[i])));
      x[i + half] = static_cast<T>(bf(b * static_cast<float>(c[i + half])) +
                                   bf(a * static_cast<float>(s[i + half])));
    }
  }
}

// The tile layout of a KV cache (runner.kv_layout.KV_TILES): within each (bs, hd) block of
// one KV head, K as (hd / 2, bs, 2), the pairs of head dims of each key side by side per dim
// pair, and V as (bs / 2, hd, 2), the values of each pair of keys side by side per dim: the B
// operands of AMX tile multiplies (csrc/decode_tiles.cpp), read in place. slot_row: the row of
// the (nkv * NB * bs, hd) cache view the key would take in the plain layout.
constexpr int64_t kTileLayout = 1;

template <typename T>
void store_tile_layout(const T* k, const T* v, T* kc, T* vc, int64_t slot_row, int64_t bs,
                       int64_t hd) {
  const int64_t o = slot_row % bs, block = (slot_row - o) * hd;
  T* kb = kc + block;
  T* vb = vc + block + (o / 2 * hd) * 2 + o % 2;
  for (int64_t p = 0; p < hd / 2; ++p) {
    kb[(p * bs + o) * 2] = k[2 * p];
    kb[(p * bs + o) * 2 + 1] = k[2 * p + 1];
  }
  for (int64_t d = 0; d < hd; ++d) vb[2 * d] = v[d];
}

template <typename T>
void rope_store_rows(at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& signed_sin,
                     const int64_t* pos, at::Tensor& k_cache, at::Tensor& v_cache,
                     const int64_t* slot, int64_t num_heads, int64_t layout) {
  const int64_t t = qkv.size(0), nkv = k_cache.size(0), bs = k_cache.size(2), hd = k_cache.size(3);
  const int64_t cache_slots = k_cache.size(1) * bs;
  const int64_t width = qkv.size(1), rotated = num_heads + nkv, half = hd / 2;
  T* qp = qkv.data_ptr<T>();
  const T* cp = cos.data_ptr<T>();
  const T* sp = signed_sin.data_ptr<T>();
  T* kc = k_cache.data_ptr<T>();
  T* vc = v_cache.data_ptr<T>();
  modelyard::parallel_chunks(t, row_grain(width), kRowsPerChunk, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      T* row = qp + r * width;
      for (int64_t head = 0; head < rotated; ++head) {
        rotate(row + head * hd, cp + pos[r] * hd, sp + pos[r] * hd, half);
      }
      for (int64_t h = 0; h < nkv; ++h) {
        const T* k = row + (num_heads + h) * hd;
        const T* v = row + (num_heads + nkv + h) * hd;
        if (layout == kTileLayout) {
          store_tile_layout(k, v, kc, vc, h * cache_slots + slot[r], bs, hd);
          continue;
        }
        const int64_t dst = (h * cache_slots + slot[r]) * hd;
        std::copy(k, k + hd, kc + dst);
        std::copy(v, v + hd, vc + dst);
      }
    }
  });
}

// x (T, 2I) bfloat16 rows [gate | up] -> (T, I): silu(gate) rounded to bf16, times up, rounded
// (HF: act_fn(gate_proj(x)) * up_proj(x), two bf16 ops); silu(g) = g / (1 + exp(-g))
#if defined(__AVX512F__)
// The 8-lane loop of silu_mul on 16 lanes (vec.h's silu_times): one AVX-512 register.
inline void silu_mul16(const bf16* gate, const bf16* up, bf16* y) {
  modelyard::store_bf16x16(
      y, modelyard::silu_times(modelyard::load_bf16x16(gate), modelyard::load_bf16x16(up)));
}
#endif

// T is float or bf16 (widened exactly, so the bf16 logits' argmax is that of their float copy)
template <typename T>
int64_t argmax_row(const T* x, int64_t n) {
  return modelyard::first_index_of(x, n, modelyard::row_max(x, n));
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

at::Tensor silu_mul(const at::Tensor& x) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() == 2 && x.is_contiguous() &&
                  x.size(1) % 2 == 0,
              "silu_mul: contiguous bfloat16 (T, 2I) only");
  const int64_t t = x.size(0), width = x.size(1) / 2;
  auto out = at::empty({t, width}, x.options());
  const bf16* xp = x.data_ptr<bf16>();
  bf16* op = out.data_ptr<bf16>();
  const auto rows = [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const bf16* gate = xp + r * 2 * width;
      const bf16* up = gate + width;
      bf16* y = op + r * width;
      int64_t i = 0;
#if defined(__AVX512F__)
      for (; i + 16 <= width; i += 16) silu_mul16(gate + i, up + i, y + i);
#endif
      for (; i + 8 <= width; i += 8) {
        const v8 g = modelyard::load_bf16(gate + i), u = modelyard::load_bf16(up + i);
        modelyard::store_bf16(y + i, modelyard::silu_times(g, u));
      }
      for (; i < width; ++i) {
        const float g = gate[i];
        y[i] = static_cast<bf16>(bf(g / (1.f + std::exp(-g))) * static_cast<float>(up[i]));
      }
    }
  };
  modelyard::parallel_chunks(t, row_grain(2 * width), kRowsPerChunk, rows);
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

at::Tensor argmax_rows(const at::Tensor& x) {
  check_rows(x, {}, "argmax_rows");
  const int64_t rows = x.size(0), n = x.size(1);
  TORCH_CHECK(n > 0, "argmax_rows: empty rows");
  auto out = at::empty({rows}, x.options().dtype(at::kLong));
  int64_t* op = out.data_ptr<int64_t>();
  auto run = [&](const auto* xp) {
    modelyard::parallel_chunks(rows, row_grain(n), 1, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) op[r] = argmax_row(xp + r * n, n);
    });
  };
  if (x.scalar_type() == at::kFloat) {
    run(x.data_ptr<float>());
  } else {
    run(x.data_ptr<bf16>());
  }
  return out;
}

// qkv (T, (nh + 2 nkv) hd); cos / signed_sin (P, hd) tables (signed_sin: sin with its first half
// negated); positions (T,) and slots (T,) int64; caches (nkv, NB, bs, hd); all float tensors of
// one dtype (float32 or bfloat16).
void rope_store(at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& signed_sin,
                const at::Tensor& positions, at::Tensor& k_cache, at::Tensor& v_cache,
                const at::Tensor& slots, int64_t num_heads, int64_t layout) {
  check_rows(qkv, {cos, signed_sin, k_cache, v_cache}, "rope_store");
  TORCH_CHECK(positions.is_contiguous() && slots.is_contiguous(),
              "rope_store: contiguous positions and slots");
  const int64_t t = qkv.size(0), nkv = k_cache.size(0), hd = k_cache.size(3);
  const int64_t cache_slots = k_cache.size(1) * k_cache.size(2), table_len = cos.size(0);
  TORCH_CHECK(qkv.size(1) == (num_heads + 2 * nkv) * hd && cos.size(1) == hd && hd % 2 == 0,
              "rope_store: bad shapes");
  TORCH_CHECK(positions.numel() == t && slots.numel() == t, "rope_store: one position per row");
  TORCH_CHECK(layout == 0 || (layout == kTileLayout && k_cache.size(2) % 2 == 0),
              "rope_store: layout 0 (plain) or 1 (tiles, even block size)");
  const int64_t* pos = positions.data_ptr<int64_t>();
  const int64_t* slot = slots.data_ptr<int64_t>();
  for (int64_t r = 0; r < t; ++r) {
    TORCH_CHECK(pos[r] >= 0 && pos[r] < table_len, "rope_store: position out of range");
    TORCH_CHECK(slot[r] >= 0 && slot[r] < cache_slots, "rope_store: slot out of range");
  }
  if (qkv.scalar_type() == at::kFloat) {
    rope_store_rows<float>(qkv, cos, signed_sin, pos, k_cache, v_cache, slot, num_heads, layout);
  } else {
    rope_store_rows<bf16>(qkv, cos, signed_sin, pos, k_cache, v_cache, slot, num_heads, layout);
  }
}

}  // namespace modelyard::ops
