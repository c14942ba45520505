// Packed variable-length bidirectional attention over per-row KV on tensor cores (bf16 / fp16,
// head_dim 64 or 128, GQA; sm_80 and newer): FlashAttention-2 style.
//
// A block of 4 warps owns 64 queries of one row and one head (each warp 16 queries). Key tiles of
// 64 (the row's cache keys, then its fresh keys) are staged in shared memory; S = Q K^T and
// O += P V run on mma.sync.m16n8k16 with fp32 accumulators; the softmax is online (running max
// and sum per query row, O rescaled when the max grows), so no score matrix is ever stored.
// The probabilities are rounded to T before P V, as every bf16 FlashAttention does.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with 16-bit A/B): lane = 4 * g + t.
//   A (16x16, row-major): a0 = A[g][2t..2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]
//   B (16x8, K x N):      b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]
//   C (16x8, fp32):       c0 = C[g][2t], c1 = C[g][2t+1], c2 = C[g+8][2t], c3 = C[g+8][2t+1]
// Two adjacent 16x8 C tiles of S are exactly the A fragment of P for one k-step of P V.
//
// Pipelined variants (flash_attention_kernel with kStages >= 2, chosen by the caller): the K/V
// tiles are copied global -> shared with cp.async into kStages stages, and the K and V fragments
// come from shared memory by ldmatrix (x4; .trans for V) instead of 32-bit / 16-bit loads.
// - kStages = 2: tile t + 1 is in flight while tile t is computed (a barrier after each tile, as
//   its stage is refilled next).
// - kStages = 3: tiles t + 1 and t + 2 are in flight while tile t is computed: each tile costs
//   about half a DRAM round trip instead of a whole one when the loads, not the arithmetic, set
//   the pace (few queries per row over long rows: a decode step). The Q tile is staged through
//   the third stage's buffer before the loop (its fragments then live in registers), so the
//   shared memory is 3 K/V stages (104 KB at head_dim 128: two blocks per SM, as with 2 stages).
//   The prefetch of tile t + 2 goes into tile t - 1's stage after the barrier that opens tile t,
//   which also orders it after every warp's last read of that stage: one barrier per tile. Warps
//   whose 16 queries are all past the row's end skip the arithmetic (see the loop).
//   Same arithmetic in the same order as the staged kernel: all three agree bit for bit.
// - Warp split (3 stages, kWarpSplit): a q-tile of at most 16 (32) queries, which leaves 3 (2) of
//   the 4 warps idle above, gives its 16-query group 4 (2) warps instead, each computing S and
//   P V over its own quarter (half) of every key tile with its own online softmax; at the end the
//   group's warps merge (m, l, O) in part order through the ring, as combine_kernel merges
//   splits. A partial tile's work per key tile then takes a quarter (half) of the time. Same
//   math; the summation order differs, so equal to the others within rounding, not bit for bit.
//   With 2-8 key splits, a (q-tile, head)'s splits are launched as one thread-block cluster and
//   rank 0 merges their states from the others' shared memory (combine_kernel's arithmetic, in
//   split order) and writes the output: no fp32 workspace round trip, no second launch.
//
// Split keys (flash-decoding): when the q-tiles x heads are too few to fill the GPU and the rows
// are long, grid.z splits each row's keys into `splits` ranges (multiples of 64 keys). Each block
// then writes its unnormalised O and its (max, sum) per query to an fp32 workspace, and
// combine_kernel merges the splits: M = max m_s, L = sum l_s 2^(m_s - M), O = sum O_s 2^(m_s - M) / L.
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
constexpr int kBlockQ = 64, kBlockK = 64, kWarps = 4, kThreads = kWarps * 32;
constexpr int kPad = 8;  // shared rows padded by 16 bytes: fragment loads spread over the banks
constexpr int kMaxClusterSplits = 8;  // the warp-split kernel merges up to this many splits in a cluster

// Two floats rounded to T, packed low = first (the lower column of a fragment pair).
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
template <typename T>
__device__ __forceinline__ uint32_t pack_elems(T lo, T hi) {
  const uint16_t l = *reinterpret_cast<const uint16_t*>(&lo), h = *reinterpret_cast<const uint16_t*>(&hi);
  return static_cast<uint32_t>(l) | (static_cast<uint32_t>(h) << 16);
}

