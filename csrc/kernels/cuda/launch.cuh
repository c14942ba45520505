// Kernel launches with programmatic dependent launch (PDL, sm_90+), for the kernels of a forward.
//
// In a captured step about 420 kernels run back to back and each boundary leaves the GPU idle for
// about a microsecond (launch, block scheduling, the prologue), 3-7% of a replay. A kernel
// launched with programmatic stream serialization may be scheduled while the kernel before it is
// still running: its blocks start, run up to griddepcontrol.wait, and wait there until the
// previous grid has completed and its memory is visible. Every kernel launched this way therefore
// calls `dependent_launch_prologue()` first, before it reads or writes global memory (a buffer
// it writes may still be read by the previous kernel), and so waits for the whole previous grid:
// stream order is kept, only the launch latency overlaps. The prologue also lets the next kernel
// launch early (launch_dependents). Without the launch attribute, or on older GPUs, both
// instructions do nothing.
//
// The attribute is on while programmatic_launch() is (default off). The kernels read no settings:
// the ops layer sets the flag from BLOCKBATCH_PDL before it launches (ops/cuda/settings.cpp, per op
// so one process can time both; python/blockbatch/settings.py has the variable's row).
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <utility>

namespace blockbatch::cuda {

// Whether launch_kernel adds the PDL attribute (launch.cu: a process-wide flag, off at start).
bool programmatic_launch();
void set_programmatic_launch(bool on);

__device__ __forceinline__ void dependent_launch_prologue() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// kernel<<<grid, block, shared, stream>>>(args...) with `extra` (one more launch attribute: a
// cluster shape; or nullptr) and, when `pdl`, programmatic stream serialization. Under the CPU
// emulator (tests/emu/cuda_emu/) the kernel runs there, synchronously (PDL is not modelled).
template <typename... Params, typename... Args>
cudaError_t launch_with(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared, cudaStream_t stream,
                        const cudaLaunchAttribute* extra, bool pdl, Args&&... args) {
#ifdef BLOCKBATCH_CUDA_EMULATION
  (void)stream, (void)pdl;
  return ::bbemu::launch(kernel, grid, block, shared, extra, std::forward<Args>(args)...);
#else
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = shared;
  cfg.stream = stream;
  cudaLaunchAttribute attrs[2];
  unsigned n = 0;
  if (extra != nullptr) attrs[n++] = *extra;
  if (pdl) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = n ? attrs : nullptr;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
#endif
}

// A kernel of the forward (it starts with dependent_launch_prologue()): with the PDL attribute
// when enabled.
template <typename... Params, typename... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared, cudaStream_t stream,
                          const cudaLaunchAttribute* extra, Args&&... args) {
  return launch_with(kernel, grid, block, shared, stream, extra, programmatic_launch(), std::forward<Args>(args)...);
}

// A kernel that does not start with dependent_launch_prologue(): never with the PDL attribute.
template <typename... Params, typename... Args>
cudaError_t launch_plain(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared, cudaStream_t stream,
                         Args&&... args) {
  return launch_with(kernel, grid, block, shared, stream, nullptr, false, std::forward<Args>(args)...);
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
