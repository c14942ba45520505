// Y[M, N] = X[M, K] W[N, K]^T for few rows (M <= 64): the weight-streaming GEMM of a decode step
// (bf16 / fp16, fp32 accumulation, sm_90: thread-block clusters).
//
// With 32 query tokens an 8B model's step reads 16 GB of weights and does little arithmetic per
// byte, so the GEMMs should run at DRAM bandwidth; cuBLAS reached about 78% of it on an H200. These
// kernels stream W once into mma.sync fragments, without ldmatrix:
//
// - A = W (row-major, K contiguous) and B = X^T (col-major: X rows are K contiguous), so C = W X^T
//   is Y^T in 16 (W rows) x 8 (X rows) tiles.
// - Permuted K: for each chunk of 32 K values, lane 4 g + t loads 16 bytes, K 8t .. 8t + 7, of W
//   rows g and g + 8 and of X row g. Its first two 32-bit words serve as the (2t, 2t + 1) and
//   (2t + 8, 2t + 9) pairs of the first k16 step and the last two as those of the second. A and B
//   use the same map from fragment K to real K in every lane, and a dot product does not care in
//   which order its K terms are visited, so the product is exact (only the fp32 summation order
//   differs from cuBLAS).
// - A block of 4 warps owns 16 RT rows of W; its warps take turns over the 32-wide K chunks, then
//   warps 1-3 hand their fp32 partial sums to warp 0 through shared memory (added in warp order).
// - Split K across a cluster: the grid's y dimension is one cluster of `splits` blocks, each owning
//   a contiguous K range; block rank 0 adds the other ranks' partial sums from their shared memory
//   (distributed shared memory, rank order) and writes Y. The reduction order is fixed, so the
//   result is deterministic, and nothing goes through global memory or a second launch.
//
// Two ways to keep DRAM busy (BLOCKBATCH_GEMM chooses; same fragments, same reductions):
// - "stream" (linear_kernel): each warp loads two chunks straight from global memory into
//   registers (16 x 16 bytes of W per lane), then computes; the bytes in flight are bounded by
//   registers (8 KB per warp, about 64 KB per SM).
// - "staged" (linear_staged_kernel): the block copies 128-wide K stages of its W rows and of X
//   into a ring of kStages shared-memory buffers with cp.async, kStages - 1 stages ahead of the
//   arithmetic, and each warp takes one 32-wide chunk of a stage (16-byte shared loads in the same
//   permuted-K layout; rows padded to an odd multiple of 64 bytes, so a quarter-warp's loads
//   cover all 32 banks). About 120 KB in flight per SM, independent of registers. Needs K % 128.
#include <cooperative_groups.h>  // tests/emu/cuda_emu/include/ has the emulator's
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
constexpr int kStageK = kWarps * kChunk, kStages = 3, kRowPad = 32;  // staged: 128 K per stage
constexpr int kStageLd = kStageK + kRowPad;                         // 320-byte rows: 16 words mod 32

// 16-row W tiles per block for MT 8-row X tiles: 4 x 4 (or 2 x 8) fragments of accumulators.
template <int MT>
constexpr int row_tiles() {
  return MT <= 4 ? 4 : 2;
}
template <int MT>
constexpr size_t reduction_shared_bytes() {  // warps 1-3's partial sums (see reduce_and_store)
  return static_cast<size_t>(kWarps - 1) * row_tiles<MT>() * MT * 4 * 32 * sizeof(float);
}
template <int MT>
constexpr size_t staged_shared_bytes() {  // the ring: per stage 16 RT W rows and 8 MT X rows
  return static_cast<size_t>(kStages) * (16 * row_tiles<MT>() + 8 * MT) * kStageLd * 2;
}
static_assert(staged_shared_bytes<1>() >= reduction_shared_bytes<1>() &&
                  staged_shared_bytes<2>() >= reduction_shared_bytes<2>() &&
                  staged_shared_bytes<4>() >= reduction_shared_bytes<4>() &&
                  staged_shared_bytes<8>() >= reduction_shared_bytes<8>(),
              "the staged kernel reduces in its ring");

__device__ __forceinline__ uint4 load_stream(const void* p) {  // W: read once, evict first
  return __ldcs(reinterpret_cast<const uint4*>(p));
}
__device__ __forceinline__ uint4 load_shared_by_blocks(const void* p) {  // X: every block reads it
  return __ldg(reinterpret_cast<const uint4*>(p));
}

