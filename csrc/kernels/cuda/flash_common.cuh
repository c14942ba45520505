// Building blocks of the tensor-core attention kernels (flash_attention.cu: entry points and the
// split-key combine; flash_tiles.cu: variants 1-3). Packed
// variable-length bidirectional attention over per-row KV (bf16 / fp16, head_dim 64 or 128, GQA;
// sm_80 and newer), FlashAttention-2 style.
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
// Split keys (flash-decoding): when the q-tiles x heads are too few to fill the GPU and the rows
// are long, grid.z splits each row's keys into `splits` ranges (multiples of 64 keys). Each block
// then writes its unnormalised O and its (max, sum) per query to an fp32 workspace, and
// combine_kernel merges the splits: M = max m_s, L = sum l_s 2^(m_s - M), O = sum O_s 2^(m_s - M) / L.
//
// Every variant runs the same per-tile arithmetic (attend_tile) in the same order; they differ only
// in how the K/V tiles reach shared memory.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.cuh"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/mma.cuh"

namespace blockbatch::cuda::flash {

constexpr int kBlockQ = 64, kBlockK = 64, kWarps = 4, kThreads = kWarps * 32;
constexpr int kPad = 8;  // shared rows padded by 16 bytes: fragment loads spread over the banks

// ---------------------------------------------------------------------------------------------
// Fragments

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

// ---------------------------------------------------------------------------------------------
// The online-softmax state

// The weight of a softmax state with max m in a merge whose largest max is M: 2^(m - M); 0 when
// no merged state has seen a key (M = -inf; 2^(-inf - M) is 0 for a state without keys otherwise).
__device__ __forceinline__ float merge_weight(float m, float M) { return M == -INFINITY ? 0.0f : exp2f(m - M); }

// A lane's share of a warp's online softmax over its 16 query rows: the O fragments (C layout,
// elements 0 and 1 in row g, 2 and 3 in row g + 8) and, per row, the running max m (log2 domain)
// and sum l. l holds this lane's columns only until quad_sum().
template <int HD>
struct SoftmaxState {
  float o[HD / 8][4];
  float m0, m1, l0, l1;  // rows g and g + 8 of this warp

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  }

  // The sums over the quad (the four lanes of a row).
  __device__ __forceinline__ void quad_sum() {
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  }
};

// ---------------------------------------------------------------------------------------------
// A block's work

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

// Shared memory of a kStages kernel: per stage K [kBlockK][LD], then V [kBlockK][LD]; the Q tile
// [kBlockQ][LD] before them, or (3 stages) in the last stage's buffer, which the loop first fills
// after the Q fragments are read.
template <typename T, int HD, int kStages>
struct Ring {
  static constexpr int LD = HD + kPad, kTile = kBlockK * LD;
  T* kvs;
  T* qs;
  __device__ __forceinline__ explicit Ring(unsigned char* smem)
      : kvs(reinterpret_cast<T*>(smem) + (kStages >= 3 ? 0 : kBlockQ * LD)),
        qs(kStages >= 3 ? kvs + (kStages - 1) * 2 * kTile : reinterpret_cast<T*>(smem)) {}
  __device__ __forceinline__ T* k(int stage) const { return kvs + stage * 2 * kTile; }
  __device__ __forceinline__ T* v(int stage) const { return k(stage) + kTile; }
};

// What a block attends: its q-tile of row r and head h, and its keys [kb, ke) of the row's nk
// (split blockIdx.z of `splits` ranges of whole key tiles): key j < n_cache is the row's cache
// slot j, or keys[j] with a gathered key set (kc, vc), key j >= n_cache its fresh token
// j - n_cache (kf, vf; kv_stride apart).
template <typename T, int HD>
struct Work {
  int64_t r, q0, h, nq, n_cache, nk, kb, ke, ntiles, kv_stride;
  const T *kc, *vc, *kf, *vf, *q;
  const cpu::KvGeometry* g;  // the cache's geometry (KvGeometry::row_base: kc / vc)
  int64_t kv_row;
  const int64_t* keys;  // the row's gathered key set (cached key j at position keys[j]), or nullptr

