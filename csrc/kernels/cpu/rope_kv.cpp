// RoPE (rotate-half, float32 math) and the KV-slot write (CPU).
#include <ATen/Parallel.h>

#include <cstring>

#include "kernels/cpu/common.h"
#include "kernels/cpu/kernels.h"

namespace blockbatch::cpu {

template <typename T>
void rope_inplace(T* x, int64_t tokens, int64_t row_stride, int64_t heads, int64_t head_dim, const int64_t* positions,
                  const float* cos_sin) {
  const int64_t half = head_dim / 2;
  at::parallel_for(0, tokens, grain_for(heads * head_dim), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* c = cos_sin + positions[t] * head_dim;
      const float* s = c + half;
      for (int64_t h = 0; h < heads; ++h) {
        T* xh = x + t * row_stride + h * head_dim;
        for (int64_t i = 0; i < half; ++i) {
          float a = to_float(xh[i]);
          float b = to_float(xh[i + half]);
          // Same operation order as the reference: x*cos + rotate_half(x)*sin.
          float lo = a * c[i] + (-b) * s[i];
          float hi = b * c[i] + a * s[i];
          xh[i] = from_float<T>(lo);
          xh[i + half] = from_float<T>(hi);
        }
      }
    }
  });
}

template <typename T>
void kv_write(T* kv, const KvGeometry& g, int64_t layer, const T* k, const T* v, int64_t src_stride,
              const int64_t* positions, const int64_t* cu_seqlens, const int64_t* kv_rows, int64_t rows) {
  const size_t bytes = static_cast<size_t>(g.head_dim) * sizeof(T);
  const int64_t per_row = cu_seqlens[rows] / (rows > 0 ? rows : 1) * g.kv_heads * g.head_dim;
  at::parallel_for(0, rows, grain_for(per_row), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t t = cu_seqlens[r]; t < cu_seqlens[r + 1]; ++t) {
        if (g.page(kv_rows[r], positions[t]) < 0) continue;  // no page: the write is dropped
        for (int64_t h = 0; h < g.kv_heads; ++h) {
          std::memcpy(kv + g.offset(kv_rows[r], layer, 0, h, positions[t]), k + t * src_stride + h * g.head_dim, bytes);
          std::memcpy(kv + g.offset(kv_rows[r], layer, 1, h, positions[t]), v + t * src_stride + h * g.head_dim, bytes);
        }
      }
    }
  });
}

#define INSTANTIATE(T)                                                                                   \
  template void rope_inplace<T>(T*, int64_t, int64_t, int64_t, int64_t, const int64_t*, const float*);   \
  template void kv_write<T>(T*, const KvGeometry&, int64_t, const T*, const T*, int64_t, const int64_t*, \
                            const int64_t*, const int64_t*, int64_t);
BLOCKBATCH_INSTANTIATE_FLOATING(INSTANTIATE)
#undef INSTANTIATE

}  // namespace blockbatch::cpu
