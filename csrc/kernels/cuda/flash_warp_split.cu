// Tensor-core attention, variant 4: the 3-stage kernel (flash_tiles.cu) with the warp split
// (flash_common.cuh has the algorithm and the building blocks).
//
// A q-tile of at most 16 (32) queries, which leaves 3 (2) of the 4 warps idle in the 3-stage
// kernel, gives its 16-query group 4 (2) warps instead, each computing S and P V over its own
// quarter (half) of every key tile with its own online softmax; at the end the group's warps
// merge (m, l, O) in part order through the ring (SoftmaxState::merge), as combine_kernel merges
// splits. A partial tile's work per key tile then takes a quarter (half) of the time. Same math;
// the summation order differs, so equal to the other variants within rounding, not bit for bit.
// With 2-8 key splits, a (q-tile, head)'s splits are launched as one thread-block cluster and
// rank 0 merges their states from the others' shared memory (SoftmaxState::combine: combine_kernel's
// arithmetic, in split order) and writes the output: no fp32 workspace round trip, no second launch.
#include <cooperative_groups.h>  // tests/emu/cuda_emu/include/ has the emulator's

#include "kernels/cuda/flash_common.cuh"

namespace blockbatch::cuda::flash {

namespace {

constexpr int kStages = 3;

template <typename T, int HD>
__global__ void __launch_bounds__(kThreads) flash_warp_split_kernel(cpu::AttentionArgs a, int splits, float* part,
                                                                    int64_t tokens, bool cluster_merge) {
  dependent_launch_prologue();
  BLOCKBATCH_DYNAMIC_SHARED(unsigned char, smem_raw);
  const Ring<T, HD, kStages> ring(smem_raw);

  Work<T, HD> w;
  if (!w.locate(a, splits)) return;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  // Warp roles: a tile of at most 16 (32) queries gives its one (each of its two) 16-query
  // group(s) 4 (2) warps, each taking a contiguous quarter (half) of every 64-key tile; a larger
  // tile gives warp w queries [16 w, 16 w + 16) and every key, as in the 3-stage kernel.
  const int nq16 = static_cast<int>((w.nq + 15) / 16);
  const int wpg = nq16 <= 1 ? kWarps : nq16 <= 2 ? kWarps / 2 : 1;  // warps per group
  const int gq = warp / wpg, kp = warp % wpg;                        // this warp's query group and key part
  const KeyPart part_of_tile{kp, (kBlockK / 8) / wpg};               // its 8-key column tiles of each key tile

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {  // in flight while the Q tile is staged
    if (s < w.ntiles) load_kv_async(w, w.kb + s * kBlockK, ring.k(s), ring.v(s), tid);
    cp_async_commit();  // one group per tile, empty past the end: the waits below count groups
  }
  uint32_t qa[HD / 16][4];
  load_q(w, a.q_stride, ring.qs, gq, tid, g, t4, qa);

  const float scale = score_scale<HD>();
  SoftmaxState<HD> st;
  st.init();
  for (int64_t t = 0; t < w.ntiles; ++t) {  // the 3-stage pipeline of flash_tiles.cu
    const int64_t k0 = w.kb + t * kBlockK;
    const int stage = static_cast<int>(t % kStages);
    cp_async_wait<kStages - 2>();
    __syncthreads();
    if (t + kStages - 1 < w.ntiles) {
      const int next = static_cast<int>((t + kStages - 1) % kStages);
      load_kv_async(w, k0 + (kStages - 1) * kBlockK, ring.k(next), ring.v(next), tid);
    }
    cp_async_commit();
    if (gq * 16 >= w.nq) continue;  // a group past the row's last query only loads
    attend_tile<T, HD, true, true>(st, qa, ring.k(stage), ring.v(stage), k0, w.ke, scale, part_of_tile, lane);
  }
  st.quad_sum();

  constexpr int kState = SoftmaxState<HD>::kFloats;  // per lane, lane-minor in shared memory
  bool holder = true;                                // this warp holds its query group's state
  if (wpg > 1) {  // the same in the whole block: merge each group's key parts into its first warp
    cp_async_wait<0>();
    __syncthreads();  // every warp is done with the ring, which now holds the parts' states
    float* state = reinterpret_cast<float*>(smem_raw);
    if (kp != 0) st.store(state + warp * kState * 32 + lane);
    __syncthreads();
    holder = kp == 0;
    for (int p = 1; holder && p < wpg; ++p) st.merge(state + (warp + p) * kState * 32 + lane);  // in part order
  }
  const int64_t i0 = gq * 16 + g, i1 = i0 + 8;
  const bool row0 = holder && i0 < w.nq, row1 = holder && i1 < w.nq;
  if (cluster_merge) {  // the key splits of this (q-tile, head) are one cluster: rank 0 merges
    const cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    const unsigned rank = cluster.block_rank(), ranks = cluster.num_blocks();
    cp_async_wait<0>();
    __syncthreads();  // the ring is free (after the warp merge's reads too: its own region)
    float* cstate = reinterpret_cast<float*>(smem_raw) + kWarps * kState * 32;  // per query group
    if (holder) st.store(cstate + gq * kState * 32 + lane);
    cluster.sync();             // every rank's state is in its shared memory
    if (rank == 0 && holder) {  // combine_kernel's arithmetic, in rank (= split) order
      st.combine(ranks, [&](unsigned s) { return cluster.map_shared_rank(cstate, s) + gq * kState * 32 + lane; });
      write_output<T, HD>(a, w.h, w.q0, i0, i1, row0, row1, t4, st.o, [&](float v, int row) {
        const float L = row ? st.l1 : st.l0;
        return L > 0.0f ? v / L : 0.0f;
      });
    }
    cluster.sync();  // no rank exits (freeing its shared memory) before rank 0 has read it
    return;
  }
  if (splits > 1) {
    write_partial<HD>(part, tokens, a.heads, w.h, w.q0, i0, i1, row0, row1, t4, st);
  } else {
    write_normalised<T, HD>(a, w.h, w.q0, i0, i1, row0, row1, t4, st);
  }
}

}  // namespace

template <typename T, int HD>
cudaError_t launch_warp_split(const cpu::AttentionArgs& a, int64_t tokens, int splits, float* part,
                              cudaStream_t stream) {
  constexpr size_t shared = shared_elems<HD, kStages>() * sizeof(T);
  static_assert(shared >= 2 * kWarps * SoftmaxState<HD>::kFloats * 32 * sizeof(float), "the ring holds the merges");
  if (shared > 48 * 1024) {
    const cudaError_t e = allow_shared_memory<flash_warp_split_kernel<T, HD>>(shared);
    if (e != cudaSuccess) return e;
  }
  const dim3 grid = tile_grid(a, tokens, splits);
  if (splits > 1 && splits <= kMaxClusterSplits) {  // merged in the cluster: no combine pass
    cudaLaunchAttribute cluster;
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = 1;
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = static_cast<unsigned>(splits);
    return launch_kernel(flash_warp_split_kernel<T, HD>, grid, kThreads, shared, stream, &cluster, a, splits, part,
                         tokens, true);
  }
  const cudaError_t e = launch_kernel(flash_warp_split_kernel<T, HD>, grid, kThreads, shared, stream, nullptr, a,
                                      splits, part, tokens, false);
  if (splits == 1 || e != cudaSuccess) return e;
  return launch_combine<T, HD>(a, tokens, splits, part, stream);
}

#define INSTANTIATE(T, HD) \
  template cudaError_t launch_warp_split<T, HD>(const cpu::AttentionArgs&, int64_t, int, float*, cudaStream_t);
INSTANTIATE(__nv_bfloat16, 64)
INSTANTIATE(__nv_bfloat16, 128)
INSTANTIATE(__half, 64)
INSTANTIATE(__half, 128)
#undef INSTANTIATE

}  // namespace blockbatch::cuda::flash
