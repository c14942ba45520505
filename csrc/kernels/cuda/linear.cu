// Y[M, N] = X[M, K] W[N, K]^T for few rows (M <= 64): the weight-streaming GEMM of a decode step
// (bf16 / fp16, fp32 accumulation, sm_90: thread-block clusters).
//
// With 32 query tokens an 8B model's step reads 16 GB of weights and does little arithmetic per
// byte, so the GEMMs should run at DRAM bandwidth; cuBLAS reached about 78% of it on an H200. This
// kernel streams W once, straight from global memory into mma.sync fragments, without shared
// memory or ldmatrix:
//
// - A = W (row-major, K contiguous) and B = X^T (col-major: X rows are K contiguous), so C = W X^T
//   is Y^T in 16 (W rows) x 8 (X rows) tiles.
// - Permuted K: for each chunk of 32 K values, lane 4 g + t loads 16 bytes, K 8t .. 8t + 7, of W
//   rows g and g + 8 and of X row g. Its first two 32-bit words serve as the (2t, 2t + 1) and
//   (2t + 8, 2t + 9) pairs of the first k16 step and the last two as those of the second. A and B
//   use the same map from fragment K to real K in every lane, and a dot product does not care in
//   which order its K terms are visited, so the product is exact (only the fp32 summation order
//   differs from cuBLAS).
// - A block of 4 warps owns 16 RT rows of W; its warps take turns over the 32-wide K chunks
//   (two chunks in flight per warp, 16 x 16-byte loads per lane), then warps 1-3 hand their fp32
//   partial sums to warp 0 through shared memory (added in warp order).
// - Split K across a cluster: the grid's y dimension is one cluster of `splits` blocks, each owning
//   a contiguous K range; block rank 0 adds the other ranks' partial sums from their shared memory
//   (distributed shared memory, rank order) and writes Y. The reduction order is fixed, so the
//   result is deterministic, and nothing goes through global memory or a second launch.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma.cuh"

namespace blockbatch::cuda {

namespace {
namespace cg = cooperative_groups;

constexpr int kWarps = 4, kThreads = kWarps * 32, kChunk = 32, kUnroll = 2, kMaxSplits = 8;

// 16-row W tiles per block for MT 8-row X tiles: 4 x 4 (or 2 x 8) fragments of accumulators.
template <int MT>
constexpr int row_tiles() {
  return MT <= 4 ? 4 : 2;
}

__device__ __forceinline__ uint4 load_stream(const void* p) {  // W: read once, evict first
  return __ldcs(reinterpret_cast<const uint4*>(p));
}
__device__ __forceinline__ uint4 load_shared_by_blocks(const void* p) {  // X: every block reads it
  return __ldg(reinterpret_cast<const uint4*>(p));
}

template <typename T, int MT>
__global__ void __launch_bounds__(kThreads, 2)
    linear_kernel(const T* __restrict__ x, int64_t ldx, const T* __restrict__ w, int64_t ldw, T* __restrict__ y,
                  int64_t ldy, int M, int N, int K) {
  dependent_launch_prologue();
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int RT = row_tiles<MT>(), kAcc = RT * MT * 4;
  __shared__ float part[kWarps - 1][kAcc][32];  // warps 1-3's partial sums, lane-minor (no bank conflicts)

  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank()), splits = static_cast<int>(cluster.num_blocks());
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  const int n0 = blockIdx.x * (16 * RT);
  const int chunks = K / kChunk, per_split = (chunks + splits - 1) / splits;
  const int c_begin = rank * per_split, c_end = min(chunks, c_begin + per_split);

  float acc[RT][MT][4];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) acc[rt][mt][0] = acc[rt][mt][1] = acc[rt][mt][2] = acc[rt][mt][3] = 0.f;

  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int c = c_begin + warp; c < c_end; c += kWarps * kUnroll) {
    uint4 wv[kUnroll][RT][2], xv[kUnroll][MT];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {  // every load of the chunks first, then the arithmetic
      const int cu = c + u * kWarps;
      const bool in = cu < c_end;  // the same for the whole warp
      const int64_t k = static_cast<int64_t>(cu) * kChunk + 8 * t4;
#pragma unroll
      for (int rt = 0; rt < RT; ++rt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int n = n0 + 16 * rt + 8 * h + g;
          wv[u][rt][h] = in && n < N ? load_stream(w + n * ldw + k) : zero;
        }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int m = 8 * mt + g;
        xv[u][mt] = in && m < M ? load_shared_by_blocks(x + m * ldx + k) : zero;
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
#pragma unroll
      for (int rt = 0; rt < RT; ++rt) {
        const uint4 lo = wv[u][rt][0], hi = wv[u][rt][1];  // W rows g and g + 8
        const uint32_t a0[4] = {lo.x, hi.x, lo.y, hi.y}, a1[4] = {lo.z, hi.z, lo.w, hi.w};
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          const uint32_t b0[2] = {xv[u][mt].x, xv[u][mt].y}, b1[2] = {xv[u][mt].z, xv[u][mt].w};
          mma16816<T>(acc[rt][mt], a0, b0);
          mma16816<T>(acc[rt][mt], a1, b1);
        }
      }
  }

  // Warps 1-3 -> warp 0, in warp order.
  float* mine = &acc[0][0][0];
  if (warp > 0) {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) part[warp - 1][i][lane] = mine[i];
  }
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int s = 0; s < kWarps - 1; ++s)
#pragma unroll
      for (int i = 0; i < kAcc; ++i) mine[i] += part[s][i][lane];
  }
  // Ranks 1.. -> rank 0, in rank order. Warp 0 alone touches part[0] after the barrier above.
  if (splits > 1) {
    if (warp == 0 && rank != 0) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) part[0][i][lane] = mine[i];
    }
    cluster.sync();  // the ranks' sums are in their shared memory
    if (warp == 0 && rank == 0) {
      for (int r = 1; r < splits; ++r) {
        const float* remote = cluster.map_shared_rank(&part[0][0][0], r);
#pragma unroll
        for (int i = 0; i < kAcc; ++i) mine[i] += remote[i * 32 + lane];
      }
    }
    cluster.sync();  // no rank exits (freeing its shared memory) before rank 0 has read it
  }
  if (warp != 0 || rank != 0) return;

  // C fragment (rt, mt): c0 = Y^T[g][2t], c1 = Y^T[g][2t + 1], c2 = Y^T[g + 8][2t], c3 = Y^T[g + 8][2t + 1].
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int n = n0 + 16 * rt + g + (e >= 2 ? 8 : 0), m = 8 * mt + 2 * t4 + (e & 1);
        if (n < N && m < M) y[m * ldy + n] = from_f<T>(acc[rt][mt][e]);
      }
