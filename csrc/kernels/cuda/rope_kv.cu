// RoPE and the KV-slot write (CUDA).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.cuh"
#include "kernels/cuda/launch.cuh"

namespace blockbatch::cuda {

namespace {
template <typename T>
__global__ void rope_kernel(T* x, int64_t tokens, int64_t row_stride, int64_t heads, int64_t head_dim,
                            const int64_t* positions, const float* cos_sin) {
  const int64_t half = head_dim / 2;
  const int64_t n = tokens * heads * half;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t i = idx % half, h = (idx / half) % heads, t = idx / (half * heads);
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
    kv[g.offset(row, layer, 0, h, positions[t]) + d] = k[t * src_stride + h * g.head_dim + d];
    kv[g.offset(row, layer, 1, h, positions[t]) + d] = v[t * src_stride + h * g.head_dim + d];
  }
}

// rope_kernel on q and k, then kv_write_kernel's copy of the rotated k and of v, in one pass:
// grid.y walks the tokens t; x the (slot, i) pairs of a token, slots = q heads | k heads | v heads
// and i < head_dim / 2 (32-bit index arithmetic; the token's position and KV row read once per
// thread, not found again per element by 64-bit division).
template <typename T>
__global__ void rope_kv_write_kernel(T* q, int64_t q_stride, int64_t heads, T* k, const T* v, int64_t kv_stride,
                                     int64_t head_dim, const int64_t* positions, const float* cos_sin, T* kv,
                                     cpu::KvGeometry g, int64_t layer, const int64_t* cu, const int64_t* kv_rows,
                                     int64_t rows, int64_t tokens) {
  dependent_launch_prologue();
  const int half = static_cast<int>(head_dim / 2), slots = static_cast<int>(heads + 2 * g.kv_heads);
  const int per_token = slots * half;
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= per_token) return;
  const int i = idx % half, s = idx / half;
  for (int64_t t = blockIdx.y; t < tokens; t += gridDim.y) {
    const int64_t pos = positions[t];
    if (s >= heads + g.kv_heads) {  // v: copied as it is
      const int64_t h = s - heads - g.kv_heads;
      const T* vh = v + t * kv_stride + h * head_dim;
      T* dst = kv + g.offset(kv_rows[row_of(cu, rows, t)], layer, 1, h, pos);
      dst[i] = vh[i];
      dst[i + half] = vh[i + half];
      continue;
    }
    T* xh = s < heads ? q + t * q_stride + s * head_dim : k + t * kv_stride + (s - heads) * head_dim;
    const float* c = cos_sin + pos * head_dim;
    const float a = to_f(xh[i]), b = to_f(xh[i + half]);
    const T ra = from_f<T>(__fadd_rn(__fmul_rn(a, c[i]), __fmul_rn(-b, c[half + i])));  // as rope_kernel
    const T rb = from_f<T>(__fadd_rn(__fmul_rn(b, c[i]), __fmul_rn(a, c[half + i])));
    xh[i] = ra;
    xh[i + half] = rb;
    if (s >= heads) {
      T* dst = kv + g.offset(kv_rows[row_of(cu, rows, t)], layer, 0, s - heads, pos);
      dst[i] = ra;
      dst[i + half] = rb;
    }
  }
}

// rope_kv_write_kernel with 16 bytes per access: a thread takes V = 16 / sizeof(T) consecutive i
// of one slot (both halves: 2 x 16-byte loads and stores, its cos and sin as float4s), so the
// token's position, KV row and the binary search over cu_seqlens are paid once per V pairs
// instead of once per pair; the scalar kernel was bound by those dependent loads, not by bytes
// (about 1 TB/s on an H200). Same arithmetic per element, so the same bits.
template <typename T>
__global__ void rope_kv_write_vec_kernel(T* q, int64_t q_stride, int64_t heads, T* k, const T* v, int64_t kv_stride,
                                         int64_t head_dim, const int64_t* positions, const float* cos_sin, T* kv,
                                         cpu::KvGeometry g, int64_t layer, const int64_t* cu, const int64_t* kv_rows,
                                         int64_t rows, int64_t tokens) {
  dependent_launch_prologue();
  constexpr int V = 16 / sizeof(T);
  const int half = static_cast<int>(head_dim / 2), per_slot = half / V;
  const int slots = static_cast<int>(heads + 2 * g.kv_heads);
  const int idx = blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= slots * per_slot) return;
  const int i0 = (idx % per_slot) * V, s = idx / per_slot;
  for (int64_t t = blockIdx.y; t < tokens; t += gridDim.y) {
    const int64_t pos = positions[t];
    if (s >= heads + g.kv_heads) {  // v: copied as it is
      const int64_t h = s - heads - g.kv_heads;
      const T* vh = v + t * kv_stride + h * head_dim;
      T* dst = kv + g.offset(kv_rows[row_of(cu, rows, t)], layer, 1, h, pos);
      *reinterpret_cast<uint4*>(dst + i0) = *reinterpret_cast<const uint4*>(vh + i0);
      *reinterpret_cast<uint4*>(dst + half + i0) = *reinterpret_cast<const uint4*>(vh + half + i0);
      continue;
    }
    T* xh = s < heads ? q + t * q_stride + s * head_dim : k + t * kv_stride + (s - heads) * head_dim;
    const float* c = cos_sin + pos * head_dim;
    const uint4 a_raw = *reinterpret_cast<const uint4*>(xh + i0), b_raw = *reinterpret_cast<const uint4*>(xh + half + i0);
    const T* a = reinterpret_cast<const T*>(&a_raw);
    const T* b = reinterpret_cast<const T*>(&b_raw);
    float cs[V], sn[V];
#pragma unroll
    for (int j = 0; j < V; j += 4) {
      const float4 cj = *reinterpret_cast<const float4*>(c + i0 + j), sj = *reinterpret_cast<const float4*>(c + half + i0 + j);
      cs[j] = cj.x, cs[j + 1] = cj.y, cs[j + 2] = cj.z, cs[j + 3] = cj.w;
      sn[j] = sj.x, sn[j + 1] = sj.y, sn[j + 2] = sj.z, sn[j + 3] = sj.w;
    }
    uint4 ra_raw, rb_raw;
    T* ra = reinterpret_cast<T*>(&ra_raw);
    T* rb = reinterpret_cast<T*>(&rb_raw);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      const float fa = to_f(a[e]), fb = to_f(b[e]);
      ra[e] = from_f<T>(__fadd_rn(__fmul_rn(fa, cs[e]), __fmul_rn(-fb, sn[e])));  // as rope_kernel
      rb[e] = from_f<T>(__fadd_rn(__fmul_rn(fb, cs[e]), __fmul_rn(fa, sn[e])));
    }
    *reinterpret_cast<uint4*>(xh + i0) = ra_raw;
    *reinterpret_cast<uint4*>(xh + half + i0) = rb_raw;
    if (s >= heads) {
      T* dst = kv + g.offset(kv_rows[row_of(cu, rows, t)], layer, 0, s - heads, pos);
      *reinterpret_cast<uint4*>(dst + i0) = ra_raw;
      *reinterpret_cast<uint4*>(dst + half + i0) = rb_raw;
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
                         const int64_t* positions, const float* cos_sin, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  rope_kernel<T><<<blocks_for(tokens * heads * head_dim / 2), 256, 0, stream>>>(x, tokens, row_stride, heads,
                                                                                 head_dim, positions, cos_sin);
  return cudaGetLastError();
}

