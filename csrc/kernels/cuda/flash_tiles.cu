// Tensor-core attention, variants 1-3 (flash_common.cuh has the algorithm and the building
// blocks): each of the 4 warps owns 16 queries of the 64-query tile and every key. Variant 3 is
// the default (BLOCKBATCH_ATTN_KERNEL=pipelined3; step replay 0.96-0.99x variant 2's on an H200,
// docs/bench/gpu/NOTES.md); variant 1 is the bit-for-bit reference of the other two.
//
// - kStages = 1 (variant 1): each K/V tile is loaded through registers into shared memory, and the
//   K and V fragments are read by 32-bit / 16-bit shared loads.
// - Pipelined (kStages >= 2): the K/V tiles are copied global -> shared with cp.async into kStages
//   stages, and the K and V fragments come from shared memory by ldmatrix (x4; .trans for V).
//   - kStages = 2 (variant 2): tile t + 1 is in flight while tile t is computed (a barrier after
//     each tile, as its stage is refilled next).
//   - kStages = 3 (variant 3): tiles t + 1 and t + 2 are in flight while tile t is computed: each
//     tile costs about half a DRAM round trip instead of a whole one when the loads, not the
//     arithmetic, set the pace (few queries per row over long rows: a decode step). The Q tile is
//     staged through the third stage's buffer before the loop (its fragments then live in
//     registers), so the shared memory is 3 K/V stages (104 KB at head_dim 128: two blocks per SM,
//     as with 2 stages). The prefetch of tile t + 2 goes into tile t - 1's stage after the barrier
//     that opens tile t, which also orders it after every warp's last read of that stage: one
//     barrier per tile. Warps whose 16 queries are all past the row's end skip the arithmetic.
// The same arithmetic in the same order in all three: they agree bit for bit.
#include "kernels/cuda/flash_common.cuh"

namespace blockbatch::cuda::flash {

namespace {

template <typename T, int HD, int kStages>
__global__ void __launch_bounds__(kThreads)
    flash_tiles_kernel(cpu::AttentionArgs a, int splits, float* part, int64_t tokens) {
  constexpr bool kPipe = kStages >= 2;
  BLOCKBATCH_DYNAMIC_SHARED(unsigned char, smem_raw);
  const Ring<T, HD, kStages> ring(smem_raw);

  Work<T, HD> w;
  if (!w.locate(a, splits)) return;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;

  if constexpr (kPipe) {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {  // in flight while the Q tile is staged
      if (s < w.ntiles) load_kv_async(w, w.kb + s * kBlockK, ring.k(s), ring.v(s), tid);
      cp_async_commit();  // one group per tile, empty past the end: the waits below count groups
    }
  }
  uint32_t qa[HD / 16][4];
  load_q(w, a.q_stride, ring.qs, warp, tid, g, t4, qa);

  const float scale = score_scale<HD>();
  SoftmaxState<HD> st;
  st.init();
  for (int64_t t = 0; t < w.ntiles; ++t) {
    const int64_t k0 = w.kb + t * kBlockK;
    const int stage = kPipe ? static_cast<int>(t % kStages) : 0;
    if constexpr (kStages == 2) {
      if (t + 1 < w.ntiles) load_kv_async(w, k0 + kBlockK, ring.k(stage ^ 1), ring.v(stage ^ 1), tid);
      cp_async_commit();   // (an empty group on the last tile keeps the count uniform)
      cp_async_wait<1>();  // this thread's copies of tile t have landed ...
      __syncthreads();     // ... and everyone's
    } else if constexpr (kStages >= 3) {
      cp_async_wait<kStages - 2>();  // this thread's copies of tile t have landed ...
      __syncthreads();               // ... and everyone's; every warp is done with tile t - 1
      if (t + kStages - 1 < w.ntiles) {
        const int next = static_cast<int>((t + kStages - 1) % kStages);
        load_kv_async(w, k0 + (kStages - 1) * kBlockK, ring.k(next), ring.v(next), tid);
      }
      cp_async_commit();
    } else {
      __syncthreads();  // the previous tile is consumed
      load_kv_registers(w, k0, ring.k(0), ring.v(0), tid);
      __syncthreads();
    }
    // 3 stages: a warp whose 16 queries all lie past the row's last has nothing to compute (its
    // outputs are never written); it only takes its share of the loads and the barriers. In a
    // decode step most q-tiles are partial (a row of 4 queries leaves 3 of 4 warps idle), and
    // their mma / softmax work competed with the full tiles' for the SM's issue slots.
    if constexpr (kStages >= 3) {
      if (warp * 16 >= w.nq) continue;
    }
    attend_tile<T, HD, kPipe>(st, qa, ring.k(stage), ring.v(stage), k0, w.ke, scale, lane);
    if constexpr (kStages == 2) __syncthreads();  // this stage is refilled by the next iteration's prefetch
  }
  st.quad_sum();

  const int64_t i0 = warp * 16 + g, i1 = i0 + 8;
  const bool row0 = i0 < w.nq, row1 = i1 < w.nq;
  if (splits > 1) {
    write_partial<HD>(part, tokens, a.heads, w.h, w.q0, i0, i1, row0, row1, t4, st);
  } else {
    write_normalised<T, HD>(a, w.h, w.q0, i0, i1, row0, row1, t4, st);
  }
}

}  // namespace

template <typename T, int HD, int kStages>
cudaError_t launch_tiles(const cpu::AttentionArgs& a, int64_t tokens, int splits, float* part, cudaStream_t stream) {
  constexpr size_t shared = shared_elems<HD, kStages>() * sizeof(T);
  if (shared > 48 * 1024) {
    const cudaError_t e = allow_shared_memory<flash_tiles_kernel<T, HD, kStages>>(shared);
    if (e != cudaSuccess) return e;
  }
  const cudaError_t e = launch_kernel(flash_tiles_kernel<T, HD, kStages>, tile_grid(a, tokens, splits), kThreads,
                                      shared, stream, a, splits, part, tokens);
  if (splits == 1 || e != cudaSuccess) return e;
  return launch_combine<T, HD>(a, tokens, splits, part, stream);
}

#define INSTANTIATE(T, HD, S) \
  template cudaError_t launch_tiles<T, HD, S>(const cpu::AttentionArgs&, int64_t, int, float*, cudaStream_t);
#define INSTANTIATE_STAGES(T, HD) INSTANTIATE(T, HD, 1) INSTANTIATE(T, HD, 2) INSTANTIATE(T, HD, 3)
INSTANTIATE_STAGES(__nv_bfloat16, 64)
INSTANTIATE_STAGES(__nv_bfloat16, 128)
INSTANTIATE_STAGES(__half, 64)
INSTANTIATE_STAGES(__half, 128)
#undef INSTANTIATE_STAGES
#undef INSTANTIATE

}  // namespace blockbatch::cuda::flash
