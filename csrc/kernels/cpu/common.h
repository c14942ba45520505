// Shared helpers for the CPU kernels: float conversion and a vectorisable dot product.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

namespace blockbatch::cpu {

template <typename T>
inline float to_float(T v) { return static_cast<float>(v); }

template <typename T>
inline T from_float(float v) { return static_cast<T>(v); }

// Dot product with 8 independent accumulators (GCC vectorises this without -ffast-math).
template <typename T>
inline float dot(const float* a, const T* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * to_float(b[i + j]);
  }
  float tail = 0;
  for (; i < n; ++i) tail += a[i] * to_float(b[i]);
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

}  // namespace blockbatch::cpu

#define BLOCKBATCH_INSTANTIATE_FLOATING(MACRO) \
  MACRO(float)                                 \
  MACRO(c10::BFloat16)                         \
  MACRO(c10::Half)
