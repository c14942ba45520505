// A CUDA emulator for testing the kernels of csrc/kernels/cuda/ on a CPU (no GPU needed).
//
// The kernel sources are compiled unchanged by the host C++ compiler with this header forced in
// front (-include) and BLOCKBATCH_CUDA_EMULATION defined. Each emulated GPU thread runs as a
// fiber: a block's threads (a cluster's, for cluster launches) run together, one at a time, each
// until it reaches a barrier or a warp collective, in an order shuffled by a seed, so a kernel
// that reads shared memory another thread writes without a barrier in between gets different
// results under different seeds. What it models, and what it checks:
//
// - __syncthreads, cluster.sync, warp collectives (__shfl_xor_sync, mma.sync m16n8k16, ldmatrix
//   x4 / x4.trans) as barriers over the threads that must take part; a kernel where they never
//   all arrive (a barrier in divergent code, lanes of one warp in different collectives) fails
//   the launch with a message instead of hanging.
// - mma.sync operands and results in the PTX fragment layouts (products summed in double,
//   added to the fp32 accumulator); ldmatrix in its lane / row layouts; 16-byte alignment of
//   every ldmatrix row and cp.async address.
// - cp.async: the source is read when the copy is issued, the destination written only when
//   the issuing thread's cp.async.wait_group retires its group, so a missing wait (or a missing
//   barrier after it) shows up as stale data.
// - Dynamic shared memory per block, filled with 0xff bytes (NaN in every float type) before the
//   launch; distributed shared memory (cluster.map_shared_rank) between a cluster's blocks.
//   Static __shared__ variables are C++ statics: blocks of a launch without clusters run one at
//   a time, so they behave as per-block memory; kernels launched in clusters must keep their
//   shared memory in the dynamic allocation (checked by map_shared_rank).
// - Launch limits: block size, dynamic shared memory over 48 KB only after
//   cudaFuncSetAttribute(MaxDynamicSharedMemorySize), cluster shapes that divide the grid and
//   hold at most 8 blocks.
//
// Not modelled: timing, the memory model beyond barrier order (all threads see one memory),
// precision of approximate intrinsics (__expf is expf).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <tuple>
#include <type_traits>
#include <utility>

#ifndef BLOCKBATCH_CUDA_EMULATION
#define BLOCKBATCH_CUDA_EMULATION 1
#endif

namespace bbemu {

struct Index {
  uint3 thread, block;
  dim3 block_dim, grid_dim;
};
const Index& index();  // of the running emulated thread
unsigned lane();

void sync_block();
void sync_warp();
void sync_cluster();
unsigned cluster_rank();
unsigned cluster_blocks();
void* cluster_map(const void* p, unsigned rank);
void* dynamic_shared();

// A warp collective of kind `kind`: every lane passes `bytes` (<= kSlot) bytes; returns the 32
// lanes' bytes (lane l's at l * kSlot), readable until this lane's next collective.
constexpr size_t kSlot = 64;
const unsigned char* warp_exchange(const char* kind, const void* mine, size_t bytes);

void mma16816(float* c, const uint32_t* a, const uint32_t* b, bool bf16);
void ldmatrix_x4(uint32_t* r, const void* p, bool trans);
void cp_async16(void* dst, const void* src, bool valid);
void cp_async_commit();
void cp_async_wait(int n);

// Records the launch's first error (the launch then returns cudaErrorLaunchFailure and
// bbemu_last_error() says why) and stops the emulated thread.
[[noreturn]] void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

struct LaunchConfig {
  dim3 grid, block, cluster;
  size_t shared;
  const void* kernel;
};
cudaError_t run(const LaunchConfig& config, const std::function<void()>& body);

template <typename T>
T shfl_xor(unsigned mask, T v, int lane_mask) {
  static_assert(sizeof(T) <= kSlot, "one lane's value must fit a slot");
  if (mask != 0xffffffffu) fail("__shfl_xor_sync with mask %#x: only full warps are emulated", mask);
  const unsigned char* all = warp_exchange("shfl_xor", &v, sizeof(T));
  T r;
  std::memcpy(&r, all + kSlot * ((lane() ^ static_cast<unsigned>(lane_mask)) & 31u), sizeof(T));
  return r;
}

template <typename... Params, typename... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared, const cudaLaunchAttribute* extra,
                   Args&&... args) {
  LaunchConfig c{grid, block, dim3(1, 1, 1), shared, reinterpret_cast<const void*>(kernel)};
  if (extra != nullptr && extra->id == cudaLaunchAttributeClusterDimension) {
    c.cluster = dim3(extra->val.clusterDim.x, extra->val.clusterDim.y, extra->val.clusterDim.z);
  }
  std::tuple<std::decay_t<Params>...> params(std::forward<Args>(args)...);
  return run(c, [&] { std::apply(kernel, params); });  // each thread gets its own copies
}

}  // namespace bbemu

#define threadIdx (::bbemu::index().thread)
#define blockIdx (::bbemu::index().block)
#define blockDim (::bbemu::index().block_dim)
#define gridDim (::bbemu::index().grid_dim)

#undef __shared__
#define __shared__ static
#undef __launch_bounds__
#define __launch_bounds__(...)

// The typed runtime-API overloads nvcc provides (the toolkit declares them for __CUDACC__ only).
template <typename T>
inline cudaError_t cudaFuncSetAttribute(T* kernel, cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}

inline void __syncthreads() { ::bbemu::sync_block(); }
inline void __syncwarp(unsigned = 0xffffffffu) { ::bbemu::sync_warp(); }
template <typename T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int = 32) {
  return ::bbemu::shfl_xor(mask, v, lane_mask);
}
inline float __expf(float x) { return std::exp(x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __fadd_rn(float a, float b) { return a + b; }  // built with -ffp-contract=off
inline float __fmul_rn(float a, float b) { return a * b; }
template <typename T>
inline T __ldg(const T* p) { return *p; }
inline size_t __cvta_generic_to_shared(const void* p) { return reinterpret_cast<size_t>(p); }
// Fibers never run at the same time, so plain read-modify-writes are atomic.
template <typename T>
inline T atomicAdd(T* p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}
template <typename T>
inline T atomicMin(T* p, T v) {
  const T old = *p;
  *p = std::min(old, v);
  return old;
}
template <typename T>
inline T atomicMax(T* p, T v) {
  const T old = *p;
  *p = std::max(old, v);
  return old;
}
using std::isfinite;
using std::isinf;
using std::isnan;
using std::max;
using std::min;
