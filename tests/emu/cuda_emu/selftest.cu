// Kernels with known faults (and their fixed twins), so the tests can show that the CPU emulator
// (cuda_emu.h) catches each kind of fault it claims to: a missing barrier, a missing
// cp.async.wait_group, lanes of a warp in different collectives, a warp collective some lanes
// never reach, launches over the shared-memory or cluster limits.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma.cuh"

namespace {
namespace bc = blockbatch::cuda;

// out[i] = i + 1 through shared memory written by the neighbouring thread.
__global__ void neighbour_kernel(float* out, bool sync) {
  BLOCKBATCH_DYNAMIC_SHARED(float, s);
  const unsigned i = threadIdx.x, n = blockDim.x;
  s[i] = static_cast<float>(i);
  if (sync) __syncthreads();
  out[i] = s[(i + 1) % n];
}

// Each thread copies 16 bytes of `in` into shared memory with cp.async; out = shared contents.
__global__ void copy_kernel(const float* in, float* out, bool wait) {
  BLOCKBATCH_DYNAMIC_SHARED(float, s);
  const unsigned i = threadIdx.x;
  bc::cp_async16(s + 4 * i, in + 4 * i, true);
  bc::cp_async_commit();
  if (wait) bc::cp_async_wait<0>();
  __syncthreads();
  for (int j = 0; j < 4; ++j) out[4 * i + j] = s[4 * ((i + 1) % blockDim.x) + j];
}

// mode 0: every lane shuffles (fine); 1: half the lanes shuffle while the other half are in
// __syncwarp; 2: half the lanes exit before the shuffle.
__global__ void warp_kernel(float* out, int mode) {
  const unsigned lane = threadIdx.x & 31;
  if (mode == 2 && lane >= 16) return;
  float v = static_cast<float>(lane);
  if (mode == 1 && lane >= 16) {
    __syncwarp();
  } else {
    v = __shfl_xor_sync(0xffffffffu, v, 1);
  }
  out[threadIdx.x] = v;
}

__global__ void empty_kernel(int) {}
}  // namespace

extern "C" {
int bbemu_selftest_neighbour(float* out, int threads, int sync) {
  return bc::launch_kernel(neighbour_kernel, 1, threads, threads * sizeof(float), nullptr, out, sync != 0);
}
int bbemu_selftest_copy(const float* in, float* out, int threads, int wait) {
  return bc::launch_kernel(copy_kernel, 1, threads, threads * 16, nullptr, in, out, wait != 0);
}
int bbemu_selftest_warp(float* out, int mode) { return bc::launch_kernel(warp_kernel, 1, 32, 0, nullptr, out, mode); }
// A launch of `shared` bytes of dynamic shared memory (the limit is 48 KB unless raised: `opt_in`
// bytes when > 0) in clusters of cluster_x blocks over grid_x blocks.
int bbemu_selftest_launch(unsigned grid_x, unsigned cluster_x, size_t shared, int opt_in) {
  if (opt_in > 0 && cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, opt_in) != 0) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = cluster_x;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  return ::bbemu::launch(empty_kernel, grid_x, 32, shared, &cluster, 0);  // the emulator's own launch: clusters
}
}  // extern "C"
