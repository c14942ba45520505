// RoPE and the KV-slot write (CUDA).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.cuh"
#include "kernels/cuda/launch.cuh"

namespace blockbatch::cuda {

namespace {
template <typename T>
__global__ void rope_kernel(T* x, int64_t tokens, int64_t row_stride, int64_t heads, int64_t head_dim,
                            const int64_t* positions, const float* cos_sin, int64_t max_positions) {
  const int64_t half = head_dim / 2;
  const int64_t n = tokens * heads * half;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = idx % half, h = (idx / half) % heads, t = idx / (half * heads);
    if (positions[t] < 0 || positions[t] >= max_positions) continue;  // no table row: left as it is
    const float* c = cos_sin + positions[t] * head_dim;
    T* xh = x + t * row_stride + h * head_dim;
    const float a = to_f(xh[i]), b = to_f(xh[i + half]);
    // Same operation order as the reference: x*cos + rotate_half(x)*sin (no FMA contraction).
    xh[i] = from_f<T>(__fadd_rn(__fmul_rn(a, c[i]), __fmul_rn(-b, c[half + i])));
    xh[i + half] = from_f<T>(__fadd_rn(__fmul_rn(b, c[i]), __fmul_rn(a, c[half + i])));
  }
}

template <typename T>
__global__ void kv_write_kernel(T* kv, cpu::KvGeometry g, int64_t layer, const T* k, const T* v, int64_t src_stride,
                                const int64_t* positions, const int64_t* cu, const int64_t* kv_rows, int64_t rows,
                                int64_t tokens) {
  const int64_t n = tokens * g.kv_heads * g.head_dim;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t d = idx % g.head_dim, h = (idx / g.head_dim) % g.kv_heads, t = idx / (g.head_dim * g.kv_heads);
    const int64_t row = kv_rows[row_of(cu, rows, t)];
    if (!g.slot_ok(row, positions[t])) continue;  // outside the buffer: not written
    kv[g.offset(row, layer, 0, h, positions[t]) + d] = k[t * src_stride + h * g.head_dim + d];
    kv[g.offset(row, layer, 1, h, positions[t]) + d] = v[t * src_stride + h * g.head_dim + d];
  }
}

// V consecutive elements of T, moved as one access (V = 16 / sizeof(T): a 16-byte load / store).
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T e[V];
};

// cos_sin[0 .. V) as float4 loads where V allows (a multiple of 4 floats, 16-byte aligned).
template <int V>
__device__ __forceinline__ void load_floats(float (&out)[V], const float* p) {
  if constexpr (V % 4 == 0) {
#pragma unroll
    for (int j = 0; j < V; j += 4) {
      const float4 f = *reinterpret_cast<const float4*>(p + j);
      out[j] = f.x, out[j + 1] = f.y, out[j + 2] = f.z, out[j + 3] = f.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < V; ++j) out[j] = p[j];
  }
}

// rope_kernel on q and k, then kv_write_kernel's copy of the rotated k and of v, in one pass:
// grid.y walks the tokens t; x the (slot, i0) items of a token, slots = q heads | k heads | v heads,
// each thread V consecutive i of one slot's two halves (32-bit index arithmetic; the token's
// position and KV row read once per thread, not found again per element by 64-bit division).
// V = 1: element pairs. V = 16 / sizeof(T): 16-byte accesses, so the position, KV row and the
// binary search over cu_seqlens are paid once per V pairs; with V = 1 they are paid per pair, which
// is the likely reason the pair kernel ran at about 1 TB/s on an H200. Same arithmetic per element
// for every V, so the same bits.
template <typename T, int V>
__global__ void rope_kv_write_kernel(T* q, int64_t q_stride, int64_t heads, T* k, const T* v, int64_t kv_stride,
                                     int64_t head_dim, const int64_t* positions, const float* cos_sin,
                                     int64_t max_positions, T* kv, cpu::KvGeometry g, int64_t layer, const int64_t* cu,
                                     const int64_t* kv_rows, int64_t rows, int64_t tokens) {
  using Vec = Pack<T, V>;
  const int half = static_cast<int>(head_dim / 2), per_slot = half / V;
  const int slots = static_cast<int>(heads + 2 * g.kv_heads);
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= slots * per_slot) return;
  const int i0 = (idx % per_slot) * V, s = idx / per_slot;
  for (int64_t t = blockIdx.y; t < tokens; t += gridDim.y) {
    const int64_t pos = positions[t], row = kv_rows[row_of(cu, rows, t)];
    const bool slot = g.slot_ok(row, pos);  // outside the buffer or the table: skipped
    if (s >= heads + g.kv_heads) {          // v: copied as it is
      if (!slot) continue;
      const int64_t h = s - heads - g.kv_heads;
      const T* vh = v + t * kv_stride + h * head_dim;
      T* dst = kv + g.offset(row, layer, 1, h, pos);
      *reinterpret_cast<Vec*>(dst + i0) = *reinterpret_cast<const Vec*>(vh + i0);
      *reinterpret_cast<Vec*>(dst + half + i0) = *reinterpret_cast<const Vec*>(vh + half + i0);
      continue;
    }
    if (pos < 0 || pos >= max_positions) continue;
    T* xh = s < heads ? q + t * q_stride + s * head_dim : k + t * kv_stride + (s - heads) * head_dim;
    const float* c = cos_sin + pos * head_dim;
    const Vec a = *reinterpret_cast<const Vec*>(xh + i0), b = *reinterpret_cast<const Vec*>(xh + half + i0);
    float cs[V], sn[V];
    load_floats<V>(cs, c + i0);
    load_floats<V>(sn, c + half + i0);
    Vec ra, rb;
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float fa = to_f(a.e[e]), fb = to_f(b.e[e]);
      ra.e[e] = from_f<T>(__fadd_rn(__fmul_rn(fa, cs[e]), __fmul_rn(-fb, sn[e])));  // as rope_kernel
      rb.e[e] = from_f<T>(__fadd_rn(__fmul_rn(fb, cs[e]), __fmul_rn(fa, sn[e])));
    }
    *reinterpret_cast<Vec*>(xh + i0) = ra;
    *reinterpret_cast<Vec*>(xh + half + i0) = rb;
    if (s >= heads && slot) {
      T* dst = kv + g.offset(row, layer, 0, s - heads, pos);
      *reinterpret_cast<Vec*>(dst + i0) = ra;
      *reinterpret_cast<Vec*>(dst + half + i0) = rb;
    }
  }
}

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + 255) / 256;
  return static_cast<unsigned>(b < 65535 ? (b > 0 ? b : 1) : 65535);
}
}  // namespace

