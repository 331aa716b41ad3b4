// LoRA deltas of a step's rows, each row with its own adapter (runner.lora.manager), in float32.
//
// A layer's projection group (n modules sharing the input x) keeps, for S slots of R ranks
// (R a multiple of 16):
//   a  (S, K, n * R)  slot s's A matrices transposed, module i at columns i * R (zero padded);
//   bt (S, R, N)      slot s's scaled B matrices transposed, module i at columns bounds[i].
// Row t with slot s = slots[t] >= 0 gets u = x[t] a[s] (n * R ranks), then module i's columns
// of y gain u[i * R .. i * R + R) bt[s][:, module i's columns]; rows with slot -1 get nothing.
// Both passes claim their units across threads (claim.h), so inside a decode step they share
// the step's team instead of waking ATen's pool (whose waiting threads and the team's spinning
// helper slow each other down on a 2-core host).
//
//   lora_add     y += the deltas of the group's modules (y: the base projection's output)
//   lora_swiglu  the MLP's gate/up: `both` is packed_linear's output on pack_swiglu's weight
//                (16 gate columns, the same 16 up columns, ...); adds the gate and up deltas
//                (bt columns: gate at 0, up at width) and returns silu(gate) * up (T, width),
//                as packed_swiglu computes it
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <vector>

#include "claim.h"
#include "vec.h"

namespace {

#if defined(__AVX512F__)
using vec = modelyard::v16;
#else
using vec = modelyard::v8;
#endif
constexpr int64_t kLanes = sizeof(vec) / sizeof(float);
constexpr int64_t kBlock = 16;      // columns of a (rank) block and of a SwiGLU panel
constexpr int64_t kVecs = kBlock / kLanes;
constexpr int64_t kRowsPerUnit = 32;  // rows of one slot (shrink) or of the batch per unit
constexpr int64_t kCols = 64;         // output columns per unit (expand)

inline vec load(const float* p) { return *reinterpret_cast<const vec*>(p); }
inline void store(float* p, vec v) { *reinterpret_cast<vec*>(p) = v; }
inline vec splat(float x) { return vec{} + x; }

// The rows of each slot, in batch order.
std::vector<std::vector<int64_t>> rows_by_slot(const at::Tensor& slots, int64_t num_slots) {
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.dim() == 1, "lora: slots (T,) int64");
  std::vector<std::vector<int64_t>> rows(static_cast<size_t>(num_slots));
  const int64_t* sp = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < slots.numel(); ++t) {
    TORCH_CHECK(sp[t] < num_slots, "lora: slot out of range");
    if (sp[t] >= 0) rows[static_cast<size_t>(sp[t])].push_back(t);
  }
  return rows;
}

// u[row] (one 16-rank block c) = x[row] a[s][:, block c] for up to 4 rows at once: each k loads
// the block's 16 values once for all the rows.
template <int MR>
void shrink_rows(const float* x, int64_t k_len, const float* a, int64_t w, const int64_t* rows,
                 float* u) {
  vec acc[MR][kVecs] = {};
  for (int64_t k = 0; k < k_len; ++k) {
    for (int v = 0; v < kVecs; ++v) {
      const vec col = load(a + k * w + v * kLanes);
      for (int r = 0; r < MR; ++r) acc[r][v] += col * splat(x[rows[r] * k_len + k]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    for (int v = 0; v < kVecs; ++v) store(u + rows[r] * w + v * kLanes, acc[r][v]);
  }
}

// u (T, W) = each adapter row of x (T, K) times its slot's a (S, K, W); other rows unset.
at::Tensor shrink(const at::Tensor& x, const at::Tensor& a,
                  const std::vector<std::vector<int64_t>>& rows) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(),
              "lora: contiguous float32 x (T, K)");
  TORCH_CHECK(a.scalar_type() == at::kFloat && a.dim() == 3 && a.is_contiguous() &&
                  a.size(1) == x.size(1) && a.size(2) % kBlock == 0,
              "lora: a (S, K, W) float32, W a multiple of 16");
  const int64_t k_len = x.size(1), w = a.size(2), blocks = w / kBlock;
  auto u = at::empty({x.size(0), w}, x.options());
  std::vector<std::pair<int64_t, int64_t>> parts;  // (slot, first of its rows)
  for (size_t s = 0; s < rows.size(); ++s) {
    for (size_t r = 0; r < rows[s].size(); r += kRowsPerUnit) parts.emplace_back(s, r);
  }
  const float* xp = x.data_ptr<float>();
  const float* ap = a.data_ptr<float>();
  float* up = u.data_ptr<float>();
  const int64_t units = static_cast<int64_t>(parts.size()) * blocks;
  modelyard::for_each_claimed(units, [&](int64_t unit, int64_t, bool) {
    const auto [s, first] = parts[static_cast<size_t>(unit / blocks)];
    const int64_t c = unit % blocks * kBlock;
    const auto& slot_rows = rows[static_cast<size_t>(s)];
    const int64_t end = std::min<int64_t>(first + kRowsPerUnit, slot_rows.size());
    const float* as = ap + s * k_len * w + c;
    int64_t r = first;
    for (; r + 4 <= end; r += 4) shrink_rows<4>(xp, k_len, as, w, &slot_rows[r], up + c);
    for (; r < end; ++r) shrink_rows<1>(xp, k_len, as, w, &slot_rows[r], up + c);
  });
  return u;
}