  // Cached key j from `base` (kc or vc; nullptr: no page, or a listed position outside the row).
  // Dense rows are contiguous: position * HD, a compile-time stride, not the geometry's lookup.
  __device__ __forceinline__ const T* slot(const T* base, int64_t j) const {
    if (keys != nullptr) {
      j = keys[j];
      if (j < 0 || j >= g->length) return nullptr;
    }
    if (g->pages == nullptr) return base + j * HD;
    const int64_t o = g->slot_from_base(kv_row, j);
    return o < 0 ? nullptr : base + o;
  }

  // false when blockIdx.x is past the last q-tile (the launch bounds the tiles from above).
  __device__ __forceinline__ bool locate(const cpu::AttentionArgs& a, int splits) {
    if (!tile_of(a.cu_seqlens, a.rows, blockIdx.x, r, q0)) return false;
    h = blockIdx.y;
    const int64_t kvh = h / (a.heads / a.kv_heads);
    const int64_t row_begin = a.cu_seqlens[r], row_end = a.cu_seqlens[r + 1];
    nq = row_end - q0 < kBlockQ ? row_end - q0 : kBlockQ;
    n_cache = a.cache ? a.geometry.cache_keys(a.kv_rows[r], a.row_cache_len(r)) : 0;  // inside the buffer
    keys = a.cache ? a.row_keys(r) : nullptr;
    const int64_t n_fresh = a.attend_fresh ? row_end - row_begin : 0;
    nk = n_cache + n_fresh;
    const int64_t chunk = ((nk + splits - 1) / splits + kBlockK - 1) / kBlockK * kBlockK;
    kb = blockIdx.z * chunk;
    ke = kb + chunk < nk ? kb + chunk : nk;
    const T* cache = static_cast<const T*>(a.cache);
    g = &a.geometry;
    kv_row = a.kv_rows[r];
    kc = cache ? cache + a.geometry.row_base(kv_row, a.layer, 0, kvh) : nullptr;
    vc = cache ? cache + a.geometry.row_base(kv_row, a.layer, 1, kvh) : nullptr;
    kf = static_cast<const T*>(a.k) + row_begin * a.kv_stride + kvh * HD;
    vf = static_cast<const T*>(a.v) + row_begin * a.kv_stride + kvh * HD;
    q = static_cast<const T*>(a.q) + h * HD;
    kv_stride = a.kv_stride;
    ntiles = ke > kb ? (ke - kb + kBlockK - 1) / kBlockK : 0;
    return true;
  }
};

// ---------------------------------------------------------------------------------------------
// Tile loaders (all threads of the block take part)

// K/V tile [k0, k0 + 64) of the block's keys -> ks, vs ([kBlockK][LD]) asynchronously (cp.async;
// the caller commits the group); keys at or past ke are zero-filled (their scores are masked, and
// 0 * V must stay 0).
template <typename T, int HD>
__device__ __forceinline__ void load_kv_async(const Work<T, HD>& w, int64_t k0, T* ks, T* vs, int tid) {
  constexpr int LD = HD + kPad, kChunks = HD / 8;  // 16-byte chunks per row
  for (int i = tid; i < kBlockK * kChunks; i += kThreads) {
    const int row = i / kChunks, ch = i % kChunks;
    const int64_t j = k0 + row;
    bool valid = j < w.ke;
    const T* ksrc = w.q;  // any mapped address when nothing is read
    const T* vsrc = w.q;
    if (valid && j < w.n_cache) {
      const T *kj = w.slot(w.kc, j), *vj = w.slot(w.vc, j);
      valid = kj != nullptr;  // no page: read as zeros
      if (valid) {
        ksrc = kj + ch * 8;
        vsrc = vj + ch * 8;
      }
    } else if (valid) {
      ksrc = w.kf + (j - w.n_cache) * w.kv_stride + ch * 8;
      vsrc = w.vf + (j - w.n_cache) * w.kv_stride + ch * 8;
    }
    cp_async16(ks + row * LD + ch * 8, ksrc, valid);
    cp_async16(vs + row * LD + ch * 8, vsrc, valid);
  }
}

