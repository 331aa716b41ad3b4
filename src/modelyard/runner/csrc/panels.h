// The weight panels of the float32, bf16-widened and int8 GEMMs (gemm.cpp, gemm_int8.cpp): 16
// output columns, k-major, and the K chunks a sum is cut into. A bf16 row summed by either file
// takes the same chunks in the same order, so a request's bits do not depend on how many rows
// share its call.
#pragma once

#include <cstdint>

namespace modelyard {

constexpr int64_t kNR = 16;   // output columns per panel
constexpr int64_t kKC = 320;  // k per chunk, at most (a 20 KiB float32 panel chunk: L1)

// K in near-equal chunks of at most kKC (576 -> 2 x 288, not 320 + 256); k_len > 0
inline int64_t k_chunk(int64_t k_len) {
  const int64_t chunks = (k_len + kKC - 1) / kKC;
  return (k_len + chunks - 1) / chunks;
}

}  // namespace modelyard
