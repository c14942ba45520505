// Kernel launches: every kernel of csrc/kernels/cuda/ is launched through launch_kernel, so that
// under the CPU emulator (tests/emu/cuda_emu/) it runs there instead.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <utility>

namespace blockbatch::cuda {

// kernel<<<grid, block, shared, stream>>>(args...). Under the CPU emulator the kernel runs there,
// synchronously.
template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared, cudaStream_t stream,
                          Args&&... args) {
#ifdef BLOCKBATCH_CUDA_EMULATION
  (void)stream;
  return ::bbemu::launch(kernel, grid, block, shared, nullptr, std::forward<Args>(args)...);
#else
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = shared;
  cfg.stream = stream;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
#endif
}

// Lets `Kernel` use `bytes` (> 48 KB) of dynamic shared memory on the current device: the attribute
// is set once per device and kernel (the first call is an eager warm-up, never inside a capture).
template <auto Kernel>
cudaError_t allow_shared_memory(size_t bytes) {
  static std::atomic<uint64_t> done{0};  // one bit per device
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  const uint64_t bit = uint64_t{1} << (device & 63);
  if (!(done.load() & bit)) {
    e = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    if (e != cudaSuccess) return e;
    done.fetch_or(bit);
  }
  return cudaSuccess;
}

}  // namespace blockbatch::cuda