// The same tile through registers (keys past the row's last, nk, are zero; keys in [ke, nk) are
// loaded and masked).
template <typename T, int HD>
__device__ __forceinline__ void load_kv_registers(const Work<T, HD>& w, int64_t k0, T* ks, T* vs, int tid) {
  constexpr int LD = HD + kPad, kChunks = HD / 8;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int i = tid; i < kBlockK * kChunks; i += kThreads) {
    const int row = i / kChunks, ch = i % kChunks;
    const int64_t j = k0 + row;
    uint4 kv = zero, vv = zero;
    if (j < w.n_cache) {
      const T *kj = w.slot(w.kc, j), *vj = w.slot(w.vc, j);
      if (kj != nullptr) {
        kv = *reinterpret_cast<const uint4*>(kj + ch * 8);
        vv = *reinterpret_cast<const uint4*>(vj + ch * 8);
      }
    } else if (j < w.nk) {
      kv = *reinterpret_cast<const uint4*>(w.kf + (j - w.n_cache) * w.kv_stride + ch * 8);
      vv = *reinterpret_cast<const uint4*>(w.vf + (j - w.n_cache) * w.kv_stride + ch * 8);
    }
    *reinterpret_cast<uint4*>(ks + row * LD + ch * 8) = kv;
    *reinterpret_cast<uint4*>(vs + row * LD + ch * 8) = vv;
  }
}

// The Q tile -> qs (rows past the row's queries are zero), a barrier, then the A fragments of
// query group gq (queries 16 gq .. 16 gq + 15 of the tile: the warp's) -> qa.
template <typename T, int HD>
__device__ __forceinline__ void load_q(const Work<T, HD>& w, int64_t q_stride, T* qs, int gq, int tid, int g, int t4,
                                       uint32_t (&qa)[HD / 16][4]) {
  constexpr int LD = HD + kPad, kChunks = HD / 8;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int i = tid; i < kBlockQ * kChunks; i += kThreads) {
    const int row = i / kChunks, ch = i % kChunks;
    const uint4 v = row < w.nq ? *reinterpret_cast<const uint4*>(w.q + (w.q0 + row) * q_stride + ch * 8) : zero;
    *reinterpret_cast<uint4*>(qs + row * LD + ch * 8) = v;
  }
  __syncthreads();
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

// ---------------------------------------------------------------------------------------------
// One key tile of one warp: S = Q K^T, mask, online softmax update, O += P V

