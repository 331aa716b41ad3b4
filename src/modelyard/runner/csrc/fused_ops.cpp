// The element-wise steps of a Llama decoder layer besides RMSNorm (rms_norm.cpp), fused (float32
// or bfloat16, CPU).
//
// In torch each of these is several ops, each a dispatch, an allocation and a pass over the rows;
// at decode sizes (32 rows of 576) that overhead, not arithmetic, is the cost. Each op here is one
// pass, rows split across the ATen thread pool only when there are enough of them to pay for the
// wake-up (fused_rows.h).
//   rope_store     rotate-half RoPE on the q and k heads of the fused qkv rows in place, then
//                  write the step's k and v rows into their paged-cache slots (plain rows, or
//                  the tile layout of AMX hosts: store_tile_layout)
//   argmax_rows    torch.argmax(x, -1) for greedy sampling (the first maximum; a NaN counts as
//                  the maximum, as in torch): a vector max, then a scan for its first index
//   silu_mul       bfloat16 SwiGLU activation: silu(gate) * up for (T, 2I) rows [gate | up]
//                  (float32 applies it inside the GEMM: csrc/gemm.cpp)
// Each also takes bfloat16, rounding where the torch ops of HF's Llama do (float32 inside one op,
// a bf16 result out of it), so it gives torch's bits: each RoPE product before their sum;
// silu(gate) before its product with up.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "claim.h"
#include "fused_rows.h"
#include "ops.h"
#include "rows.h"
#include "vec.h"

using namespace modelyard::ops;  // (the ops this file defines at its end, ops.h)

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace {

using namespace modelyard::fused;  // (fused_rows.h)
using modelyard::splat;
using modelyard::v8;

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
