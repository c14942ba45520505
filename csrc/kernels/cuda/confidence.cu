// Proposal + confidence (CUDA): per row, argmax (lowest id on ties) and 1 / sum exp(l - max)
// with the sum in double; one block per row, no probability matrix.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.cuh"

namespace blockbatch::cuda {

namespace {
constexpr int kThreads = 256;

template <typename T>
__global__ void confidence_kernel(const T* logits, int64_t vocab, int64_t exclude, int64_t* argmax, double* conf) {
  __shared__ float best_v[kThreads];
  __shared__ int64_t best_i[kThreads];
  __shared__ double scratch[32];
  __shared__ float max_scratch[32];
  const T* l = logits + blockIdx.x * vocab;
  float bv = -INFINITY, mx = -INFINITY;
  int64_t bi = vocab;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    const float v = to_f(l[j]);
    mx = fmaxf(mx, v);
    if (v > bv && j != exclude) {  // strided scan visits ids in increasing order: strict > keeps the lowest
      bv = v;
      bi = j;
    }
  }
  const double m = block_max(mx, max_scratch);
  best_v[threadIdx.x] = bv;
  best_i[threadIdx.x] = bi;
  __syncthreads();
  for (int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) {
      const float ov = best_v[threadIdx.x + s];
      const int64_t oi = best_i[threadIdx.x + s];
      if (ov > best_v[threadIdx.x] || (ov == best_v[threadIdx.x] && oi < best_i[threadIdx.x])) {
        best_v[threadIdx.x] = ov;
        best_i[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  double sum = 0;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) sum += exp(static_cast<double>(to_f(l[j])) - m);
  sum = block_sum(sum, scratch);
  if (threadIdx.x == 0) {
    argmax[blockIdx.x] = best_i[0];
    conf[blockIdx.x] = exp(static_cast<double>(best_v[0]) - m) / sum;
  }
}
template <typename T>
__global__ void sparse_probs_kernel(const T* logits, int64_t vocab, double floor, int64_t max_k, int64_t* ids,
                                    double* probs) {
  __shared__ float max_scratch[32];
  __shared__ double scratch[32];
  __shared__ unsigned long long count;
  const T* l = logits + blockIdx.x * vocab;
  int64_t* row_ids = ids + blockIdx.x * max_k;
  double* row_probs = probs + blockIdx.x * max_k;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) mx = fmaxf(mx, to_f(l[j]));
  const double m = block_max(mx, max_scratch);
  double sum = 0;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) sum += exp(static_cast<double>(to_f(l[j])) - m);
  sum = block_sum(sum, scratch);
  for (int64_t k = threadIdx.x; k < max_k; k += blockDim.x) {
    row_ids[k] = -1;
    row_probs[k] = 0;
  }
  if (threadIdx.x == 0) count = 0;
  __syncthreads();
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    const double p = exp(static_cast<double>(to_f(l[j])) - m) / sum;
    if (p > floor) {
      const unsigned long long slot = atomicAdd(&count, 1ull);
      if (slot < static_cast<unsigned long long>(max_k)) {
        row_ids[slot] = j;
        row_probs[slot] = p;
      }
    }
  }
}
}  // namespace

template <typename T>
cudaError_t sparse_probs(const T* logits, int64_t rows, int64_t vocab, double floor, int64_t max_k, int64_t* ids,
                         double* probs, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  sparse_probs_kernel<T><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, vocab, floor, max_k, ids, probs);
  return cudaGetLastError();
}

template <typename T>
cudaError_t confidence(const T* logits, int64_t rows, int64_t vocab, int64_t exclude, int64_t* argmax, double* conf,
                       cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  confidence_kernel<T><<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(logits, vocab, exclude, argmax, conf);
  return cudaGetLastError();
}

#define INSTANTIATE(T)                                                                                  \
  template cudaError_t confidence<T>(const T*, int64_t, int64_t, int64_t, int64_t*, double*, cudaStream_t); \
  template cudaError_t sparse_probs<T>(const T*, int64_t, int64_t, double, int64_t, int64_t*, double*, cudaStream_t);
BLOCKBATCH_CUDA_INSTANTIATE(INSTANTIATE)
#undef INSTANTIATE

}  // namespace blockbatch::cuda
