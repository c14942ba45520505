// Device helpers shared by the CUDA kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

// The block's dynamic shared memory as `T name[]` (16-byte aligned). Under the CPU emulator
// (tests/emu/cuda_emu/) a pointer to the emulated block's allocation.
#ifdef BLOCKBATCH_CUDA_EMULATION
#define BLOCKBATCH_DYNAMIC_SHARED(T, name) T* name = static_cast<T*>(::bbemu::dynamic_shared())
#else
#define BLOCKBATCH_DYNAMIC_SHARED(T, name) extern __shared__ __align__(16) T name[]
#endif

namespace blockbatch::cuda {

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T from_f(float v);
template <>
__device__ __forceinline__ float from_f<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float v) {
  return __float2bfloat16(v);
}
template <>
__device__ __forceinline__ __half from_f<__half>(float v) {
  return __float2half(v);
}

struct SumOp {
  template <typename V>
  __device__ __forceinline__ V operator()(V a, V b) const {
    return a + b;
  }
};
struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <typename V, typename Op>
__device__ __forceinline__ V warp_reduce(V v, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide reduction with `op` (identity: the value threads past the last warp contribute);
// `scratch` holds >= 32 values. All threads get the result.
template <typename V, typename Op>
__device__ __forceinline__ V block_reduce(V v, V* scratch, Op op, V identity) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  v = warp_reduce(v, op);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = threadIdx.x < warps ? scratch[threadIdx.x] : identity;
  if (warp == 0) v = warp_reduce(v, op);
  if (threadIdx.x == 0) scratch[0] = v;
  __syncthreads();
  return scratch[0];
}

template <typename V>
__device__ __forceinline__ V block_sum(V v, V* scratch) {
  return block_reduce(v, scratch, SumOp{}, V(0));
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  return block_reduce(v, scratch, MaxOp{}, -INFINITY);
}

// Whether p is 16-byte aligned (the vectorized kernels' loads and stores need it).
__host__ __device__ __forceinline__ bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Row r such that cu[r] <= t < cu[r + 1] (cu is non-decreasing, cu[0] = 0).
__device__ __forceinline__ int64_t row_of(const int64_t* cu, int64_t rows, int64_t t) {
  int64_t lo = 0, hi = rows - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (cu[mid] <= t) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

}  // namespace blockbatch::cuda

#define BLOCKBATCH_CUDA_INSTANTIATE(MACRO) \
  MACRO(float)                             \
  MACRO(__nv_bfloat16)                     \
  MACRO(__half)