// One 32-wide K chunk: lo / hi = the lane's 16 bytes of W rows g and g + 8 of each row tile, xv =
// of X row g of each 8-row tile (see the permuted-K layout above).
template <typename T, int RT, int MT>
__device__ __forceinline__ void mma_chunk(float (&acc)[RT][MT][4], const uint4 (&lo)[RT], const uint4 (&hi)[RT],
                                          const uint4 (&xv)[MT]) {
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {
    const uint32_t a0[4] = {lo[rt].x, hi[rt].x, lo[rt].y, hi[rt].y}, a1[4] = {lo[rt].z, hi[rt].z, lo[rt].w, hi[rt].w};
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const uint32_t b0[2] = {xv[mt].x, xv[mt].y}, b1[2] = {xv[mt].z, xv[mt].w};
      mma16816<T>(acc[rt][mt], a0, b0);
      mma16816<T>(acc[rt][mt], a1, b1);
    }
  }
}

// Warps 1-3 -> warp 0 (warp order), cluster ranks 1.. -> rank 0 (rank order), rank 0 writes Y.
// `part`: shared memory for (kWarps - 1) * RT * MT * 4 * 32 floats, lane-minor (no bank conflicts).
template <typename T, int RT, int MT>
__device__ __forceinline__ void reduce_and_store(float (&acc)[RT][MT][4], float* part, T* y, int64_t ldy, int M,
                                                 int N, int n0) {
  constexpr int kAcc = RT * MT * 4;
  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank()), splits = static_cast<int>(cluster.num_blocks());
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  float* mine = &acc[0][0][0];
  if (warp > 0) {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) part[((warp - 1) * kAcc + i) * 32 + lane] = mine[i];
  }
  __syncthreads();
  if (warp == 0) {
#pragma unroll
    for (int s = 0; s < kWarps - 1; ++s)
#pragma unroll
      for (int i = 0; i < kAcc; ++i) mine[i] += part[(s * kAcc + i) * 32 + lane];
  }
  // Warp 0 alone touches part[0 .. kAcc) after the barrier above.
  if (splits > 1) {
    if (warp == 0 && rank != 0) {
#pragma unroll
      for (int i = 0; i < kAcc; ++i) part[i * 32 + lane] = mine[i];
    }
    cluster.sync();  // the ranks' sums are in their shared memory
    if (warp == 0 && rank == 0) {
      for (int r = 1; r < splits; ++r) {
        const float* remote = cluster.map_shared_rank(part, r);
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
}

template <int RT, int MT>
__device__ __forceinline__ void zero(float (&acc)[RT][MT][4]) {
#pragma unroll
  for (int rt = 0; rt < RT; ++rt)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) acc[rt][mt][0] = acc[rt][mt][1] = acc[rt][mt][2] = acc[rt][mt][3] = 0.f;
}

template <typename T, int MT>
__global__ void __launch_bounds__(kThreads, 2)
    linear_kernel(const T* __restrict__ x, int64_t ldx, const T* __restrict__ w, int64_t ldw, T* __restrict__ y,
                  int64_t ldy, int M, int N, int K) {
  dependent_launch_prologue();
#if (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900) || defined(BLOCKBATCH_CUDA_EMULATION)
  constexpr int RT = row_tiles<MT>();
  // Dynamic (reduction_shared_bytes), as distributed shared memory is addressed in the emulator.
  BLOCKBATCH_DYNAMIC_SHARED(float, part);

  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank()), splits = static_cast<int>(cluster.num_blocks());
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  const int n0 = blockIdx.x * (16 * RT);
  const int chunks = K / kChunk, per_split = (chunks + splits - 1) / splits;
  const int c_begin = rank * per_split, c_end = min(chunks, c_begin + per_split);

  float acc[RT][MT][4];
  zero(acc);
  const uint4 none = make_uint4(0, 0, 0, 0);
  for (int c = c_begin + warp; c < c_end; c += kWarps * kUnroll) {
    uint4 lo[kUnroll][RT], hi[kUnroll][RT], xv[kUnroll][MT];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {  // every load of the chunks first, then the arithmetic
      const int cu = c + u * kWarps;
      const bool in = cu < c_end;  // the same for the whole warp
      const int64_t k = static_cast<int64_t>(cu) * kChunk + 8 * t4;
#pragma unroll
      for (int rt = 0; rt < RT; ++rt) {
        const int n = n0 + 16 * rt + g;
        lo[u][rt] = in && n < N ? load_stream(w + n * ldw + k) : none;
        hi[u][rt] = in && n + 8 < N ? load_stream(w + (n + 8) * ldw + k) : none;
      }
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const int m = 8 * mt + g;
        xv[u][mt] = in && m < M ? load_shared_by_blocks(x + m * ldx + k) : none;
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) mma_chunk<T, RT, MT>(acc, lo[u], hi[u], xv[u]);
  }
  reduce_and_store<T, RT, MT>(acc, part, y, ldy, M, N, n0);
#endif
}