// Four 8x8 16-bit matrices from shared memory: lane 8 * i + r gives the address of row r of
// matrix i; r[i] of lane 4 * g + t holds row g, columns 2t and 2t + 1 of matrix i (low half first).
// With .trans each matrix arrives transposed: r[i] of lane 4 * g + t holds rows 2t and 2t + 1 of
// column g.
__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, const void* p) {
#if defined(BLOCKBATCH_CUDA_EMULATION)
  ::bbemu::ldmatrix_x4(r, p, false);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p))
               : "memory");
#endif
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, const void* p) {
#if defined(BLOCKBATCH_CUDA_EMULATION)
  ::bbemu::ldmatrix_x4(r, p, true);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p))
               : "memory");
#endif
}

// A lane's online-softmax state (o [HD / 8][4], then m0, m1, l0, l1) into shared memory at `p`
// (this lane's first slot), lane-minor: element i at p[32 i]. The warp split and the cluster
// merge read it back at the same offsets.
template <int HD>
__device__ __forceinline__ void store_state(float* p, const float (&o)[HD / 8][4], float m0, float m1, float l0,
                                            float l1) {
#pragma unroll
  for (int n = 0; n < HD / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) p[(n * 4 + e) * 32] = o[n][e];
  p[(HD / 2) * 32] = m0;
  p[(HD / 2 + 1) * 32] = m1;
  p[(HD / 2 + 2) * 32] = l0;
  p[(HD / 2 + 3) * 32] = l1;
}

// The q-tile a block works on: tiles of 64 queries never straddle rows. Block x walks the rows'
// tile counts (rows are few: requests x branches); false when x is past the last tile.
__device__ __forceinline__ bool tile_of(const int64_t* cu, int64_t rows, int64_t x, int64_t& row, int64_t& q0) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = cu[r + 1] - cu[r], tiles = (n + kBlockQ - 1) / kBlockQ;
    if (x < tiles) {
      row = r;
      q0 = cu[r] + x * kBlockQ;
      return true;
    }
    x -= tiles;
  }
  return false;
}

// Shared memory: the Q tile, then per stage a K and a V tile (rows padded to HD + kPad).
template <int HD, int kStages>
constexpr size_t shared_elems() {
  static_assert(kStages >= 1 && kStages <= 3, "1: staged through registers, 2 or 3: cp.async stages");
  static_assert(2 * kBlockK >= kBlockQ, "with 3 stages the Q tile fits in one stage's buffer");
  return static_cast<size_t>((kStages >= 3 ? 0 : kBlockQ) + kStages * 2 * kBlockK) * (HD + kPad);
}