// y[0..cols) += sum over r of u[r] * b[r][0..cols) (b's rows `ldb` apart): a vector of columns
// at a time, the tail one by one.
inline void expand_row(float* y, const float* u, int64_t ranks, const float* b, int64_t ldb,
                       int64_t cols) {
  int64_t c = 0;
  for (; c + 4 * kLanes <= cols; c += 4 * kLanes) {
    vec acc[4];
    for (int v = 0; v < 4; ++v) acc[v] = load(y + c + v * kLanes);
    for (int64_t r = 0; r < ranks; ++r) {
      const vec ur = splat(u[r]);
      for (int v = 0; v < 4; ++v) acc[v] += ur * load(b + r * ldb + c + v * kLanes);
    }
    for (int v = 0; v < 4; ++v) store(y + c + v * kLanes, acc[v]);
  }
  for (; c + kLanes <= cols; c += kLanes) {
    vec acc = load(y + c);
    for (int64_t r = 0; r < ranks; ++r) acc += splat(u[r]) * load(b + r * ldb + c);
    store(y + c, acc);
  }
  for (; c < cols; ++c) {
    float sum = y[c];
    for (int64_t r = 0; r < ranks; ++r) sum += u[r] * b[r * ldb + c];
    y[c] = sum;
  }
}

}  // namespace

namespace modelyard::ops {

// y (T, N) += each row's deltas; bounds: the n modules' first columns in y and bt, then N.
void lora_add(at::Tensor& y, const at::Tensor& x, const at::Tensor& a, const at::Tensor& bt,
              const at::Tensor& slots, at::IntArrayRef bounds) {
  const int64_t num_slots = a.size(0), n = static_cast<int64_t>(bounds.size()) - 1;
  TORCH_CHECK(n >= 1 && a.size(2) % n == 0, "lora_add: a's width is not n modules of ranks");
  const int64_t ranks = a.size(2) / n, out = bounds[n];
  TORCH_CHECK(y.scalar_type() == at::kFloat && y.is_contiguous() && y.dim() == 2 &&
                  y.size(0) == x.size(0) && y.size(1) == out && slots.numel() == x.size(0),
              "lora_add: y (T, N) contiguous float32");
  TORCH_CHECK(bt.scalar_type() == at::kFloat && bt.is_contiguous() &&
                  bt.sizes() == at::IntArrayRef({num_slots, ranks, out}),
              "lora_add: bt (S, R, N) float32");
  const auto rows = rows_by_slot(slots, num_slots);
  const at::Tensor u = shrink(x, a, rows);
  std::vector<std::pair<int64_t, int64_t>> chunks;  // (module, first column)
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t c = bounds[i]; c < bounds[i + 1]; c += kCols) chunks.emplace_back(i, c);
  }
  const int64_t t_len = x.size(0), row_units = (t_len + kRowsPerUnit - 1) / kRowsPerUnit;
  const int64_t* sp = slots.data_ptr<int64_t>();
  const float* up = u.data_ptr<float>();
  const float* bp = bt.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t units = static_cast<int64_t>(chunks.size()) * row_units;
  modelyard::for_each_claimed(units, [&](int64_t unit, int64_t, bool) {
    const auto [i, c] = chunks[static_cast<size_t>(unit / row_units)];
    const int64_t cols = std::min(kCols, bounds[i + 1] - c);
    const int64_t first = unit % row_units * kRowsPerUnit;
    for (int64_t t = first; t < std::min(t_len, first + kRowsPerUnit); ++t) {
      if (sp[t] < 0) continue;
      expand_row(yp + t * out + c, up + t * n * ranks + i * ranks, ranks,
                 bp + sp[t] * ranks * out + c, out, cols);
    }
  });
}