template <typename T, int MT>
__global__ void __launch_bounds__(kThreads, 2)
    linear_staged_kernel(const T* __restrict__ x, int64_t ldx, const T* __restrict__ w, int64_t ldw,
                         T* __restrict__ y, int64_t ldy, int M, int N, int K) {
  dependent_launch_prologue();
#if (defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900) || defined(BLOCKBATCH_CUDA_EMULATION)
  constexpr int RT = row_tiles<MT>(), BN = 16 * RT, BM = 8 * MT, kStageElems = (BN + BM) * kStageLd;
  constexpr int kPieces = kStageK / 8;  // 16-byte pieces per staged row
  BLOCKBATCH_DYNAMIC_SHARED(unsigned char, smem_raw);
  T* ring = reinterpret_cast<T*>(smem_raw);

  const cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank()), splits = static_cast<int>(cluster.num_blocks());
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t4 = lane & 3;
  const int n0 = blockIdx.x * BN;
  const int stages = K / kStageK, per_split = (stages + splits - 1) / splits;
  const int s_begin = rank * per_split, count = max(0, min(stages, s_begin + per_split) - s_begin);

  // Stage j of this block's K range -> ring slot j % kStages; rows past N or M are zero-filled.
  auto load_stage = [&](int j) {
    T* ws = ring + (j % kStages) * kStageElems;
    T* xs = ws + BN * kStageLd;
    const int64_t k0 = static_cast<int64_t>(s_begin + j) * kStageK;
    for (int i = threadIdx.x; i < BN * kPieces; i += kThreads) {
      const int r = i / kPieces, p = i % kPieces, n = n0 + r;
      cp_async16(ws + r * kStageLd + p * 8, n < N ? w + n * ldw + k0 + p * 8 : w, n < N);
    }
    for (int i = threadIdx.x; i < BM * kPieces; i += kThreads) {
      const int r = i / kPieces, p = i % kPieces;
      cp_async16(xs + r * kStageLd + p * 8, r < M ? x + r * ldx + k0 + p * 8 : x, r < M);
    }
  };
#pragma unroll
  for (int j = 0; j < kStages - 1; ++j) {
    if (j < count) load_stage(j);
    cp_async_commit();  // one group per stage, empty past the end: the wait below counts groups
  }
  float acc[RT][MT][4];
  zero(acc);
  const int kk = warp * kChunk + 8 * t4;  // this lane's 16 bytes of each staged row
  for (int j = 0; j < count; ++j) {
    cp_async_wait<kStages - 2>();  // stage j has landed (this thread's copies) ...
    __syncthreads();               // ... everyone's; and every warp is done with stage j - 1
    if (j + kStages - 1 < count) load_stage(j + kStages - 1);  // into stage j - 1's slot
    cp_async_commit();
    const T* ws = ring + (j % kStages) * kStageElems;
    const T* xs = ws + BN * kStageLd;
    uint4 lo[RT], hi[RT], xv[MT];
#pragma unroll
    for (int rt = 0; rt < RT; ++rt) {
      lo[rt] = *reinterpret_cast<const uint4*>(ws + (16 * rt + g) * kStageLd + kk);
      hi[rt] = *reinterpret_cast<const uint4*>(ws + (16 * rt + 8 + g) * kStageLd + kk);
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) xv[mt] = *reinterpret_cast<const uint4*>(xs + (8 * mt + g) * kStageLd + kk);
    mma_chunk<T, RT, MT>(acc, lo, hi, xv);
  }
  cp_async_wait<0>();
  __syncthreads();  // the ring is free: its start holds the reduction
  reduce_and_store<T, RT, MT>(acc, reinterpret_cast<float*>(smem_raw), y, ldy, M, N, n0);
#endif
}

template <typename T, int MT>
cudaError_t launch(const T* x, int64_t ldx, const T* w, int64_t ldw, T* y, int64_t ldy, int64_t M, int64_t N,
                   int64_t K, int splits, bool staged, cudaStream_t stream) {
  constexpr int rows = 16 * row_tiles<MT>();
  cudaLaunchAttribute cluster;
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = 1;
  cluster.val.clusterDim.y = static_cast<unsigned>(splits);
  cluster.val.clusterDim.z = 1;
  const dim3 grid(static_cast<unsigned>((N + rows - 1) / rows), static_cast<unsigned>(splits));
  if (staged) {
    const cudaError_t e = allow_shared_memory<linear_staged_kernel<T, MT>>(staged_shared_bytes<MT>());
    if (e != cudaSuccess) return e;
    return launch_kernel(linear_staged_kernel<T, MT>, grid, dim3(kThreads), staged_shared_bytes<MT>(), stream,
                         &cluster, x, ldx, w, ldw, y, ldy, static_cast<int>(M), static_cast<int>(N),
                         static_cast<int>(K));
  }
  return launch_kernel(linear_kernel<T, MT>, grid, dim3(kThreads), reduction_shared_bytes<MT>(), stream, &cluster,
                       x, ldx, w, ldw, y, ldy,
                       static_cast<int>(M), static_cast<int>(N), static_cast<int>(K));
}

