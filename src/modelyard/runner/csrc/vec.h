// Small 8-float vector helpers shared by the runner's kernels (GCC / Clang vector extensions:
// one AVX register where the host has AVX, otherwise whatever the compiler makes of it).
#pragma once

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

// exp of 8 floats (Cephes-style: 2^n times a degree-5 polynomial on [-ln2/2, ln2/2]), relative
// error ~2e-7 like std::exp's float rounding; inputs below -87 give ~0 as softmax needs.
inline v8 exp8(v8 x) {
  x = x < splat(-87.f) ? splat(-87.f) : x;
  x = x > splat(88.f) ? splat(88.f) : x;
  v8 fx = x * splat(1.44269504088896341f) + splat(0.5f);
  v8 n = __builtin_convertvector(__builtin_convertvector(fx, i8), v8);
  n = n > fx ? n - splat(1.f) : n;  // floor
  x = x - n * splat(0.693359375f) - n * splat(-2.12194440e-4f);
  v8 y = splat(1.9875691500e-4f);
  y = y * x + splat(1.3981999507e-3f);
  y = y * x + splat(8.3334519073e-3f);
  y = y * x + splat(4.1665795894e-2f);
  y = y * x + splat(1.6666665459e-1f);
  y = y * x + splat(5.0000001201e-1f);
  y = y * x * x + x + splat(1.f);
  const i8 bits = (__builtin_convertvector(n, i8) + 127) << 23;
  return y * reinterpret_cast<const v8&>(bits);
}

}  // namespace modelyard
