// RMSNorm and SwiGLU (CUDA).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.cuh"

namespace blockbatch::cuda {

namespace {
template <typename T>
__global__ void rms_norm_kernel(const T* x, int64_t x_stride, const T* w, T* out, int64_t dim, float eps) {
  __shared__ float scratch[32];
  const T* xr = x + blockIdx.x * x_stride;
  float ss = 0;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    const float v = to_f(xr[i]);
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
  if (rows == 0) return cudaSuccess;
  rms_norm_kernel<T><<<static_cast<unsigned>(rows), 256, 0, stream>>>(x, x_stride, w, out, dim, eps);
  return cudaGetLastError();
}

template <typename T>
cudaError_t silu_mul(const T* gate_up, T* out, int64_t rows, int64_t m, cudaStream_t stream) {
  const int64_t n = rows * m;
  if (n == 0) return cudaSuccess;
  const int64_t blocks = (n + 255) / 256 < 65535 ? (n + 255) / 256 : 65535;
  silu_mul_kernel<T><<<static_cast<unsigned>(blocks), 256, 0, stream>>>(gate_up, out, rows, m);
  return cudaGetLastError();
}

#define INSTANTIATE(T)                                                                                     \
  template cudaError_t rms_norm<T>(const T*, int64_t, const T*, T*, int64_t, int64_t, float, cudaStream_t); \
  template cudaError_t silu_mul<T>(const T*, T*, int64_t, int64_t, cudaStream_t);
BLOCKBATCH_CUDA_INSTANTIATE(INSTANTIATE)
#undef INSTANTIATE

}  // namespace blockbatch::cuda