// Key tile [k0, k0 + 64) in shared memory (ks, vs) into `st`. kLdmatrix: K and V fragments by
// ldmatrix (x4; .trans for V), else 32-bit / 16-bit shared loads (same values).
template <typename T, int HD, bool kLdmatrix>
__device__ __forceinline__ void attend_tile(SoftmaxState<HD>& st, const uint32_t (&qa)[HD / 16][4], const T* ks,
                                            const T* vs, int64_t k0, int64_t ke, float scale, int lane) {
  constexpr int LD = HD + kPad;
  const int g = lane >> 2, t4 = lane & 3;
  // S = Q K^T for this warp's 16 queries x 64 keys: 8 tiles of 16 x 8.
  float s[kBlockK / 8][4];
#pragma unroll
  for (int n = 0; n < kBlockK / 8; ++n) {
    s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
    if constexpr (kLdmatrix) {
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
  // Scale, mask keys past the block's last, online softmax update.
  float mx0 = st.m0, mx1 = st.m1;
#pragma unroll
  for (int n = 0; n < kBlockK / 8; ++n) {
    const int64_t j = k0 + n * 8 + 2 * t4;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const bool valid = j + (e & 1) < ke;
      s[n][e] = valid ? s[n][e] * scale : -INFINITY;
    }
    mx0 = fmaxf(mx0, fmaxf(s[n][0], s[n][1]));
    mx1 = fmaxf(mx1, fmaxf(s[n][2], s[n][3]));
  }
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
  mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
  mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
  const float alpha0 = exp2f(st.m0 - mx0), alpha1 = exp2f(st.m1 - mx1);  // 0 on the first tile
  st.m0 = mx0;
  st.m1 = mx1;
  const float base0 = st.m0, base1 = st.m1;  // the exponent base: the running max
  st.l0 *= alpha0;
  st.l1 *= alpha1;
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) {
    st.o[n][0] *= alpha0;
    st.o[n][1] *= alpha0;
    st.o[n][2] *= alpha1;
    st.o[n][3] *= alpha1;
  }
#pragma unroll
  for (int n = 0; n < kBlockK / 8; ++n) {
    s[n][0] = exp2f(s[n][0] - base0);
    s[n][1] = exp2f(s[n][1] - base0);
    s[n][2] = exp2f(s[n][2] - base1);
    s[n][3] = exp2f(s[n][3] - base1);
    st.l0 += s[n][0] + s[n][1];  // this thread's columns; the quad sums at the end
    st.l1 += s[n][2] + s[n][3];
  }
  // O += P V: k-steps of 16 keys; P's A fragment is two adjacent S tiles.
#pragma unroll
  for (int kk = 0; kk < kBlockK / 16; ++kk) {
    uint32_t pa[4];
    pa[0] = pack2<T>(s[2 * kk][0], s[2 * kk][1]);
    pa[1] = pack2<T>(s[2 * kk][2], s[2 * kk][3]);
    pa[2] = pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pa[3] = pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    if constexpr (kLdmatrix) {
      // Matrix i (transposed): keys kk*16 + 8 (i & 1) .. +7, dims n2*16 + 8 (i >> 1) .. +7; {b0, b1}
      // of dim tile 2 n2 are matrices 0 and 1, of dim tile 2 n2 + 1 matrices 2 and 3.
      const T* vr = vs + (kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD + (lane >> 4) * 8;
#pragma unroll
      for (int n2 = 0; n2 < HD / 16; ++n2) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, vr + n2 * 16);
        mma16816<T>(st.o[2 * n2], pa, b);
        mma16816<T>(st.o[2 * n2 + 1], pa, b + 2);
      }
    } else {
      const T* v0 = vs + (kk * 16 + 2 * t4) * LD;
#pragma unroll
      for (int n = 0; n < HD / 8; ++n) {
        const int col = n * 8 + g;
        uint32_t b[2];
        b[0] = pack_elems<T>(v0[col], v0[LD + col]);
        b[1] = pack_elems<T>(v0[8 * LD + col], v0[9 * LD + col]);
        mma16816<T>(st.o[n], pa, b);
      }
    }
  }
}

// Scores are kept in the log2 domain: s * log2(e) / sqrt(HD), so exp2f gives the softmax.
template <int HD>
__device__ __forceinline__ float score_scale() {
  return 1.4426950408889634f * rsqrtf(static_cast<float>(HD));
}

// ---------------------------------------------------------------------------------------------
// Outputs of a warp's 16 query rows (local rows i0 = 16 gq + g and i1 = i0 + 8 of the q-tile;
// row0 / row1: whether each is a query of the row)