template <typename T, int HD, int kStages, bool kWarpSplit>
__global__ void __launch_bounds__(kThreads) flash_attention_kernel(cpu::AttentionArgs a, int splits, float* part,
                                                                   int64_t tokens, bool cluster_merge) {
  static_assert(!kWarpSplit || kStages == 3, "the warp split is a variant of the 3-stage kernel");
  dependent_launch_prologue();
  constexpr int LD = HD + kPad, kTile = kBlockK * LD;
  constexpr bool kPipe = kStages >= 2;
  BLOCKBATCH_DYNAMIC_SHARED(unsigned char, smem_raw);
  // Per stage: K [kBlockK][LD], then V [kBlockK][LD]; the Q tile [kBlockQ][LD] before them, or
  // (3 stages) in the last stage's buffer, which the loop first fills after the Q fragments are read.
  T* kvs = reinterpret_cast<T*>(smem_raw) + (kStages >= 3 ? 0 : kBlockQ * LD);
  T* qs = kStages >= 3 ? kvs + (kStages - 1) * 2 * kTile : reinterpret_cast<T*>(smem_raw);

  int64_t r, q0;
  if (!tile_of(a.cu_seqlens, a.rows, blockIdx.x, r, q0)) return;
  const int64_t h = blockIdx.y, kvh = h / (a.heads / a.kv_heads);
  const int64_t row_begin = a.cu_seqlens[r], row_end = a.cu_seqlens[r + 1];
  const int64_t nq = row_end - q0 < kBlockQ ? row_end - q0 : kBlockQ;
  const int64_t n_cache = a.cache ? a.geometry.cache_keys(a.kv_rows[r], a.cache_lens[r]) : 0;  // inside the buffer
  const int64_t n_fresh = a.attend_fresh ? row_end - row_begin : 0;
  const int64_t nk = n_cache + n_fresh;
  // This block's keys [kb, ke): split blockIdx.z of `splits` ranges of whole key tiles.
  const int64_t chunk = ((nk + splits - 1) / splits + kBlockK - 1) / kBlockK * kBlockK;
  const int64_t kb = blockIdx.z * chunk, ke = kb + chunk < nk ? kb + chunk : nk;
  const T* cache = static_cast<const T*>(a.cache);
  const T* kc = cache ? cache + a.geometry.offset(a.kv_rows[r], a.layer, 0, kvh, 0) : nullptr;
  const T* vc = cache ? cache + a.geometry.offset(a.kv_rows[r], a.layer, 1, kvh, 0) : nullptr;
  const T* kf = static_cast<const T*>(a.k) + row_begin * a.kv_stride + kvh * HD;
  const T* vf = static_cast<const T*>(a.v) + row_begin * a.kv_stride + kvh * HD;
  const T* q = static_cast<const T*>(a.q) + h * HD;

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  // Warp roles. Warp w owns queries [16 w, 16 w + 16) of the tile and every key; with kWarpSplit a
  // tile of at most 16 (32) queries gives its one (each of its two) 16-query group(s) 4 (2) warps,
  // each taking a contiguous quarter (half) of every 64-key tile, and the group's warps merge
  // their softmax states (m, l, O) at the end, as the split-key combine does across blocks.
  const int nq16 = static_cast<int>((nq + 15) / 16);
  const int wpg = kWarpSplit ? (nq16 <= 1 ? kWarps : nq16 <= 2 ? kWarps / 2 : 1) : 1;  // warps per group
  const int gq = warp / wpg, kp = warp % wpg;  // this warp's query group and key part
  const int kw8 = (kBlockK / 8) / wpg;          // its 8-key column tiles of each key tile
  constexpr int kChunks = HD / 8;  // 16-byte chunks per row
  const uint4 zero = make_uint4(0, 0, 0, 0);
  const int64_t ntiles = ke > kb ? (ke - kb + kBlockK - 1) / kBlockK : 0;

  // Pipelined: K/V tile [k0, k0 + 64) of this block's keys -> stage `stage`, asynchronously;
  // keys at or past ke are zero-filled (their scores are masked, and 0 * V must stay 0).
  auto load_async = [&](int64_t k0, int stage) {
    T* ks = kvs + stage * 2 * kTile;
    T* vs = ks + kTile;
    for (int i = tid; i < kBlockK * kChunks; i += kThreads) {
      const int row = i / kChunks, ch = i % kChunks;
      const int64_t j = k0 + row;
      const bool valid = j < ke;
      const T* ksrc = q;  // any mapped address when nothing is read
      const T* vsrc = q;
      if (valid && j < n_cache) {
        ksrc = kc + j * HD + ch * 8;
        vsrc = vc + j * HD + ch * 8;
      } else if (valid) {
        ksrc = kf + (j - n_cache) * a.kv_stride + ch * 8;
        vsrc = vf + (j - n_cache) * a.kv_stride + ch * 8;
      }
      cp_async16(ks + row * LD + ch * 8, ksrc, valid);
      cp_async16(vs + row * LD + ch * 8, vsrc, valid);
    }
  };
  if constexpr (kPipe) {
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {  // in flight while the Q tile is staged
      if (s < ntiles) load_async(kb + s * kBlockK, s);
      cp_async_commit();  // one group per tile, empty past the end: the waits below count groups
    }
  }

  // Q tile -> shared (rows past the row's queries are zero), then each warp's A fragments.
  for (int i = tid; i < kBlockQ * kChunks; i += kThreads) {
    const int row = i / kChunks, ch = i % kChunks;
    const uint4 v = row < nq ? *reinterpret_cast<const uint4*>(q + (q0 + row) * a.q_stride + ch * 8) : zero;
    *reinterpret_cast<uint4*>(qs + row * LD + ch * 8) = v;
  }
  __syncthreads();
  uint32_t qa[HD / 16][4];
  {
    const T* qw = qs + gq * 16 * LD;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
      const int c = kk * 16 + 2 * t4;
      qa[kk][0] = *reinterpret_cast<const uint32_t*>(qw + g * LD + c);
      qa[kk][1] = *reinterpret_cast<const uint32_t*>(qw + (g + 8) * LD + c);
      qa[kk][2] = *reinterpret_cast<const uint32_t*>(qw + g * LD + c + 8);
      qa[kk][3] = *reinterpret_cast<const uint32_t*>(qw + (g + 8) * LD + c + 8);
    }
  }

  // Scores are kept in the log2 domain: s * log2(e) / sqrt(HD), so exp2f gives the softmax.
  const float scale = 1.4426950408889634f * rsqrtf(static_cast<float>(HD));
  float o[HD / 8][4];
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;  // rows g and g + 8 of this warp

  for (int64_t t = 0; t < ntiles; ++t) {
    const int64_t k0 = kb + t * kBlockK;
    const int stage = kPipe ? static_cast<int>(t % kStages) : 0;
    T* ks = kvs + stage * 2 * kTile;
    T* vs = ks + kTile;
    if constexpr (kStages == 2) {
      if (t + 1 < ntiles) load_async(k0 + kBlockK, stage ^ 1);
      cp_async_commit();   // (an empty group on the last tile keeps the count uniform)
      cp_async_wait<1>();  // this thread's copies of tile t have landed ...
      __syncthreads();     // ... and everyone's
    } else if constexpr (kStages >= 3) {
      cp_async_wait<kStages - 2>();  // this thread's copies of tile t have landed ...
      __syncthreads();               // ... and everyone's; every warp is done with tile t - 1
      if (t + kStages - 1 < ntiles) {
        load_async(k0 + (kStages - 1) * kBlockK, static_cast<int>((t + kStages - 1) % kStages));
      }
      cp_async_commit();
    } else {
      __syncthreads();  // the previous tile is consumed
      for (int i = tid; i < kBlockK * kChunks; i += kThreads) {
        const int row = i / kChunks, ch = i % kChunks;
        const int64_t j = k0 + row;
        uint4 kv = zero, vv = zero;
        if (j < n_cache) {
          kv = *reinterpret_cast<const uint4*>(kc + j * HD + ch * 8);
          vv = *reinterpret_cast<const uint4*>(vc + j * HD + ch * 8);
        } else if (j < nk) {
          kv = *reinterpret_cast<const uint4*>(kf + (j - n_cache) * a.kv_stride + ch * 8);
          vv = *reinterpret_cast<const uint4*>(vf + (j - n_cache) * a.kv_stride + ch * 8);
        }
        *reinterpret_cast<uint4*>(ks + row * LD + ch * 8) = kv;
        *reinterpret_cast<uint4*>(vs + row * LD + ch * 8) = vv;
      }
      __syncthreads();
    }

    // 3 stages: a warp whose 16 queries all lie past the row's last has nothing to compute (its
    // outputs are never written); it only takes its share of the loads and the barriers. In a
    // decode step most q-tiles are partial (a row of 4 queries leaves 3 of 4 warps idle), and
    // their mma / softmax work competed with the full tiles' for the SM's issue slots.
    if constexpr (kStages >= 3) {
      if (gq * 16 >= nq) continue;
    }
    // S = Q K^T for this warp's 16 queries x 64 keys: 8 tiles of 16 x 8.
    float s[kBlockK / 8][4];
#pragma unroll
    for (int n = 0; n < kBlockK / 8; ++n) {
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
      if (kWarpSplit && n / kw8 != kp) continue;  // another warp's keys (masked below)
      if constexpr (kPipe) {
        // Matrix i of k-step pair kk2: keys n*8 .. n*8+7, dims kk2*32 + 8i .. +7; {b0, b1} of
        // k-step 2 kk2 are matrices 0 and 1, of k-step 2 kk2 + 1 matrices 2 and 3.
        const T* kr = ks + (n * 8 + (lane & 7)) * LD + (lane >> 3) * 8;
#pragma unroll
        for (int kk2 = 0; kk2 < HD / 32; ++kk2) {
          uint32_t b[4];
          ldmatrix_x4(b, kr + kk2 * 32);
          mma16816<T>(s[n], qa[2 * kk2], b);
          mma16816<T>(s[n], qa[2 * kk2 + 1], b + 2);
        }
      } else {
        const T* kr = ks + (n * 8 + g) * LD;
#pragma unroll
        for (int kk = 0; kk < HD / 16; ++kk) {
          uint32_t b[2];
          b[0] = *reinterpret_cast<const uint32_t*>(kr + kk * 16 + 2 * t4);
          b[1] = *reinterpret_cast<const uint32_t*>(kr + kk * 16 + 2 * t4 + 8);
          mma16816<T>(s[n], qa[kk], b);
        }
      }
    }
    // Scale, mask keys past the row's last, online softmax update.
    float mx0 = m0, mx1 = m1;
#pragma unroll
    for (int n = 0; n < kBlockK / 8; ++n) {
      const int64_t j = k0 + n * 8 + 2 * t4;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const bool valid = j + (e & 1) < ke && (!kWarpSplit || n / kw8 == kp);
        s[n][e] = valid ? s[n][e] * scale : -INFINITY;
      }
      mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
      mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    float alpha0 = exp2f(m0 - mx0), alpha1 = exp2f(m1 - mx1);  // 0 on the first tile
    if constexpr (kWarpSplit) {  // a key part can hold no valid key yet (max still -inf): no NaN
      alpha0 = mx0 == -INFINITY ? 1.0f : alpha0;
      alpha1 = mx1 == -INFINITY ? 1.0f : alpha1;
    }
    m0 = mx0;
    m1 = mx1;
    // The exponent base: the running max; 0 while it is -inf (every score is then -inf: exp2f = 0).
    const float base0 = kWarpSplit && m0 == -INFINITY ? 0.0f : m0, base1 = kWarpSplit && m1 == -INFINITY ? 0.0f : m1;
    l0 *= alpha0;
    l1 *= alpha1;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      o[n][0] *= alpha0;
      o[n][1] *= alpha0;
      o[n][2] *= alpha1;
      o[n][3] *= alpha1;
    }
