// The routed experts of a mixture-of-experts layer with the router's choices left on the device
// (moe_experts' opt-in path, BLOCKBATCH_MOE_KERNEL=fused): three launches a CUDA graph can record,
// where the grouped path reads the choices on the host to run one GEMM per active expert.
//
//   up:      grid (expert, 32-row slice of m). A block lists the (token, slot) pairs that chose its
//            expert (scanning `chosen` 1024 entries at a time) and computes their SwiGLU hidden rows
//            for its slice: every weight row is read from DRAM once per block whatever the pair count
//            (the pairs reuse it from L1 / L2), as in one GEMM per expert.
//   down:    grid (expert, 32-row slice of d): the expert's output rows of each of its pairs.
//   combine: grid (token): the slot-weighted sum of the token's expert outputs in slot order, in
//            float32, rounded once.
//
// Each value is rounded where the grouped path (linear, silu_mul, linear, weighted sum) rounds it,
// and each pair's rows are computed by one warp whatever else shares the launch, so a token's
// output does not depend on the other tokens of the forward. A pair whose expert id is outside
// [0, experts) contributes nothing (the grouped path refuses it on the host).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.cuh"
#include "kernels/cuda/launch.cuh"

namespace blockbatch::cuda {

namespace {
constexpr int kThreads = 256, kWarps = kThreads / 32;
constexpr int64_t kRows = 32;  // weight rows per block
constexpr int kScan = 1024;    // `chosen` entries listed per round

// a[0:n] . b[0:n] in float32 over the warp (every lane gets it); `vec`: both 16-byte aligned and n a
// multiple of 16 / sizeof(T), read 16 bytes per lane and step.
template <typename T>
__device__ __forceinline__ float warp_dot(const T* a, const T* b, int64_t n, bool vec) {
  const int lane = threadIdx.x & 31;
  float s = 0;
  if (vec) {
    constexpr int P = 16 / sizeof(T);
    const uint4* a4 = reinterpret_cast<const uint4*>(a);
    const uint4* b4 = reinterpret_cast<const uint4*>(b);
    for (int64_t c = lane; c < n / P; c += 32) {
      // Copied out of the uint4 (not read through a T* into it: that breaks strict aliasing, and the
      // emulator's host compiler drops such reads).
      const uint4 av = a4[c], bv = b4[c];
      T ae[P], be[P];
      memcpy(ae, &av, sizeof(av));
      memcpy(be, &bv, sizeof(bv));
#pragma unroll
      for (int u = 0; u < P; ++u) s += to_f(ae[u]) * to_f(be[u]);
    }
  } else {
    for (int64_t i = lane; i < n; i += 32) s += to_f(a[i]) * to_f(b[i]);
  }
  return warp_reduce(s, SumOp{});
}

// The pairs of `chosen[base : base + kScan]` that chose expert e, as offsets from base, into list;
// returns their count. Every thread of the block calls it (two barriers).
__device__ __forceinline__ int list_pairs(const int64_t* chosen, int64_t pairs, int64_t base, int64_t e, int* list,
                                          int* count) {
  if (threadIdx.x == 0) *count = 0;
  __syncthreads();
  for (int i = threadIdx.x; i < kScan && base + i < pairs; i += blockDim.x) {
    if (chosen[base + i] == e) list[atomicAdd(count, 1)] = i;
  }
  __syncthreads();
  return *count;
}

// hidden[p, j] = silu(T(gate_e[j] . x[t])) * T(up_e[j] . x[t]) for the pairs p = t * slots + k of
// expert e = blockIdx.x and the rows j of this block's slice (gate_up: [experts, 2m, d], gate rows
// first).
template <typename T>
__global__ void moe_up_kernel(const T* x, const int64_t* chosen, const T* gate_up, T* hidden, int64_t pairs,
                              int64_t slots, int64_t d, int64_t m, bool vec) {
  __shared__ int list[kScan];
  __shared__ int count;
  const int64_t e = blockIdx.x, first = blockIdx.y * kRows;
  const int64_t rows = m - first < kRows ? m - first : kRows;
  const T* w = gate_up + e * 2 * m * d;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int64_t base = 0; base < pairs; base += kScan) {
    const int n = list_pairs(chosen, pairs, base, e, list, &count);
    // Items row-major (a row's pairs on neighbouring warps, so its weights are read once from DRAM).
    for (int64_t item = warp; item < rows * n; item += kWarps) {
      const int64_t j = first + item / n, p = base + list[item % n];
      const T* xr = x + (p / slots) * d;
      const float g = to_f(from_f<T>(warp_dot(w + j * d, xr, d, vec)));
      const float u = to_f(from_f<T>(warp_dot(w + (m + j) * d, xr, d, vec)));
      const float act = to_f(from_f<T>(g / (1.0f + __expf(-g))));  // as silu_mul
      if (lane == 0) hidden[p * m + j] = from_f<T>(act * u);
    }
    __syncthreads();  // the list is rewritten by the next round
  }
}

// expert_out[p, i] = T(down_e[i] . hidden[p]) for expert e = blockIdx.x's pairs and the rows i of
// this block's slice (down: [experts, d, m]).
template <typename T>
__global__ void moe_down_kernel(const int64_t* chosen, const T* down, const T* hidden, T* expert_out, int64_t pairs,
                                int64_t d, int64_t m, bool vec) {
  __shared__ int list[kScan];
  __shared__ int count;
  const int64_t e = blockIdx.x, first = blockIdx.y * kRows;
  const int64_t rows = d - first < kRows ? d - first : kRows;
  const T* w = down + e * d * m;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int64_t base = 0; base < pairs; base += kScan) {
    const int n = list_pairs(chosen, pairs, base, e, list, &count);
    for (int64_t item = warp; item < rows * n; item += kWarps) {
      const int64_t i = first + item / n, p = base + list[item % n];
      const float y = warp_dot(w + i * m, hidden + p * m, m, vec);
      if (lane == 0) expert_out[p * d + i] = from_f<T>(y);
    }
    __syncthreads();
  }
}