template <typename T>
cudaError_t rope_inplace(T* x, int64_t tokens, int64_t row_stride, int64_t heads, int64_t head_dim,
                         const int64_t* positions, const float* cos_sin, int64_t max_positions, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  return launch_kernel(rope_kernel<T>, blocks_for(tokens * heads * head_dim / 2), 256, 0, stream, x, tokens, row_stride,
                       heads, head_dim, positions, cos_sin, max_positions);
}

template <typename T>
cudaError_t kv_write(T* kv, const cpu::KvGeometry& g, int64_t layer, const T* k, const T* v, int64_t src_stride,
                     const int64_t* positions, const int64_t* cu_seqlens, const int64_t* kv_rows, int64_t rows,
                     int64_t tokens, cudaStream_t stream) {
  if (tokens == 0 || rows == 0) return cudaSuccess;
  return launch_kernel(kv_write_kernel<T>, blocks_for(tokens * g.kv_heads * g.head_dim), 256, 0, stream, kv, g, layer,
                       k, v, src_stride, positions, cu_seqlens, kv_rows, rows, tokens);
}

template <typename T>
cudaError_t rope_kv_write(T* q, int64_t q_stride, int64_t heads, T* k, const T* v, int64_t kv_stride,
                          const int64_t* positions, const float* cos_sin, int64_t max_positions, T* kv,
                          const cpu::KvGeometry& g, int64_t layer, const int64_t* cu_seqlens, const int64_t* kv_rows,
                          int64_t rows, int64_t tokens, bool vectorized, cudaStream_t stream) {
  if (tokens == 0 || rows == 0) return cudaSuccess;
  constexpr int64_t V = 16 / sizeof(T);
  // 16-byte accesses need every head half, row stride and base 16-byte aligned (a KV slot starts at
  // a multiple of head_dim elements from kv, so head_dim % 2V covers the slots too).
  vectorized = vectorized && g.head_dim % (2 * V) == 0 && q_stride % V == 0 && kv_stride % V == 0 && aligned16(q) &&
               aligned16(k) && aligned16(v) && aligned16(kv) && aligned16(cos_sin);
  const int64_t per_token = (heads + 2 * g.kv_heads) * (g.head_dim / 2) / (vectorized ? V : 1);
  const dim3 grid(static_cast<unsigned>((per_token + 255) / 256),
                  static_cast<unsigned>(tokens < 65535 ? tokens : 65535));
  return launch_kernel(vectorized ? rope_kv_write_kernel<T, V> : rope_kv_write_kernel<T, 1>, grid, 256, 0, stream, q,
                       q_stride, heads, k, v, kv_stride, g.head_dim, positions, cos_sin, max_positions, kv, g, layer,
                       cu_seqlens, kv_rows, rows, tokens);
}

#define INSTANTIATE(T)                                                                                                \
  template cudaError_t rope_inplace<T>(T*, int64_t, int64_t, int64_t, int64_t, const int64_t*, const float*, int64_t, \
                                       cudaStream_t);                                                                 \
  template cudaError_t kv_write<T>(T*, const cpu::KvGeometry&, int64_t, const T*, const T*, int64_t, const int64_t*,  \
                                   const int64_t*, const int64_t*, int64_t, int64_t, cudaStream_t);                   \
  template cudaError_t rope_kv_write<T>(T*, int64_t, int64_t, T*, const T*, int64_t, const int64_t*, const float*,    \
                                        int64_t, T*, const cpu::KvGeometry&, int64_t, const int64_t*, const int64_t*, \
                                        int64_t, int64_t, bool, cudaStream_t);
BLOCKBATCH_CUDA_INSTANTIATE(INSTANTIATE)
#undef INSTANTIATE

}  // namespace blockbatch::cuda
