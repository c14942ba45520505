// Helpers shared by the CUDA implementations of the ops (ops/cuda/*.cpp): the dtype switch, raw
// pointers, launch errors as exceptions, cached device attributes.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>

namespace blockbatch::cuda_ops {

// Calls fn with a null pointer of the CUDA storage type matching `type` (float, bf16, half).
template <typename Fn>
inline void dispatch_cuda_type(c10::ScalarType type, const char* op, Fn&& fn) {
  switch (type) {
    case at::kFloat: fn(static_cast<float*>(nullptr)); break;
    case at::kBFloat16: fn(static_cast<__nv_bfloat16*>(nullptr)); break;
    case at::kHalf: fn(static_cast<__half*>(nullptr)); break;
    default: TORCH_CHECK(false, op, ": unsupported dtype ", type);
  }
}

template <typename T>
inline T* ptr(const at::Tensor& t) {
  return reinterpret_cast<T*>(t.data_ptr());
}

inline void check_launch(cudaError_t e, const char* op) {
  TORCH_CHECK(e == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(e));
}

// A device attribute the attention launch needs (compute capability, SM count): a host-side query,
// no stream sync, cached per device after the first call (an eager warm-up, never a capture).
// Not ATen's CUDAContext.h: it pulls cuBLAS / cuSPARSE headers the toolkit may not ship.
template <cudaDeviceAttr kAttr>
inline int device_attribute(int device) {
  static std::atomic<int> cache[64] = {};
  std::atomic<int>& slot = cache[device & 63];
  int n = slot.load();
  if (n == 0) {
    check_launch(cudaDeviceGetAttribute(&n, kAttr, device), "cudaDeviceGetAttribute");
    slot.store(n);
  }
  return n;
}

inline void check_cuda(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor, got ", t.device());
}

}  // namespace blockbatch::cuda_ops
