// Shared helpers for the CPU kernels: float conversion and a vectorisable dot product.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

namespace blockbatch::cpu {

template <typename T>
inline float to_float(T v) {
  return static_cast<float>(v);
}

template <typename T>
inline T from_float(float v) {
  return static_cast<T>(v);
}

// Rows per at::parallel_for chunk so that each chunk carries about kMinChunkWork elements of
// work: tiny decode steps then run on one thread (thread wake-ups cost more than they save, and
// spin-waiting threads crawl on a busy machine).
constexpr int64_t kMinChunkWork = 1 << 15;
inline int64_t grain_for(int64_t work_per_row) {
  return work_per_row >= kMinChunkWork ? 1 : kMinChunkWork / (work_per_row > 0 ? work_per_row : 1);
}

// max and sum over n floats with 16 independent lanes (vectorisable without -ffast-math).
inline float max_of(const float* x, int64_t n) {
  float lanes[16];
  for (int k = 0; k < 16; ++k) lanes[k] = -3.4028235e38f;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int k = 0; k < 16; ++k) lanes[k] = lanes[k] > x[i + k] ? lanes[k] : x[i + k];
  }
  float m = -3.4028235e38f;
  for (int k = 0; k < 16; ++k) m = m > lanes[k] ? m : lanes[k];
  for (; i < n; ++i) m = m > x[i] ? m : x[i];
  return m;
}
inline float sum_of(const float* x, int64_t n) {
  float lanes[16] = {0};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    for (int k = 0; k < 16; ++k) lanes[k] += x[i + k];
  }
  float s = 0;
  for (int k = 0; k < 16; ++k) s += lanes[k];
  for (; i < n; ++i) s += x[i];
  return s;
}

// exp(x) on a GCC vector of floats (V) with the matching int32 vector (I), for the softmax and
// SwiGLU inner loops (libm's scalar expf dominated both). exp(x) = 2^n * e^r with
// n = floor(x log2 e) and r = x - n ln2 reduced in two exact steps (Cody-Waite); e^r on [0, ln2)
// by a degree-6 polynomial fitted for relative error: max relative error ~1.2e-7 on [-87, 0].
// Written on vector types, not left to the auto-vectoriser: the clamps stay compare + blend.
// (A scalar version inlined into SwiGLU's g / (1 + exp(-g)) let GCC split off the clamped path
// and divide every lane by the constant 1 + exp(88); the subnormal quotients cost microcode
// assists and made that loop 8x slower than libm.)
template <typename V, typename I>
inline V fast_exp_vec(V x) {
  const V lo = V{} - 87.0f, hi = V{} + 88.0f;
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  const V t = x * 1.44269504088896341f;
  const I n = __builtin_convertvector(t + 128.0f, I) - 128;  // floor(t): t + 128 > 0 after the clamp
  const V nf = __builtin_convertvector(n, V);
  V r = x - nf * 0.693145751953125f;
  r = r - nf * 1.428606765330187e-06f;
  V p = V{} + 1.9557753e-3f;
  p = p * r + 7.7767950e-3f;
  p = p * r + 4.1928079e-2f;
  p = p * r + 1.6660486e-1f;
  p = p * r + 5.0000685e-1f;
  p = p * r + 9.9999970e-1f;
  p = p * r + 1.0f;
  const I bits = (n + 127) << 23;
  V scale;
  __builtin_memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

}  // namespace blockbatch::cpu

#define BLOCKBATCH_INSTANTIATE_FLOATING(MACRO) \
  MACRO(float)                                 \
  MACRO(c10::BFloat16)                         \
  MACRO(c10::Half)