#endif
}

template <typename T, int MT>
cudaError_t launch(const T* x, int64_t ldx, const T* w, int64_t ldw, T* y, int64_t ldy, int64_t M, int64_t N,
                   int64_t K, int splits, cudaStream_t stream) {
  constexpr int rows = 16 * row_tiles<MT>();
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = 1;
  cluster.val.clusterDim.y = static_cast<unsigned>(splits);
  cluster.val.clusterDim.z = 1;
  return launch_kernel(linear_kernel<T, MT>, dim3(static_cast<unsigned>((N + rows - 1) / rows), static_cast<unsigned>(splits)),
                       dim3(kThreads), 0, stream, &cluster, x, ldx, w, ldw, y, ldy, static_cast<int>(M),
                       static_cast<int>(N), static_cast<int>(K));
}
}  // namespace

bool linear_small_supported(const void* x, int64_t ldx, const void* w, int64_t ldw, const void* y, int64_t M,
                            int64_t N, int64_t K, int dtype_code, int sm_major) {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const int64_t kIntMax = 2147483647;  // M, N, K travel as int
  return dtype_code != 0 && sm_major >= 9 && M >= 1 && M <= kLinearSmallMaxRows && N >= 1 && N <= kIntMax &&
         K >= kChunk && K <= kIntMax && K % kChunk == 0 && ldx % 8 == 0 && ldw % 8 == 0 && aligned(x) &&
         aligned(w) && aligned(y);
}

namespace {
template <int MT>
int blocks_per_sm() {  // resident blocks of this variant per SM (registers bound it), cached
  static const int n = [] {
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, linear_kernel<__nv_bfloat16, MT>, kThreads, 0) !=
        cudaSuccess) {
      cudaGetLastError();  // clear it: the launch's own checks report real faults
      b = 2;
    }
    return b > 0 ? b : 1;
  }();
  return n;
}
}  // namespace

int linear_small_splits(int64_t M, int64_t N, int64_t K, int sm_count) {
  const int64_t rows = M <= 32 ? 64 : 32, tiles = (N + rows - 1) / rows, chunks = K / kChunk;
  const int per_sm = M <= 8 ? blocks_per_sm<1>() : M <= 16 ? blocks_per_sm<2>() : M <= 32 ? blocks_per_sm<4>()
                                                                                            : blocks_per_sm<8>();
  const int64_t slots = static_cast<int64_t>(sm_count) * per_sm;
  // The split count whose grid fills its last wave of blocks best (a 1.45-wave grid leaves a
  // quarter of the GPU idle at the end), among those that leave every warp at least one full
  // round of kUnroll chunks; a larger count must gain more than 5% of the GPU to be taken.
  int best = 1;
  double best_fill = 0;
  for (int s = 1; s <= kMaxSplits; s *= 2) {
    if (s > 1 && chunks / s < static_cast<int64_t>(kWarps) * kUnroll) break;
    const int64_t ctas = tiles * s, waves = (ctas + slots - 1) / slots;
    const double fill = static_cast<double>(ctas) / static_cast<double>(waves * slots);
    if (fill > best_fill + 0.05) {
      best = s;
      best_fill = fill;
    }
  }
  return best;
}

template <typename T>
cudaError_t linear_small(const T* x, int64_t ldx, const T* w, int64_t ldw, T* y, int64_t ldy, int64_t M, int64_t N,
                         int64_t K, int splits, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, float>) {
    return cudaErrorInvalidValue;  // tensor cores take 16-bit inputs here; float32 stays on cuBLAS
  } else {
    if (splits < 1 || splits > kMaxSplits || M < 1 || M > kLinearSmallMaxRows || K % kChunk != 0) {
      return cudaErrorInvalidValue;
    }
    if (M <= 8) return launch<T, 1>(x, ldx, w, ldw, y, ldy, M, N, K, splits, stream);
    if (M <= 16) return launch<T, 2>(x, ldx, w, ldw, y, ldy, M, N, K, splits, stream);
    if (M <= 32) return launch<T, 4>(x, ldx, w, ldw, y, ldy, M, N, K, splits, stream);
    return launch<T, 8>(x, ldx, w, ldw, y, ldy, M, N, K, splits, stream);
  }
}

#define INSTANTIATE(T)                                                                                          \
  template cudaError_t linear_small<T>(const T*, int64_t, const T*, int64_t, T*, int64_t, int64_t, int64_t,      \
                                       int64_t, int, cudaStream_t);
BLOCKBATCH_CUDA_INSTANTIATE(INSTANTIATE)
#undef INSTANTIATE

}  // namespace blockbatch::cuda