#pragma unroll
    for (int n = 0; n < kBlockK / 8; ++n) {
      s[n][0] = exp2f(s[n][0] - base0);
      s[n][1] = exp2f(s[n][1] - base0);
      s[n][2] = exp2f(s[n][2] - base1);
      s[n][3] = exp2f(s[n][3] - base1);
      l0 += s[n][0] + s[n][1];  // this thread's columns; the quad sums at the end
      l1 += s[n][2] + s[n][3];
    }
    // O += P V: k-steps of 16 keys; P's A fragment is two adjacent S tiles.
#pragma unroll
    for (int kk = 0; kk < kBlockK / 16; ++kk) {
      if (kWarpSplit && 2 * kk / kw8 != kp) continue;  // another warp's keys
      uint32_t pa[4];
      pa[0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
      pa[1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
      pa[2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
      if constexpr (kPipe) {
        // Matrix i (transposed): keys kk*16 + 8 (i & 1) .. +7, dims n2*16 + 8 (i >> 1) .. +7; {b0, b1}
        // of dim tile 2 n2 are matrices 0 and 1, of dim tile 2 n2 + 1 matrices 2 and 3.
        const T* vr = vs + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD + (lane >> 4) * 8;
#pragma unroll
        for (int n2 = 0; n2 < HD / 16; ++n2) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, vr + n2 * 16);
          mma16816<T>(o[2 * n2], pa, b);
          mma16816<T>(o[2 * n2 + 1], pa, b + 2);
        }
      } else {
        const T* v0 = vs + (kk * 16 + 2 * t4) * LD;
#pragma unroll
        for (int n = 0; n < HD / 8; ++n) {
          const int col = n * 8 + g;
          uint32_t b[2];
          b[0] = pack_elems<T>(v0[col], v0[LD + col]);
          b[1] = pack_elems<T>(v0[8 * LD + col], v0[9 * LD + col]);
          mma16816<T>(o[n], pa, b);
        }
      }
    }
    if constexpr (kStages == 2) __syncthreads();  // this stage is refilled by the next iteration's prefetch
  }

  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  constexpr int kState = HD / 2 + 4;  // a lane's o (HD / 8 x 4), m0, m1, l0, l1 (lane-minor in shared memory)
  bool holder = true;                 // this warp holds its query group's state
  if constexpr (kWarpSplit) {
    if (wpg > 1) {  // the same in the whole block: merge each group's key parts into its first warp
      cp_async_wait<0>();
      __syncthreads();  // every warp is done with the ring, which now holds the parts' states
      float* state = reinterpret_cast<float*>(smem_raw);
      if (kp != 0) {
        store_state<HD>(state + warp * kState * 32 + lane, o, m0, m1, l0, l1);
      }
      __syncthreads();
      holder = kp == 0;
      for (int p = 1; holder && p < wpg; ++p) {  // in part order: deterministic
        const float* other = state + (warp + p) * kState * 32 + lane;
        const float om0 = other[(HD / 2) * 32], om1 = other[(HD / 2 + 1) * 32];
        const float M0 = fmaxf(m0, om0), M1 = fmaxf(m1, om1);
        const bool none0 = M0 == -INFINITY, none1 = M1 == -INFINITY;  // no key in any part yet: l, O stay 0
        const float a0 = none0 ? 0.0f : exp2f(m0 - M0), b0 = none0 ? 0.0f : exp2f(om0 - M0);
        const float a1 = none1 ? 0.0f : exp2f(m1 - M1), b1 = none1 ? 0.0f : exp2f(om1 - M1);
#pragma unroll
        for (int n = 0; n < HD / 8; ++n) {
          o[n][0] = o[n][0] * a0 + other[(n * 4) * 32] * b0;
          o[n][1] = o[n][1] * a0 + other[(n * 4 + 1) * 32] * b0;
          o[n][2] = o[n][2] * a1 + other[(n * 4 + 2) * 32] * b1;
          o[n][3] = o[n][3] * a1 + other[(n * 4 + 3) * 32] * b1;
        }
        l0 = l0 * a0 + other[(HD / 2 + 2) * 32] * b0;
        l1 = l1 * a1 + other[(HD / 2 + 3) * 32] * b1;
        m0 = M0;
        m1 = M1;
      }
    }
  }
  const int64_t i0 = gq * 16 + g, i1 = i0 + 8;
  const bool row0 = holder && i0 < nq, row1 = holder && i1 < nq;
  T* out = static_cast<T*>(a.out) + h * HD;
  const int64_t out_stride = a.heads * HD;
  if constexpr (kWarpSplit) {
    if (cluster_merge) {  // the key splits of this (q-tile, head) are one cluster: rank 0 merges
      const cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
      const unsigned rank = cluster.block_rank(), ranks = cluster.num_blocks();
      cp_async_wait<0>();
      __syncthreads();  // the ring is free (after the warp merge's reads too: its own region)
      float* cstate = reinterpret_cast<float*>(smem_raw) + kWarps * kState * 32;  // per query group
      if (holder) {
        store_state<HD>(cstate + gq * kState * 32 + lane, o, m0, m1, l0, l1);
      }
      cluster.sync();  // every rank's state is in its shared memory
      if (rank == 0 && holder) {  // combine_kernel's arithmetic, in rank (= split) order
        auto ranked = [&](unsigned s) { return cluster.map_shared_rank(cstate, s) + gq * kState * 32 + lane; };
        float M0 = -INFINITY, M1 = -INFINITY;
        for (unsigned s = 0; s < ranks; ++s) {
          M0 = fmaxf(M0, ranked(s)[(HD / 2) * 32]);
          M1 = fmaxf(M1, ranked(s)[(HD / 2 + 1) * 32]);
        }
        float L0 = 0.0f, L1 = 0.0f;
#pragma unroll
        for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
        for (unsigned s = 0; s < ranks; ++s) {
          const float* p = ranked(s);
          const float w0 = M0 == -INFINITY ? 0.0f : exp2f(p[(HD / 2) * 32] - M0);  // 0 for a split without keys
          const float w1 = M1 == -INFINITY ? 0.0f : exp2f(p[(HD / 2 + 1) * 32] - M1);
          L0 += p[(HD / 2 + 2) * 32] * w0;
          L1 += p[(HD / 2 + 3) * 32] * w1;
#pragma unroll
          for (int n = 0; n < HD / 8; ++n) {
            o[n][0] += p[(n * 4) * 32] * w0;
            o[n][1] += p[(n * 4 + 1) * 32] * w0;
            o[n][2] += p[(n * 4 + 2) * 32] * w1;
            o[n][3] += p[(n * 4 + 3) * 32] * w1;
          }
        }
#pragma unroll
        for (int n = 0; n < HD / 8; ++n) {
          const int col = n * 8 + 2 * t4;
          if (row0) {
            *reinterpret_cast<uint32_t*>(out + (q0 + i0) * out_stride + col) =
                pack2<T>(L0 > 0.0f ? o[n][0] / L0 : 0.0f, L0 > 0.0f ? o[n][1] / L0 : 0.0f);
          }
          if (row1) {
            *reinterpret_cast<uint32_t*>(out + (q0 + i1) * out_stride + col) =
                pack2<T>(L1 > 0.0f ? o[n][2] / L1 : 0.0f, L1 > 0.0f ? o[n][3] / L1 : 0.0f);
          }
        }
      }
      cluster.sync();  // no rank exits (freeing its shared memory) before rank 0 has read it
      return;
    }
  }
  if (splits > 1) {  // partial result: unnormalised O, then (m, l), per (split, token, head)
    constexpr int W = HD + 2;
    float* p0 = part + ((blockIdx.z * tokens + q0 + i0) * a.heads + h) * W;
    float* p1 = part + ((blockIdx.z * tokens + q0 + i1) * a.heads + h) * W;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      const int col = n * 8 + 2 * t4;
      if (row0) *reinterpret_cast<float2*>(p0 + col) = make_float2(o[n][0], o[n][1]);
      if (row1) *reinterpret_cast<float2*>(p1 + col) = make_float2(o[n][2], o[n][3]);
    }
    if (t4 == 0) {  // m and l are the same in the four threads of a quad
      if (row0) *reinterpret_cast<float2*>(p0 + HD) = make_float2(m0, l0);
      if (row1) *reinterpret_cast<float2*>(p1 + HD) = make_float2(m1, l1);
    }
    return;
  }
  const float inv0 = l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = l1 > 0.0f ? 1.0f / l1 : 0.0f;
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) {
    const int col = n * 8 + 2 * t4;
    if (row0) *reinterpret_cast<uint32_t*>(out + (q0 + i0) * out_stride + col) = pack2<T>(o[n][0] * inv0, o[n][1] * inv0);
    if (row1) *reinterpret_cast<uint32_t*>(out + (q0 + i1) * out_stride + col) = pack2<T>(o[n][2] * inv1, o[n][3] * inv1);
  }
}

