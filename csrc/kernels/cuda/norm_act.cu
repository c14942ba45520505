// RMSNorm and SwiGLU (CUDA). Rows that are 16-byte aligned are read and written 16 bytes at a
// time: RMSNorm keeps its row in registers between the sum of squares and the scaling (one read
// of x instead of two), SwiGLU indexes by (row, chunk) without 64-bit division per element.
// Per element the arithmetic is the scalar kernels' (SwiGLU's bits are the same; RMSNorm's sum of
// squares is added in another order).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.cuh"
#include "kernels/cuda/launch.cuh"

namespace blockbatch::cuda {

namespace {
// kAdd (add_rms_norm_): x += delta first (rounded to T, as PyTorch's add), written back to x, and
// the updated x is normalised; x is then [rows, dim] contiguous (x_stride == dim).
template <typename T, bool kAdd>
__global__ void rms_norm_kernel(T* x, int64_t x_stride, const T* delta, const T* w, T* out, int64_t dim, float eps) {
  __shared__ float scratch[32];
  T* xr = x + blockIdx.x * x_stride;
  float ss = 0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = to_f(xr[i]);
    if constexpr (kAdd) {
      const T sum = from_f<T>(v + to_f(delta[blockIdx.x * dim + i]));
      xr[i] = sum;
      v = to_f(sum);
    }
    ss += v * v;
  }
  ss = block_sum(ss, scratch);
  const float inv = rsqrtf(ss / static_cast<float>(dim) + eps);
  T* o = out + blockIdx.x * dim;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const T normed = from_f<T>(to_f(xr[i]) * inv);  // rounded to T before the weight, as LLaDA does
    o[i] = from_f<T>(to_f(normed) * to_f(w[i]));
  }
}

// The vectorised RMSNorm: thread i holds chunks i, i + blockDim, ... (at most kChunks) of its row.
template <typename T, int kChunks, bool kAdd>
__global__ void rms_norm_vec_kernel(T* x, int64_t x_stride, const T* delta, const T* w, T* out, int64_t dim,
                                    float eps) {
  constexpr int P = 16 / sizeof(T);
  __shared__ float scratch[32];
  uint4* xr = reinterpret_cast<uint4*>(x + blockIdx.x * x_stride);
  const uint4* dr = kAdd ? reinterpret_cast<const uint4*>(delta + blockIdx.x * dim) : nullptr;
  const uint4* wr = reinterpret_cast<const uint4*>(w);
  uint4* o = reinterpret_cast<uint4*>(out + blockIdx.x * dim);
  const int chunks = static_cast<int>(dim / P);
  uint4 xv[kChunks], wv[kChunks], dv[kChunks];
  float ss = 0;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {  // every load in flight before the first use
    const int i = threadIdx.x + c * blockDim.x;
    if (i < chunks) {
      xv[c] = xr[i];
      wv[c] = wr[i];
      if constexpr (kAdd) dv[c] = dr[i];
    }
  }
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int i = threadIdx.x + c * blockDim.x;
    if (i < chunks) {
      if constexpr (kAdd) {
        T* e = reinterpret_cast<T*>(&xv[c]);
        const T* d = reinterpret_cast<const T*>(&dv[c]);
#pragma unroll
        for (int u = 0; u < P; ++u) e[u] = from_f<T>(to_f(e[u]) + to_f(d[u]));  // as rms_norm_kernel
        xr[i] = xv[c];
      }
      const T* e = reinterpret_cast<const T*>(&xv[c]);
#pragma unroll
      for (int u = 0; u < P; ++u) ss += to_f(e[u]) * to_f(e[u]);
    }
  }
  ss = block_sum(ss, scratch);
  const float inv = rsqrtf(ss / static_cast<float>(dim) + eps);
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const int i = threadIdx.x + c * blockDim.x;
    if (i < chunks) {
      const T* e = reinterpret_cast<const T*>(&xv[c]);
      const T* we = reinterpret_cast<const T*>(&wv[c]);
      uint4 r;
      T* re = reinterpret_cast<T*>(&r);
#pragma unroll
      for (int u = 0; u < P; ++u) {
        const T normed = from_f<T>(to_f(e[u]) * inv);  // as rms_norm_kernel
        re[u] = from_f<T>(to_f(normed) * to_f(we[u]));
      }
      o[i] = r;
    }
  }
}