template <typename T>
cudaError_t kv_write(T* kv, const cpu::KvGeometry& g, int64_t layer, const T* k, const T* v, int64_t src_stride,
                     const int64_t* positions, const int64_t* cu_seqlens, const int64_t* kv_rows, int64_t rows,
                     int64_t tokens, cudaStream_t stream) {
  if (tokens == 0 || rows == 0) return cudaSuccess;
  kv_write_kernel<T><<<blocks_for(tokens * g.kv_heads * g.head_dim), 256, 0, stream>>>(
      kv, g, layer, k, v, src_stride, positions, cu_seqlens, kv_rows, rows, tokens);
  return cudaGetLastError();
}

template <typename T>
cudaError_t rope_kv_write(T* q, int64_t q_stride, int64_t heads, T* k, const T* v, int64_t kv_stride,
                          const int64_t* positions, const float* cos_sin, T* kv, const cpu::KvGeometry& g,
                          int64_t layer, const int64_t* cu_seqlens, const int64_t* kv_rows, int64_t rows,
                          int64_t tokens, bool vectorized, cudaStream_t stream) {
  if (tokens == 0 || rows == 0) return cudaSuccess;
  constexpr int64_t V = 16 / sizeof(T);
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  // 16-byte accesses need every head half, row stride and base 16-byte aligned (a KV slot starts at
  // a multiple of head_dim elements from kv, so head_dim % 2V covers the slots too).
  vectorized = vectorized && g.head_dim % (2 * V) == 0 && q_stride % V == 0 && kv_stride % V == 0 && aligned(q) &&
               aligned(k) && aligned(v) && aligned(kv) && aligned(cos_sin);
  const int64_t per_token = (heads + 2 * g.kv_heads) * (g.head_dim / 2) / (vectorized ? V : 1);
  const dim3 grid(static_cast<unsigned>((per_token + 255) / 256), static_cast<unsigned>(tokens < 65535 ? tokens : 65535));
  return launch_kernel(vectorized ? rope_kv_write_vec_kernel<T> : rope_kv_write_kernel<T>, grid, 256, 0, stream, nullptr,
                       q, q_stride, heads, k, v, kv_stride, g.head_dim, positions, cos_sin, kv, g, layer, cu_seqlens,
                       kv_rows, rows, tokens);
}

#define INSTANTIATE(T)                                                                                          \
  template cudaError_t rope_inplace<T>(T*, int64_t, int64_t, int64_t, int64_t, const int64_t*, const float*,     \
                                       cudaStream_t);                                                           \
  template cudaError_t kv_write<T>(T*, const cpu::KvGeometry&, int64_t, const T*, const T*, int64_t,            \
                                   const int64_t*, const int64_t*, const int64_t*, int64_t, int64_t, cudaStream_t); \
  template cudaError_t rope_kv_write<T>(T*, int64_t, int64_t, T*, const T*, int64_t, const int64_t*, const float*,  \
                                        T*, const cpu::KvGeometry&, int64_t, const int64_t*, const int64_t*,      \
                                        int64_t, int64_t, bool, cudaStream_t);
BLOCKBATCH_CUDA_INSTANTIATE(INSTANTIATE)
#undef INSTANTIATE

}  // namespace blockbatch::cuda