// One block per (token, head), HD threads: merge the splits' partial results (see the top).
template <typename T, int HD>
__global__ void __launch_bounds__(HD) combine_kernel(const float* part, int splits, int64_t tokens, int64_t heads,
                                                     T* out) {
  dependent_launch_prologue();
  constexpr int W = HD + 2;
  const int64_t tok = blockIdx.x, h = blockIdx.y;
  const int d = threadIdx.x;
  float M = -INFINITY;
  for (int s = 0; s < splits; ++s) M = fmaxf(M, part[((s * tokens + tok) * heads + h) * W + HD]);
  float L = 0.0f, acc = 0.0f;
  if (M != -INFINITY) {
    for (int s = 0; s < splits; ++s) {
      const float* p = part + ((s * tokens + tok) * heads + h) * W;
      const float w = exp2f(p[HD] - M);  // 0 for a split without keys (m = -inf)
      L += p[HD + 1] * w;
      acc += p[d] * w;
    }
  }
  out[tok * heads * HD + h * HD + d] = from_f<T>(L > 0.0f ? acc / L : 0.0f);
}

template <typename T, int HD, int kStages, bool kWarpSplit = false>
cudaError_t launch(const cpu::AttentionArgs& a, int64_t tokens, int splits, float* part, cudaStream_t stream) {
  constexpr size_t shared = shared_elems<HD, kStages>() * sizeof(T);
  static_assert(!kWarpSplit || shared >= 2 * kWarps * (HD / 2 + 4) * 32 * sizeof(float), "the ring holds the merges");
  if (shared > 48 * 1024) {
    const cudaError_t e = allow_shared_memory<flash_attention_kernel<T, HD, kStages, kWarpSplit>>(shared);
    if (e != cudaSuccess) return e;
  }
  // Upper bound on the tiles: every row adds at most one partial tile; surplus blocks exit.
  const int64_t blocks = (tokens + kBlockQ - 1) / kBlockQ + a.rows;
  dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(a.heads), static_cast<unsigned>(splits));
  if (kWarpSplit && splits > 1 && splits <= kMaxClusterSplits) {  // merged in the cluster: no combine pass
    cudaLaunchAttribute cluster;
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = 1;
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = static_cast<unsigned>(splits);
    return launch_kernel(flash_attention_kernel<T, HD, kStages, kWarpSplit>, grid, kThreads, shared, stream, &cluster,
                         a, splits, part, tokens, true);
  }
  const cudaError_t e = launch_kernel(flash_attention_kernel<T, HD, kStages, kWarpSplit>, grid, kThreads, shared,
                                      stream, nullptr, a, splits, part, tokens, false);
  if (splits == 1 || e != cudaSuccess) return e;
  return launch_kernel(combine_kernel<T, HD>, dim3(static_cast<unsigned>(tokens), static_cast<unsigned>(a.heads)), HD,
                       0, stream, nullptr, part, splits, tokens, a.heads, static_cast<T*>(a.out));
}
}  // namespace

