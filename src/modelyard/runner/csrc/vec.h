// Small 8-float vector helpers shared by the runner's kernels (GCC / Clang vector extensions:
// one AVX register where the host has AVX, otherwise whatever the compiler makes of it).
#pragma once

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <cstdint>

namespace modelyard {

typedef float v8 __attribute__((vector_size(32), aligned(4)));
typedef int i8 __attribute__((vector_size(32), aligned(4)));

inline float hsum(v8 x) {
  return ((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7]));
}

// True when any lane of a vector comparison result is set.
inline bool any(i8 mask) {
  return (mask[0] | mask[1] | mask[2] | mask[3] | mask[4] | mask[5] | mask[6] | mask[7]) != 0;
}

inline v8 splat(float x) { return v8{x, x, x, x, x, x, x, x}; }

typedef unsigned u32x8 __attribute__((vector_size(32), aligned(4)));
typedef unsigned short u16x8 __attribute__((vector_size(16), aligned(2)));

// 8 bfloat16 (raw bits at p) -> 8 floats; exact: a bf16 is the high half of a float
inline v8 load_bf16(const void* p) {
#if defined(__AVX2__)  // one vpmovzxwd from memory (the generic form compiles to four steps)
  const __m256i wide = _mm256_slli_epi32(
      _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))), 16);
  return reinterpret_cast<const v8&>(wide);
#else
  const u32x8 wide = __builtin_convertvector(*reinterpret_cast<const u16x8*>(p), u32x8) << 16;
  return reinterpret_cast<const v8&>(wide);
#endif
}

// x rounded to the nearest bfloat16 (ties to even) as float bits; x finite (c10::BFloat16's
// rounding, which maps NaN to a quiet NaN instead)
inline u32x8 round_bf16_bits(v8 x) {
  const u32x8 bits = reinterpret_cast<const u32x8&>(x);
  return (bits + (((bits >> 16) & 1u) + 0x7FFFu)) & 0xFFFF0000u;
}

inline v8 round_bf16(v8 x) {
  const u32x8 bits = round_bf16_bits(x);
  return reinterpret_cast<const v8&>(bits);
}

// 8 floats -> 8 bfloat16 at p as torch's tensor conversion writes them: rounded to nearest even,
// a NaN as 0xFFFF
inline void store_bf16(void* p, v8 x) {
  const auto number = (u32x8)(x == x);  // all ones unless NaN
  const u32x8 bits = ((round_bf16_bits(x) >> 16) & number) | (0xFFFFu & ~number);
  *reinterpret_cast<u16x8*>(p) = __builtin_convertvector(bits, u16x8);
}

// exp of each lane (Cephes-style: 2^n times a degree-5 polynomial on [-ln2/2, ln2/2]), relative
// error ~2e-7 like std::exp's float rounding; inputs below -87 give ~0 as softmax needs. V is a
// float vector type and I the int vector of its width.
template <typename V, typename I>
inline V exp_lanes(V x) {
  const auto c = [](float value) { return V{} + value; };
  x = x < c(-87.f) ? c(-87.f) : x;
  x = x > c(88.f) ? c(88.f) : x;
  V fx = x * c(1.44269504088896341f) + c(0.5f);
  V n = __builtin_convertvector(__builtin_convertvector(fx, I), V);
  n = n > fx ? n - c(1.f) : n;  // floor
  x = x - n * c(0.693359375f) - n * c(-2.12194440e-4f);
  V y = c(1.9875691500e-4f);
  y = y * x + c(1.3981999507e-3f);
  y = y * x + c(8.3334519073e-3f);
  y = y * x + c(4.1665795894e-2f);
  y = y * x + c(1.6666665459e-1f);
  y = y * x + c(5.0000001201e-1f);
  y = y * x * x + x + c(1.f);
  const I bits = (__builtin_convertvector(n, I) + 127) << 23;
  return y * reinterpret_cast<const V&>(bits);
}

