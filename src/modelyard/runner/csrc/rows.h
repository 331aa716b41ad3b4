// Row scans over float32 or bfloat16 logits shared by the greedy argmax (fused_ops.cpp) and the
// sampler's draw (sampling.cpp). bf16 values are widened exactly, so a bf16 row's results are
// those of its float copy.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "vec.h"

namespace modelyard {

inline v8 load8(const float* x) { return *reinterpret_cast<const v8*>(x); }
inline v8 load8(const at::BFloat16* x) { return load_bf16(x); }

// The row's maximum, or NaN when any value is NaN (as torch's max and argmax count it).
template <typename T>
float row_max(const T* x, int64_t n) {
  v8 best = splat(-std::numeric_limits<float>::infinity());
  i8 nan_lanes = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const v8 v = load8(x + i);
    best = v > best ? v : best;
    nan_lanes |= v != v;
  }
  float m = best[0];
  for (int j = 1; j < 8; ++j) m = std::max(m, best[j]);
  bool nan = any(nan_lanes);
  for (; i < n; ++i) {
    const float v = static_cast<float>(x[i]);
    m = std::max(m, v);
    nan |= std::isnan(v);
  }
  return nan ? std::numeric_limits<float>::quiet_NaN() : m;
}

// The first index whose value is m (the first NaN when m is NaN); m must occur in the row.
template <typename T>
int64_t first_index_of(const T* x, int64_t n, float m) {
  const bool nan = std::isnan(m);
  int64_t j = 0;
  if (!nan) {  // skip whole vectors without the maximum
    for (; j + 8 <= n && !any(load8(x + j) == splat(m)); j += 8) {
    }
  }
  for (; j < n; ++j) {
    const float v = static_cast<float>(x[j]);
    if (nan ? std::isnan(v) : v == m) return j;
  }
  return 0;  // not reached: m occurs in the row
}

}  // namespace modelyard
