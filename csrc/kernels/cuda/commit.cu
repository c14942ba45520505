// One commit-rule step over a block window of a device canvas (ALGORITHMS.md 2), in one thread
// block: candidates = window positions holding the mask id; the rank of a candidate is the number
// of candidates ahead of it (higher confidence, or equal and earlier: the host's stable order).
//   threshold: conf >= tau, plus rank 0     fixed: rank < k
//   factor:    ranks before the first rank R >= 2 with conf < 1 - f / (R + 1) (all if none, or
//              if only the last rank fails)
// counts = {committed, masks left in the window, 1 if the eos id is in the window afterwards}.
#include <climits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.cuh"
#include "kernels/cuda/launch.cuh"

namespace blockbatch::cuda {

namespace {
constexpr int kThreads = 256;

__device__ __forceinline__ int rank_of(const double* c, int64_t n, int64_t i) {
  int r = 0;
  for (int64_t j = 0; j < n; ++j) r += isfinite(c[j]) && (c[j] > c[i] || (c[j] == c[i] && j < i));
  return r;
}

__global__ void commit_kernel(int64_t* canvas, int64_t length, const int64_t* window, const int64_t* token,
                              const double* conf, const int64_t* k, int64_t n, int64_t mask_id, int64_t eos_id,
                              int rule, double tau, double factor, int64_t* counts) {
  BLOCKBATCH_DYNAMIC_SHARED(double, c);  // candidate confidence, -inf for settled positions
  __shared__ int candidates, committed, first_fail, eos;
  if (threadIdx.x == 0) {
    candidates = committed = eos = 0;
    first_fail = INT_MAX;
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const bool cand = window[i] >= 0 && window[i] < length && canvas[window[i]] == mask_id;  // inside only
    c[i] = cand ? conf[i] : -INFINITY;
    if (cand) atomicAdd(&candidates, 1);
  }
  __syncthreads();
  if (rule == 2) {  // factor: the first failing rank
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      if (!isfinite(c[i])) continue;
      const int R = rank_of(c, n, i) + 1;
      if (R >= 2 && !(c[i] >= 1.0 - factor / static_cast<double>(R + 1))) atomicMin(&first_fail, R);
    }
    __syncthreads();
  }
  const int m = candidates;
  const int take = rule == 1                                  ? static_cast<int>(min(*k, static_cast<int64_t>(m)))
                   : first_fail == INT_MAX || first_fail == m ? m
                                                              : first_fail - 1;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    if (!isfinite(c[i])) continue;
    const int r = rank_of(c, n, i);
    const bool chosen = rule == 0 ? (c[i] >= tau || r == 0) : r < take;
    if (chosen) {
      canvas[window[i]] = token[i];
      atomicAdd(&committed, 1);
    }
  }
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    if (window[i] >= 0 && window[i] < length && canvas[window[i]] == eos_id) eos = 1;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    counts[0] = committed;
    counts[1] = candidates - committed;
    counts[2] = eos;
  }
}
}  // namespace

cudaError_t commit(int64_t* canvas, int64_t length, const int64_t* window, const int64_t* token, const double* conf,
                   const int64_t* k, int64_t n, int64_t mask_id, int64_t eos_id, int rule, double tau, double factor,
                   int64_t* counts, cudaStream_t stream) {
  return launch_kernel(commit_kernel, 1, kThreads, static_cast<size_t>(n) * sizeof(double), stream, canvas, length,
                       window, token, conf, k, n, mask_id, eos_id, rule, tau, factor, counts);
}

}  // namespace blockbatch::cuda