bool flash_attention_supported(const cpu::AttentionArgs& a, int dtype_code, int sm_major) {
  return dtype_code != 0 && sm_major >= 8 && (a.head_dim == 64 || a.head_dim == 128) && a.q_stride % 8 == 0 &&
         a.kv_stride % 8 == 0 && aligned16(a.q) && aligned16(a.k) && aligned16(a.v) && aligned16(a.out) &&
         (a.cache == nullptr || aligned16(a.cache));
}

int flash_attention_splits(const cpu::AttentionArgs& a, int64_t tokens, int64_t max_keys, int sm_count) {
  const int64_t ctas = ((tokens + kBlockQ - 1) / kBlockQ + a.rows) * a.heads;  // the launch's q-tile bound
  const int64_t want = 2 * static_cast<int64_t>(sm_count);                     // two waves of blocks
  if (ctas >= want || max_keys < 4 * kBlockK) return 1;
  const int64_t by_fill = (want + ctas - 1) / ctas, by_keys = max_keys / (2 * kBlockK);  // >= 2 tiles per split
  const int64_t s = by_fill < by_keys ? by_fill : by_keys;
  return static_cast<int>(s < 16 ? s : 16);
}

template <typename T>
cudaError_t flash_attention(const cpu::AttentionArgs& a, int64_t tokens, int splits, float* part, int variant,
                            cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  if (splits < 1 || (splits > 1 && part == nullptr) || variant < 1 || variant > 4) return cudaErrorInvalidValue;
  const bool hd64 = a.head_dim == 64;
  switch (variant) {
    case 1:
      return hd64 ? launch<T, 64, 1>(a, tokens, splits, part, stream)
                  : launch<T, 128, 1>(a, tokens, splits, part, stream);
    case 2:
      return hd64 ? launch<T, 64, 2>(a, tokens, splits, part, stream)
                  : launch<T, 128, 2>(a, tokens, splits, part, stream);
    case 3:
      return hd64 ? launch<T, 64, 3>(a, tokens, splits, part, stream)
                  : launch<T, 128, 3>(a, tokens, splits, part, stream);
    default:
      return hd64 ? launch<T, 64, 3, true>(a, tokens, splits, part, stream)
                  : launch<T, 128, 3, true>(a, tokens, splits, part, stream);
  }
}

template cudaError_t flash_attention<__nv_bfloat16>(const cpu::AttentionArgs&, int64_t, int, float*, int,
                                                    cudaStream_t);
template cudaError_t flash_attention<__half>(const cpu::AttentionArgs&, int64_t, int, float*, int, cudaStream_t);

}  // namespace blockbatch::cuda
