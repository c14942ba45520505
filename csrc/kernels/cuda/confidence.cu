// Proposal + confidence (CUDA): per row, argmax (lowest id on ties) and 1 / sum exp(l - max)
// with the sum in double; one block per row, no probability matrix. Both kernels read the row's
// logits once for max and sum together (online softmax: each thread keeps a running max and a sum
// rescaled when the max grows; the block merges the (max, sum) pairs); sparse_probs reads it a
// second time to pick the tokens above the floor. Rows whose logits are 16-byte aligned are read
// 16 bytes at a time; each such chunk updates the running max once and adds its exps as
// independent terms (the per-element running update was a serial chain of float64 exps that
// left the 32-row step latency-bound: 0.26 ms for 32 x 126464 bf16 logits on an H200).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.cuh"
#include "kernels/cuda/launch.cuh"

namespace blockbatch::cuda {

namespace {
constexpr int kThreads = 512;  // a power of two (tree reductions)

// Running softmax normaliser: sum of exp(l - m) over the logits seen, m their max.
struct MaxSum {
  float m = -INFINITY;
  double s = 0.0;
  __device__ __forceinline__ void add(float v) {
    if (v == -INFINITY) return;
    if (v > m) {
      s = m == -INFINITY ? 0.0 : s * exp(static_cast<double>(m) - v);
      m = v;
    }
    s += exp(static_cast<double>(v) - m);
  }
  // n logits whose max is cm: one rescale at most, then n independent exps.
  template <int n>
  __device__ __forceinline__ void add_chunk(const float* v, float cm) {
    if (cm == -INFINITY) return;
    if (cm > m) {
      s = m == -INFINITY ? 0.0 : s * exp(static_cast<double>(m) - cm);
      m = cm;
    }
    double acc = 0.0;
#pragma unroll
    for (int u = 0; u < n; ++u) acc += exp(static_cast<double>(v[u]) - m);  // exp(-inf) = 0
    s += acc;
  }
  __device__ __forceinline__ void merge(const MaxSum& o) {
    if (o.m == -INFINITY) return;
    if (m == -INFINITY) {
      *this = o;
      return;
    }
    const float M = fmaxf(m, o.m);
    s = s * exp(static_cast<double>(m) - M) + o.s * exp(static_cast<double>(o.m) - M);
    m = M;
  }
};

// Block-wide merge of every thread's MaxSum (all threads get the result).
__device__ __forceinline__ MaxSum block_max_sum(MaxSum v, float* ms, double* ss) {
  ms[threadIdx.x] = v.m;
  ss[threadIdx.x] = v.s;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) {
      MaxSum a{ms[threadIdx.x], ss[threadIdx.x]};
      a.merge(MaxSum{ms[threadIdx.x + w], ss[threadIdx.x + w]});
      ms[threadIdx.x] = a.m;
      ss[threadIdx.x] = a.s;
    }
    __syncthreads();
  }
  const MaxSum r{ms[0], ss[0]};
  __syncthreads();
  return r;
}

// One thread's share of a row: its MaxSum and, with kArgmax, its largest logit (lowest id on
// ties) other than `exclude`. kVec: the row is read as 16-byte chunks (vocab a multiple of the
// chunk, row 16-byte aligned). Each thread visits ids in increasing order, so strict > keeps the
// lowest id among equal values.
template <typename T, bool kVec, bool kArgmax>
__device__ __forceinline__ void scan_row(const T* l, int64_t vocab, int64_t exclude, MaxSum& ms, float& bv,
                                         int64_t& bi) {
  if constexpr (kVec) {
    constexpr int P = 16 / sizeof(T);
    const int64_t chunks = vocab / P;
    for (int64_t c = threadIdx.x; c < chunks; c += blockDim.x) {
      const uint4 raw = reinterpret_cast<const uint4*>(l)[c];
      const T* e = reinterpret_cast<const T*>(&raw);
      float v[P];
      float cm = -INFINITY;
#pragma unroll
      for (int u = 0; u < P; ++u) {
        v[u] = to_f(e[u]);
        cm = fmaxf(cm, v[u]);
        if (kArgmax && v[u] > bv && c * P + u != exclude) {
          bv = v[u];
          bi = c * P + u;
        }
      }
      ms.add_chunk<P>(v, cm);
    }
  } else {
    for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
      const float v = to_f(l[j]);
      ms.add(v);
      if (kArgmax && v > bv && j != exclude) {
        bv = v;
        bi = j;
      }
    }
  }
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads)
    confidence_kernel(const T* logits, int64_t vocab, int64_t exclude, int64_t* argmax, double* conf) {
  __shared__ float best_v[kThreads];
  __shared__ int64_t best_i[kThreads];
  __shared__ double ss[kThreads];
  const T* l = logits + blockIdx.x * vocab;
  float bv = -INFINITY;
  int64_t bi = vocab;
  MaxSum ms;
  scan_row<T, kVec, true>(l, vocab, exclude, ms, bv, bi);
  const MaxSum total = block_max_sum(ms, best_v, ss);  // best_v doubles as the max scratch
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
  if (threadIdx.x == 0) {
    argmax[blockIdx.x] = best_i[0];
    conf[blockIdx.x] = exp(static_cast<double>(best_v[0]) - total.m) / total.s;
  }
}

