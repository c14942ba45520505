// BlockBatch bookkeeping on the GPU: csrc/kernels/branches.h run by one thread block per
// kernel (BlockExec), so a step's absorb / coordinate needs no host round trip; plus the KV row
// copy of leader sync, driven by the device-side sync_src table.
//   absorb:     one block per span (each span is a different branch row)
//   coordinate: one block (merge and sync are sequential over branches, parallel over positions)
#include "kernels/branches.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.cuh"
#include "kernels/cuda/launch.cuh"

namespace blockbatch::cuda {

namespace br = blockbatch::branches;

namespace {

constexpr int kThreads = 256;      // a power of two: the tree reductions halve it
constexpr int kScratchBytes = 16;  // per thread: the largest reduced value (br::Best)

// branches.h's executor for one thread block. Every member is called by all threads of the block
// with the same arguments and ends with a barrier, so later phases see its writes.
struct BlockExec {
  unsigned char* scratch;  // shared, kThreads * kScratchBytes

  template <typename F>
  __device__ void for_each(int64_t n, F&& f) const {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) f(i);
    __syncthreads();
  }
  // Each index evaluated once (by one thread, in increasing order per thread), then a tree
  // reduction: `op` must be associative and commutative.
  template <typename V, typename F, typename Op>
  __device__ V reduce(int64_t n, V init, F&& f, Op op) const {
    static_assert(sizeof(V) <= kScratchBytes, "reduced value larger than the scratch slot");
    V acc = init;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) acc = op(acc, f(i));
    V* s = reinterpret_cast<V*>(scratch);
    s[threadIdx.x] = acc;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
      if (threadIdx.x < w) s[threadIdx.x] = op(s[threadIdx.x], s[threadIdx.x + w]);
      __syncthreads();
    }
    const V r = s[0];
    __syncthreads();  // before the scratch is reused
    return r;
  }
  template <typename F>
  __device__ int64_t count(int64_t n, F&& f) const {
    return reduce(n, int64_t(0), [&](int64_t i) { return int64_t(f(i) ? 1 : 0); }, br::Sum{});
  }
  template <typename F>
  __device__ void once(F&& f) const {
    if (threadIdx.x == 0) f();
    __syncthreads();
  }
};

template <typename T>
struct RowLogit {
  const T* logits;
  int64_t vocab;
  __device__ double operator()(int64_t row, int64_t j) const {
    return static_cast<double>(to_f(logits[row * vocab + j]));
  }
};

template <typename T>
__global__ void __launch_bounds__(kThreads)
    absorb_kernel(br::View v, const int64_t* spans, const int64_t* token, const double* conf, const int64_t* ids,
                  const double* probs, RowLogit<T> logit, br::AbsorbParams p) {
  __shared__ __align__(16) unsigned char scratch[kThreads * kScratchBytes];
  br::absorb_span(BlockExec{scratch}, v, spans + blockIdx.x * br::kSpanFields, token, conf, ids, probs, logit,
                  logit.vocab, p);
}

__global__ void __launch_bounds__(kThreads)
    coordinate_kernel(br::View v, int64_t* flags, int64_t* sync_src, br::CoordinateParams p) {
  __shared__ __align__(16) unsigned char scratch[kThreads * kScratchBytes];
  br::coordinate(BlockExec{scratch}, v, flags, sync_src, p);
}

// kv[r] = kv[src[r]] for rows with src[r] >= 0; blockIdx.y = destination row, 16-byte words
// when the row size allows it (KV rows are whole heads: always, in practice).
template <typename W>
__global__ void kv_copy_rows_kernel(W* kv, const int64_t* src, cpu::KvPages pages, int64_t words) {
  const int64_t from = src[blockIdx.y], to = blockIdx.y;
  if (from < 0 || from >= gridDim.y || from == to) return;  // -1 keeps the row; bad sources are skipped
  for (int64_t page = 0; page < pages.per_row; ++page) {
    const int64_t p_from = pages.at(from, page), p_to = pages.at(to, page);
    if (p_from < 0 || p_to < 0 || p_from == p_to) continue;  // no page, or one both rows share
    const W* a = kv + p_from * words;
    W* b = kv + p_to * words;
    for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < words;
         i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      b[i] = a[i];
    }
  }
}

}  // namespace

template <typename T>
cudaError_t bb_absorb(const br::View& v, const int64_t* spans, int64_t n_spans, const int64_t* token,
                      const double* conf, const int64_t* ids, const double* probs, const T* logits, int64_t vocab,
                      const br::AbsorbParams& p, cudaStream_t stream) {
  if (n_spans == 0) return cudaSuccess;
  return launch_kernel(absorb_kernel<T>, static_cast<unsigned>(n_spans), kThreads, 0, stream, v, spans, token, conf,
                       ids, probs, RowLogit<T>{logits, vocab}, p);
}

cudaError_t bb_coordinate(const br::View& v, int64_t* flags, int64_t* sync_src, const br::CoordinateParams& p,
                          cudaStream_t stream) {
  return launch_kernel(coordinate_kernel, 1, kThreads, 0, stream, v, flags, sync_src, p);
}

cudaError_t kv_copy_rows(void* kv, const int64_t* src, int64_t rows, int64_t row_bytes, const cpu::KvPages& pages,
                         cudaStream_t stream) {
  if (rows == 0 || row_bytes == 0) return cudaSuccess;
  constexpr int kCopyThreads = 256;
  auto grid = [&](int64_t words) {
    const int64_t blocks = (words + kCopyThreads - 1) / kCopyThreads;
    return dim3(static_cast<unsigned>(blocks < 1024 ? blocks : 1024), static_cast<unsigned>(rows));
  };
  if (row_bytes % 16 == 0 && aligned16(kv)) {
    return launch_kernel(kv_copy_rows_kernel<int4>, grid(row_bytes / 16), kCopyThreads, 0, stream,
                         static_cast<int4*>(kv), src, pages, row_bytes / 16);
  }
  return launch_kernel(kv_copy_rows_kernel<unsigned char>, grid(row_bytes), kCopyThreads, 0, stream,
                       static_cast<unsigned char*>(kv), src, pages, row_bytes);
}

#define BLOCKBATCH_INSTANTIATE_ABSORB(T)                                                                       \
  template cudaError_t bb_absorb<T>(const br::View&, const int64_t*, int64_t, const int64_t*, const double*,   \
                                    const int64_t*, const double*, const T*, int64_t, const br::AbsorbParams&, \
                                    cudaStream_t);
BLOCKBATCH_CUDA_INSTANTIATE(BLOCKBATCH_INSTANTIATE_ABSORB)

}  // namespace blockbatch::cuda