inline v8 exp8(v8 x) { return exp_lanes<v8, i8>(x); }

// SwiGLU's activation as HF's two bf16 ops give it: silu(g) = g / (1 + exp(-g)) rounded to bf16,
// times u; g and u are bf16 values (as floats); returns the product before its own rounding to
// bf16. V, I, U: float, int and unsigned vectors of one width.
template <typename V, typename I, typename U>
inline V silu_times_lanes(V g, V u) {
  V act = g / (V{} + 1.f + exp_lanes<V, I>(-g));
  act = g < V{} - 88.f ? g * 0.f : act;  // exp(-g) overflows: torch's -0
  U bits = reinterpret_cast<const U&>(act);
  bits = (bits + (((bits >> 16) & 1u) + 0x7FFFu)) & 0xFFFF0000u;  // round_bf16
  return reinterpret_cast<const V&>(bits) * u;
}

inline v8 silu_times(v8 g, v8 u) { return silu_times_lanes<v8, i8, u32x8>(g, u); }

#if defined(__AVX512F__)
// 16 floats: one AVX-512 register
typedef float v16 __attribute__((vector_size(64), aligned(4)));
typedef int i16 __attribute__((vector_size(64), aligned(4)));
typedef unsigned u32x16 __attribute__((vector_size(64), aligned(4)));
typedef unsigned short u16x16 __attribute__((vector_size(32), aligned(2)));

inline v16 exp16(v16 x) { return exp_lanes<v16, i16>(x); }

// load_bf16, round_bf16_bits and store_bf16 on 16 lanes
inline v16 load_bf16x16(const void* p) {
  const __m512i wide = _mm512_slli_epi32(
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16);
  return reinterpret_cast<const v16&>(wide);
}

inline u32x16 round_bf16x16_bits(v16 x) {
  const u32x16 bits = reinterpret_cast<const u32x16&>(x);
  return (bits + (((bits >> 16) & 1u) + 0x7FFFu)) & 0xFFFF0000u;
}

inline void store_bf16x16(void* p, v16 x) {
  const auto number = (u32x16)(x == x);  // all ones unless NaN
  const u32x16 bits = ((round_bf16x16_bits(x) >> 16) & number) | (0xFFFFu & ~number);
  *reinterpret_cast<u16x16*>(p) = __builtin_convertvector(bits, u16x16);
}

inline v16 silu_times(v16 g, v16 u) { return silu_times_lanes<v16, i16, u32x16>(g, u); }

#if defined(__AVX512BF16__)
// A bf16 GEMM's epilogue. as_stored: a float32 sum rounded to bf16 as the GEMM stores it
// (vcvtneps2bf16), and back to float32.
inline v16 as_stored(__m512 sum) {
  const __m256i stored = (__m256i)_mm512_cvtneps_pbh(sum);
  const __m512i wide = _mm512_slli_epi32(_mm512_cvtepu16_epi32(stored), 16);
  return reinterpret_cast<const v16&>(wide);
}

// cols (<= 16) of 16 float32 sums at y as bf16 (vcvtneps2bf16)
inline void store_sums(void* y, __m512 sum, int64_t cols) {
  const __m256i out = (__m256i)_mm512_cvtneps_pbh(sum);
  if (cols == 16) return _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), out);
  _mm256_mask_storeu_epi16(y, static_cast<__mmask16>((1u << cols) - 1), out);
}

// cols (<= 16) columns of silu(gate) * up at y from the gate and up sums of one row, each
// rounded first as F.linear stores it, then as HF's silu and product round theirs
inline void swiglu_out(__m512 gate, __m512 up, void* y, int64_t cols) {
  const v16 out = silu_times(as_stored(gate), as_stored(up));
  if (cols == 16) return store_bf16x16(y, out);
  alignas(32) uint16_t row[16];
  store_bf16x16(row, out);
  __builtin_memcpy(y, row, cols * sizeof(uint16_t));
}
#endif
#endif

}  // namespace modelyard
