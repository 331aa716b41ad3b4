// What the element-wise ops share (fused_ops.cpp, rms_norm.cpp): when a pass over rows is worth
// the thread pool, the checks of their operands, and where a bf16 torch op rounds.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>

namespace modelyard::fused {

// Below this many elements per task a pass runs inline: waking the second thread (passive OpenMP
// waits) costs ~20-25 us, so a decode step's SwiGLU (32 x 2 x 1536) takes ~40 us on one thread
// and ~55 us on two.
constexpr int64_t kElementsPerTask = 1 << 17;

// Inside a decode step (claim.h's Team) passes split into chunks of this many rows.
constexpr int64_t kRowsPerChunk = 4;

inline int64_t row_grain(int64_t row_elements) {
  return std::max<int64_t>(1, kElementsPerTask / std::max<int64_t>(1, row_elements));
}

using bf16 = at::BFloat16;

inline void check_float_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.is_contiguous(), name,
              ": contiguous float32 (T, H) only");
}

// float32 or bfloat16 rows, and every other tensor of the op in the same dtype
inline void check_rows(const at::Tensor& x, std::initializer_list<at::Tensor> same,
                       const char* name) {
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

}  // namespace modelyard::fused