// The vectorised SwiGLU: grid.y walks the rows, x the 16-byte chunks of a row's m outputs.
template <typename T>
__global__ void silu_mul_vec_kernel(const T* gate_up, T* out, int64_t rows, int64_t m) {
  constexpr int P = 16 / sizeof(T);
  const int64_t chunks = m / P;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const uint4* g4 = reinterpret_cast<const uint4*>(gate_up + r * 2 * m);
    const uint4* u4 = reinterpret_cast<const uint4*>(gate_up + r * 2 * m + m);
    uint4* o4 = reinterpret_cast<uint4*>(out + r * m);
    for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < chunks;
         c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const uint4 gv = g4[c], uv = u4[c];
      const T* ge = reinterpret_cast<const T*>(&gv);
      const T* ue = reinterpret_cast<const T*>(&uv);
      uint4 res;
      T* re = reinterpret_cast<T*>(&res);
#pragma unroll
      for (int u = 0; u < P; ++u) {
        const float g = to_f(ge[u]);
        const float act = to_f(from_f<T>(g / (1.0f + __expf(-g))));  // as silu_mul_kernel
        re[u] = from_f<T>(act * to_f(ue[u]));
      }
      o4[c] = res;
    }
  }
}

// kAdd = false never writes x (rms_norm's x is const; the cast only shares the kernels).
template <typename T, bool kAdd>
cudaError_t launch_rms_norm(T* x, int64_t x_stride, const T* delta, const T* w, T* out, int64_t rows, int64_t dim,
                            float eps, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  constexpr int64_t P = 16 / sizeof(T), kThreadsVec = 256;
  const int64_t chunks = dim / P;
  if (dim % P == 0 && x_stride % P == 0 && aligned16(x) && aligned16(w) && aligned16(out) &&
      (!kAdd || aligned16(delta)) && chunks <= 4 * kThreadsVec) {
    const auto kernel = chunks <= kThreadsVec       ? rms_norm_vec_kernel<T, 1, kAdd>
                        : chunks <= 2 * kThreadsVec ? rms_norm_vec_kernel<T, 2, kAdd>
                                                    : rms_norm_vec_kernel<T, 4, kAdd>;
    return launch_kernel(kernel, static_cast<unsigned>(rows), kThreadsVec, 0, stream, x, x_stride, delta, w, out, dim,
                         eps);
  }
  return launch_kernel(rms_norm_kernel<T, kAdd>, static_cast<unsigned>(rows), 256, 0, stream, x, x_stride, delta, w,
                       out, dim, eps);
}

template <typename T>
__global__ void silu_mul_kernel(const T* gate_up, T* out, int64_t rows, int64_t m) {
  const int64_t n = rows * m;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / m, i = idx % m;
    const float g = to_f(gate_up[r * 2 * m + i]);
    const float act = to_f(from_f<T>(g / (1.0f + __expf(-g))));
    out[idx] = from_f<T>(act * to_f(gate_up[r * 2 * m + m + i]));
  }
}
}  // namespace

template <typename T>
cudaError_t rms_norm(const T* x, int64_t x_stride, const T* w, T* out, int64_t rows, int64_t dim, float eps,
                     cudaStream_t stream) {
  return launch_rms_norm<T, false>(const_cast<T*>(x), x_stride, nullptr, w, out, rows, dim, eps, stream);
}

template <typename T>
cudaError_t add_rms_norm(T* x, const T* delta, const T* w, T* out, int64_t rows, int64_t dim, float eps,
                         cudaStream_t stream) {
  return launch_rms_norm<T, true>(x, dim, delta, w, out, rows, dim, eps, stream);
}

template <typename T>
cudaError_t silu_mul(const T* gate_up, T* out, int64_t rows, int64_t m, cudaStream_t stream) {
  const int64_t n = rows * m;
  if (n == 0) return cudaSuccess;
  constexpr int64_t P = 16 / sizeof(T);
  if (m % P == 0 && aligned16(gate_up) && aligned16(out)) {
    const int64_t per_row = (m / P + 255) / 256;
    const dim3 grid(static_cast<unsigned>(per_row < 65535 ? per_row : 65535),
                    static_cast<unsigned>(rows < 65535 ? rows : 65535));
    return launch_kernel(silu_mul_vec_kernel<T>, grid, 256, 0, stream, gate_up, out, rows, m);
  }
  const int64_t blocks = (n + 255) / 256 < 65535 ? (n + 255) / 256 : 65535;
  return launch_kernel(silu_mul_kernel<T>, static_cast<unsigned>(blocks), 256, 0, stream, gate_up, out, rows, m);
}

#define INSTANTIATE(T)                                                                                      \
  template cudaError_t rms_norm<T>(const T*, int64_t, const T*, T*, int64_t, int64_t, float, cudaStream_t); \
  template cudaError_t add_rms_norm<T>(T*, const T*, const T*, T*, int64_t, int64_t, float, cudaStream_t);  \
  template cudaError_t silu_mul<T>(const T*, T*, int64_t, int64_t, cudaStream_t);
BLOCKBATCH_CUDA_INSTANTIATE(INSTANTIATE)
#undef INSTANTIATE

}  // namespace blockbatch::cuda