// out [tokens, heads, HD] at query q0 + i: norm(o, row) per element, rounded to T.
template <typename T, int HD, typename Norm>
__device__ __forceinline__ void write_output(const cpu::AttentionArgs& a, int64_t h, int64_t q0, int64_t i0, int64_t i1,
                                             bool row0, bool row1, int t4, const float (&o)[HD / 8][4], Norm norm) {
  T* out = static_cast<T*>(a.out) + h * HD;
  const int64_t out_stride = a.heads * HD;
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) {
    const int col = n * 8 + 2 * t4;
    if (row0) {
      *reinterpret_cast<uint32_t*>(out + (q0 + i0) * out_stride + col) = pack2<T>(norm(o[n][0], 0), norm(o[n][1], 0));
    }
    if (row1) {
      *reinterpret_cast<uint32_t*>(out + (q0 + i1) * out_stride + col) = pack2<T>(norm(o[n][2], 1), norm(o[n][3], 1));
    }
  }
}

// O / l of a finished state (its sums quad-summed): 0 for a row without keys.
template <typename T, int HD>
__device__ __forceinline__ void write_normalised(const cpu::AttentionArgs& a, int64_t h, int64_t q0, int64_t i0,
                                                 int64_t i1, bool row0, bool row1, int t4, const SoftmaxState<HD>& st) {
  const float inv0 = st.l0 > 0.0f ? 1.0f / st.l0 : 0.0f, inv1 = st.l1 > 0.0f ? 1.0f / st.l1 : 0.0f;
  write_output<T, HD>(a, h, q0, i0, i1, row0, row1, t4, st.o,
                      [&](float v, int row) { return v * (row ? inv1 : inv0); });
}

// Partial result of key split z for combine_kernel: unnormalised O, then (m, l), per (split,
// token, head) in `part` ([splits][tokens][heads][HD + 2] floats).
template <int HD>
__device__ __forceinline__ void write_partial(float* part, int64_t tokens, int64_t heads, int64_t h, int64_t q0,
                                              int64_t i0, int64_t i1, bool row0, bool row1, int t4,
                                              const SoftmaxState<HD>& st) {
  constexpr int W = HD + 2;
  float* p0 = part + ((blockIdx.z * tokens + q0 + i0) * heads + h) * W;
  float* p1 = part + ((blockIdx.z * tokens + q0 + i1) * heads + h) * W;
#pragma unroll
  for (int n = 0; n < HD / 8; ++n) {
    const int col = n * 8 + 2 * t4;
    if (row0) *reinterpret_cast<float2*>(p0 + col) = make_float2(st.o[n][0], st.o[n][1]);
    if (row1) *reinterpret_cast<float2*>(p1 + col) = make_float2(st.o[n][2], st.o[n][3]);
  }
  if (t4 == 0) {  // m and l are the same in the four threads of a quad
    if (row0) *reinterpret_cast<float2*>(p0 + HD) = make_float2(st.m0, st.l0);
    if (row1) *reinterpret_cast<float2*>(p1 + HD) = make_float2(st.m1, st.l1);
  }
}

// ---------------------------------------------------------------------------------------------
// Launchers of the variants (each defined and instantiated in its own file, for T bf16 / fp16
// and HD 64 / 128). splits > 1 needs `part` (see write_partial).

// flash_tiles.cu: variants 1-3 (kStages 1: K/V staged through registers; 2, 3: cp.async stages).
template <typename T, int HD, int kStages>
cudaError_t launch_tiles(const cpu::AttentionArgs& a, int64_t tokens, int splits, float* part, cudaStream_t stream);
// flash_attention.cu: combine_kernel over the splits' partial results in `part`.
template <typename T, int HD>
cudaError_t launch_combine(const cpu::AttentionArgs& a, int64_t tokens, int splits, const float* part,
                           cudaStream_t stream);

// The grid of a tile kernel: an upper bound on the q-tiles (every row adds at most one partial
// tile; surplus blocks exit) x heads x splits.
inline dim3 tile_grid(const cpu::AttentionArgs& a, int64_t tokens, int splits) {
  const int64_t blocks = (tokens + kBlockQ - 1) / kBlockQ + a.rows;
  return dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(a.heads), static_cast<unsigned>(splits));
}

}  // namespace blockbatch::cuda::flash