template <int MT>
int blocks_per_sm(bool staged) {  // resident blocks of a variant per SM (registers / shared memory), cached
  auto query = [](auto kernel, size_t shared) {
    int b = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, kThreads, shared) != cudaSuccess) {
      cudaGetLastError();  // clear it: the launch's own checks report real faults
      b = 2;
    }
    return b > 0 ? b : 1;
  };
  static const int plain = query(linear_kernel<__nv_bfloat16, MT>, reduction_shared_bytes<MT>());
  static const int ring = [&] {
    if (allow_shared_memory<linear_staged_kernel<__nv_bfloat16, MT>>(staged_shared_bytes<MT>()) != cudaSuccess) {
      cudaGetLastError();
      return 1;
    }
    return query(linear_staged_kernel<__nv_bfloat16, MT>, staged_shared_bytes<MT>());
  }();
  return staged ? ring : plain;
}
}  // namespace

bool linear_small_supported(const void* x, int64_t ldx, const void* w, int64_t ldw, const void* y, int64_t M,
                            int64_t N, int64_t K, int dtype_code, int sm_major) {
  const int64_t kIntMax = 2147483647;  // M, N, K travel as int
  return dtype_code != 0 && sm_major >= 9 && M >= 1 && M <= kLinearSmallMaxRows && N >= 1 && N <= kIntMax &&
         K >= kChunk && K <= kIntMax && K % kChunk == 0 && ldx % 8 == 0 && ldw % 8 == 0 && aligned16(x) &&
         aligned16(w) && aligned16(y);
}

int linear_small_splits(int64_t M, int64_t N, int64_t K, int sm_count, bool staged) {
  staged = staged && K % kStageK == 0;
  const int64_t rows = M <= 32 ? 64 : 32, tiles = (N + rows - 1) / rows;
  const int per_sm = M <= 8 ? blocks_per_sm<1>(staged) : M <= 16 ? blocks_per_sm<2>(staged)
                     : M <= 32 ? blocks_per_sm<4>(staged) : blocks_per_sm<8>(staged);
  const int64_t slots = static_cast<int64_t>(sm_count) * per_sm;
  // Every split keeps a full round of loads: kUnroll chunks per warp, or the staged ring's depth.
  const int64_t units = staged ? K / kStageK : K / kChunk, min_units = staged ? kStages : kWarps * kUnroll;
  // The split count whose grid fills its last wave of blocks best (a 1.45-wave grid leaves a
  // quarter of the GPU idle at the end); a larger count must gain more than 5% of the GPU.
  int best = 1;
  double best_fill = 0;
  for (int s = 1; s <= kMaxSplits; s *= 2) {
    if (s > 1 && units / s < min_units) break;
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
                         int64_t K, int splits, bool staged, cudaStream_t stream) {
  if constexpr (std::is_same_v<T, float>) {
    return cudaErrorInvalidValue;  // tensor cores take 16-bit inputs here; float32 stays on cuBLAS
  } else {
    if (splits < 1 || splits > kMaxSplits || M < 1 || M > kLinearSmallMaxRows || K % kChunk != 0) {
      return cudaErrorInvalidValue;
    }
    staged = staged && K % kStageK == 0;
    if (M <= 8) return launch<T, 1>(x, ldx, w, ldw, y, ldy, M, N, K, splits, staged, stream);
    if (M <= 16) return launch<T, 2>(x, ldx, w, ldw, y, ldy, M, N, K, splits, staged, stream);
    if (M <= 32) return launch<T, 4>(x, ldx, w, ldw, y, ldy, M, N, K, splits, staged, stream);
    return launch<T, 8>(x, ldx, w, ldw, y, ldy, M, N, K, splits, staged, stream);
  }
}

#define INSTANTIATE(T)                                                                                          \
  template cudaError_t linear_small<T>(const T*, int64_t, const T*, int64_t, T*, int64_t, int64_t, int64_t,      \
                                       int64_t, int, bool, cudaStream_t);
BLOCKBATCH_CUDA_INSTANTIATE(INSTANTIATE)
#undef INSTANTIATE

}  // namespace blockbatch::cuda