// out[t, i] = T(sum over slots k, in order, of weights[t, k] * expert_out[t * slots + k, i]).
template <typename T>
__global__ void moe_combine_kernel(const int64_t* chosen, const float* weights, const T* expert_out, T* out,
                                   int64_t slots, int64_t experts, int64_t d) {
  const int64_t t = blockIdx.x;
  for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
    float acc = 0;
    for (int64_t k = 0; k < slots; ++k) {
      const int64_t p = t * slots + k, e = chosen[p];
      if (e >= 0 && e < experts) acc += to_f(expert_out[p * d + i]) * weights[p];
    }
    out[t * d + i] = from_f<T>(acc);
  }
}
}  // namespace

template <typename T>
cudaError_t moe_experts(const T* x, const int64_t* chosen, const float* weights, const T* gate_up, const T* down,
                        T* hidden, T* expert_out, T* out, int64_t tokens, int64_t slots, int64_t experts, int64_t d,
                        int64_t m, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  if (experts > 2147483647 || tokens > 2147483647 || (m + kRows - 1) / kRows > 65535 ||
      (d + kRows - 1) / kRows > 65535) {
    return cudaErrorInvalidValue;
  }
  constexpr int64_t P = 16 / sizeof(T);
  const int64_t pairs = tokens * slots;
  const bool vec_up = d % P == 0 && aligned16(x) && aligned16(gate_up);
  const bool vec_down = m % P == 0 && aligned16(down) && aligned16(hidden);
  cudaError_t err = cudaSuccess;
  if (slots > 0 && experts > 0) {
    err = launch_kernel(moe_up_kernel<T>,
                        dim3(static_cast<unsigned>(experts), static_cast<unsigned>((m + kRows - 1) / kRows)), kThreads,
                        0, stream, x, chosen, gate_up, hidden, pairs, slots, d, m, vec_up);
    if (err != cudaSuccess) return err;
    err = launch_kernel(moe_down_kernel<T>,
                        dim3(static_cast<unsigned>(experts), static_cast<unsigned>((d + kRows - 1) / kRows)), kThreads,
                        0, stream, chosen, down, hidden, expert_out, pairs, d, m, vec_down);
    if (err != cudaSuccess) return err;
  }
  return launch_kernel(moe_combine_kernel<T>, dim3(static_cast<unsigned>(tokens)), kThreads, 0, stream, chosen, weights,
                       expert_out, out, slots, experts, d);
}

#define INSTANTIATE(T)                                                                                                 \
  template cudaError_t moe_experts<T>(const T*, const int64_t*, const float*, const T*, const T*, T*, T*, T*, int64_t, \
                                      int64_t, int64_t, int64_t, int64_t, cudaStream_t);
BLOCKBATCH_CUDA_INSTANTIATE(INSTANTIATE)

}  // namespace blockbatch::cuda
