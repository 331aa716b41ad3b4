// The weight panels of the float32, bf16-widened and int8 GEMMs (gemm.cpp, gemm_int8.cpp): 16
// output columns, k-major, and the K chunks a sum is cut into. A bf16 row summed by either file
// takes the same chunks in the same order, so a request's bits do not depend on how many rows
// share its call.
#pragma once

#include <cstdint>

namespace modelyard {

constexpr int64_t kNR = 16;   // output columns per panel
// k per chunk, at most. A chunk's panel is ~36 KiB of float32 at most: panel pairs of the AVX-512
// build read theirs from L2 as much as from L1, and fewer, longer micro-kernel calls per output
// won over chunks that fit L1 (<= 320: 20 KiB): Zen 5, SmolLM2's shapes, 9-11 alternating
// rounds in one process, float32 2,048 rows +1..+5 %, 32 rows -1..+4 %; the AVX2 build on the
// same host +-2 %
constexpr int64_t kKC = 576;

// K in near-equal chunks of at most kKC (1536 -> 3 x 512, not 576 + 576 + 384); k_len > 0
inline int64_t k_chunk(int64_t k_len) {
  const int64_t chunks = (k_len + kKC - 1) / kKC;
  return (k_len + chunks - 1) / chunks;
}

}  // namespace modelyard
