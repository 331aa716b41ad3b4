// The weight panels of the float32, bf16-widened, int8 and GGUF-block GEMMs (gemm.cpp,
// gemm_int8.cpp, gemm_gguf.cpp): 16 output columns, k-major, and the K chunks a sum is cut into.
// A bf16 row summed by either file takes the same chunks in the same order, so a request's bits
// do not depend on how many rows share its call. Also the parts a panel's row is computed in and
// the trickle of prefetches into the next unit's weights.
#pragma once

#include <cstdint>

#include "vec.h"

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

typedef float f16v __attribute__((vector_size(64), aligned(4)));  // a panel's row of floats

// A panel's 16 columns as kParts vectors of float32: one AVX-512 register, or two of AVX2's.
// GCC lowers 16-float generic vectors on AVX2 through the stack (narrow integers converted lane
// by lane, accumulators spilled: 3-10x float32's time), so the int8 and GGUF loops work on parts.
#if defined(__AVX512F__)
using part = f16v;
#else
using part = v8;
#endif
constexpr int kParts = static_cast<int>(sizeof(f16v) / sizeof(part));
constexpr int64_t kPartCols = kNR / kParts;
// rows of x per micro-kernel call: each row's sums take one AVX-512 register (8 of its 32), or
// two of AVX2's 16 (4 rows: 8 registers, where 8 rows spilled them)
constexpr int64_t kPartRows = kParts == 1 ? 8 : 4;

inline part load_part(const float* p, int j) {  // part j of 16 floats (any 4-byte alignment)
  return *reinterpret_cast<const part*>(p + j * kPartCols);
}

inline part splat_part(float v) {  // one broadcast (`part{} + v` would add a zero first)
#if defined(__AVX512F__)
  return _mm512_set1_ps(v);
#else
  return splat(v);
#endif
}

// the parts of one row's sums as the 16 floats of a panel: a shuffle, where a copy through
// memory made GCC store the accumulators to the stack at every step
inline f16v joined(const part* parts) {
#if defined(__AVX512F__)
  return parts[0];
#else
  return __builtin_shufflevector(parts[0], parts[1], 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13,
                                 14, 15);
#endif
}

// the next unit's weights, one 64-byte line from pf every `every` steps of k (none: pf null)
struct Trickle {
  const char* pf;
  int64_t every, countdown = 1;
  void step() {
    if (pf != nullptr && --countdown == 0) {
      __builtin_prefetch(pf, 0, 2);
      pf += 64;
      countdown = every;
    }
  }
};

}  // namespace modelyard