// (T, width) silu(gate + its delta) * (up + its delta), from `both` (see the top of this file).
at::Tensor lora_swiglu(const at::Tensor& both, const at::Tensor& x, const at::Tensor& a,
                       const at::Tensor& bt, const at::Tensor& slots, int64_t width) {
  const int64_t num_slots = a.size(0), ranks = a.size(2) / 2;
  const int64_t blocks = (width + kBlock - 1) / kBlock, t_len = x.size(0);
  TORCH_CHECK(both.scalar_type() == at::kFloat && both.is_contiguous() &&
                  both.sizes() == at::IntArrayRef({t_len, 2 * blocks * kBlock}),
              "lora_swiglu: both (T, 2 * 16 * blocks) contiguous float32");
  TORCH_CHECK(bt.scalar_type() == at::kFloat && bt.is_contiguous() &&
                  bt.sizes() == at::IntArrayRef({num_slots, ranks, 2 * width}) &&
                  slots.numel() == t_len,
              "lora_swiglu: bt (S, R, 2 * width) float32");
  const at::Tensor u = shrink(x, a, rows_by_slot(slots, num_slots));
  auto y = at::empty({t_len, width}, x.options());
  const int64_t ld = 2 * blocks * kBlock, per_unit = kCols / kBlock;
  const int64_t col_units = (blocks + per_unit - 1) / per_unit;
  const int64_t row_units = (t_len + kRowsPerUnit - 1) / kRowsPerUnit;
  const int64_t* sp = slots.data_ptr<int64_t>();
  const float* up = u.data_ptr<float>();
  const float* bp = bt.data_ptr<float>();
  const float* inp = both.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  modelyard::for_each_claimed(col_units * row_units, [&](int64_t unit, int64_t, bool) {
    const int64_t q0 = unit / row_units * per_unit, first = unit % row_units * kRowsPerUnit;
    const int64_t q1 = std::min(blocks, q0 + per_unit), c0 = q0 * kBlock;
    const int64_t cols = std::min(kCols, width - c0);  // <= (q1 - q0) * 16
    for (int64_t t = first; t < std::min(t_len, first + kRowsPerUnit); ++t) {
      alignas(64) float gate[kCols], upv[kCols], row[kCols];
      for (int64_t q = q0; q < q1; ++q) {  // the unit's gate and up columns, side by side
        std::copy_n(inp + t * ld + 2 * q * kBlock, kBlock, gate + (q - q0) * kBlock);
        std::copy_n(inp + t * ld + (2 * q + 1) * kBlock, kBlock, upv + (q - q0) * kBlock);
      }
      if (sp[t] >= 0) {
        const float* b = bp + sp[t] * ranks * 2 * width + c0;
        expand_row(gate, up + t * 2 * ranks, ranks, b, 2 * width, cols);
        expand_row(upv, up + t * 2 * ranks + ranks, ranks, b + width, 2 * width, cols);
      }
      for (int64_t c = 0; c < (q1 - q0) * kBlock; c += 8) {
        const modelyard::v8 g = *reinterpret_cast<const modelyard::v8*>(gate + c);
        const modelyard::v8 v = *reinterpret_cast<const modelyard::v8*>(upv + c);
        *reinterpret_cast<modelyard::v8*>(row + c) =
            g / (modelyard::splat(1.f) + modelyard::exp8(-g)) * v;
      }
      std::copy_n(row, cols, yp + t * width + c0);
    }
  });
  return y;
}

}  // namespace modelyard::ops

TORCH_LIBRARY_FRAGMENT(modelyard_kernels, m) {
  m.def(
      "lora_add(Tensor(a!) y, Tensor x, Tensor a, Tensor bt, Tensor slots, int[] bounds) -> ()");
  m.impl("lora_add", c10::DispatchKey::CPU, &modelyard::ops::lora_add);
  m.def(
      "lora_swiglu(Tensor both, Tensor x, Tensor a, Tensor bt, Tensor slots, int width) -> "
      "Tensor");
  m.impl("lora_swiglu", c10::DispatchKey::CPU, &modelyard::ops::lora_swiglu);
}