template <typename T, bool kVec>
__global__ void __launch_bounds__(kThreads)
    sparse_probs_kernel(const T* logits, int64_t vocab, double floor, int64_t max_k, int64_t* ids, double* probs) {
  __shared__ float ms_scratch[kThreads];
  __shared__ double ss_scratch[kThreads];
  __shared__ unsigned long long count;
  const T* l = logits + blockIdx.x * vocab;
  int64_t* row_ids = ids + blockIdx.x * max_k;
  double* row_probs = probs + blockIdx.x * max_k;
  MaxSum ms;
  float unused_v = -INFINITY;
  int64_t unused_i = 0;
  scan_row<T, kVec, false>(l, vocab, -1, ms, unused_v, unused_i);
  const MaxSum total = block_max_sum(ms, ms_scratch, ss_scratch);
  const double m = total.m, sum = total.s;
  for (int64_t k = threadIdx.x; k < max_k; k += blockDim.x) {
    row_ids[k] = -1;
    row_probs[k] = 0;
  }
  if (threadIdx.x == 0) count = 0;
  __syncthreads();
  // As the CPU kernel: p_j > floor needs l_j - max > log(floor * sum), so only those few ids pay
  // the float64 exp (the bound is loosened by 1e-9 so the exact comparison below decides ties).
  const double cut = log(floor * sum) - 1e-9;
  for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x) {
    const double z = static_cast<double>(to_f(l[j])) - m;
    if (z <= cut) continue;
    const double p = exp(z) / sum;
    if (p > floor) {
      const unsigned long long slot = atomicAdd(&count, 1ull);
      if (slot < static_cast<unsigned long long>(max_k)) {
        row_ids[slot] = j;
        row_probs[slot] = p;
      }
    }
  }
}
// Rows of `vocab` logits can be read in 16-byte chunks: every row start 16-byte aligned.
template <typename T>
bool vectorizable(const T* logits, int64_t vocab) {
  return aligned16(logits) && (vocab * static_cast<int64_t>(sizeof(T))) % 16 == 0;
}
}  // namespace

template <typename T>
cudaError_t sparse_probs(const T* logits, int64_t rows, int64_t vocab, double floor, int64_t max_k, int64_t* ids,
                         double* probs, cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return launch_kernel(vectorizable(logits, vocab) ? sparse_probs_kernel<T, true> : sparse_probs_kernel<T, false>,
                       static_cast<unsigned>(rows), kThreads, 0, stream, logits, vocab, floor, max_k, ids, probs);
}

template <typename T>
cudaError_t confidence(const T* logits, int64_t rows, int64_t vocab, int64_t exclude, int64_t* argmax, double* conf,
                       cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  return launch_kernel(vectorizable(logits, vocab) ? confidence_kernel<T, true> : confidence_kernel<T, false>,
                       static_cast<unsigned>(rows), kThreads, 0, stream, logits, vocab, exclude, argmax, conf);
}

#define INSTANTIATE(T)                                                                                      \
  template cudaError_t confidence<T>(const T*, int64_t, int64_t, int64_t, int64_t*, double*, cudaStream_t); \
  template cudaError_t sparse_probs<T>(const T*, int64_t, int64_t, double, int64_t, int64_t*, double*, cudaStream_t);
BLOCKBATCH_CUDA_INSTANTIATE(INSTANTIATE)
#undef INSTANTIATE

}  // namespace blockbatch::cuda
