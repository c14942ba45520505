// Packed variable-length bidirectional attention over per-row KV (CUDA, straightforward form):
// one block per (query token, head); scores for all keys in shared memory, block softmax,
// then each thread accumulates output dimensions. fp32 accumulation for every dtype.
#include <atomic>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/kernels.cuh"
#include "kernels/cuda/launch.cuh"

namespace blockbatch::cuda {

namespace {
constexpr int kThreads = 128;

template <typename T>
__global__ void attention_kernel(cpu::AttentionArgs a) {
  BLOCKBATCH_DYNAMIC_SHARED(float, smem);  // [head_dim] query, then [n_keys] scores
  __shared__ float scratch[32];
  const int64_t t = blockIdx.x, h = blockIdx.y;
  const int64_t hd = a.head_dim, kvh = h / (a.heads / a.kv_heads);
  const int64_t r = row_of(a.cu_seqlens, a.rows, t);
  const int64_t row_begin = a.cu_seqlens[r], row_end = a.cu_seqlens[r + 1];
  const T* q = static_cast<const T*>(a.q) + t * a.q_stride + h * hd;
  const T* kf = static_cast<const T*>(a.k) + row_begin * a.kv_stride + kvh * hd;
  const T* vf = static_cast<const T*>(a.v) + row_begin * a.kv_stride + kvh * hd;
  const T* cache = static_cast<const T*>(a.cache);
  // inside the buffer; a gathered key set: its count, key j at position keys[j]
  const int64_t n_cache = cache ? a.geometry.cache_keys(a.kv_rows[r], a.row_cache_len(r)) : 0;
  const int64_t* keys = cache ? a.row_keys(r) : nullptr;
  const int64_t n_fresh = a.attend_fresh ? row_end - row_begin : 0;
  const int64_t nk = n_cache + n_fresh;
  // Cached key j is kc / vc + slot(j) (-1: no page, read as zero).
  const cpu::KvGeometry& g = a.geometry;
  const int64_t kv_row = cache ? a.kv_rows[r] : 0;
  const T* kc = cache ? cache + g.row_base(kv_row, a.layer, 0, kvh) : nullptr;
  const T* vc = cache ? cache + g.row_base(kv_row, a.layer, 1, kvh) : nullptr;
  auto slot = [&](int64_t j) -> int64_t {  // offset of cached key j from kc / vc; -1: none (read as zero)
    if (keys == nullptr) return g.slot_from_base(kv_row, j);
    const int64_t p = keys[j];
    return p < 0 || p >= g.length ? -1 : g.slot_from_base(kv_row, p);
  };
  float* qs = smem;
  float* scores = smem + hd;
  const float scale = rsqrtf(static_cast<float>(hd));
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = to_f(q[d]) * scale;
  __syncthreads();
  float local_max = -INFINITY;
  for (int64_t j = threadIdx.x; j < nk; j += blockDim.x) {
    const int64_t o = j < n_cache ? slot(j) : 0;
    const T* kj = j < n_cache ? (o < 0 ? nullptr : kc + o) : kf + (j - n_cache) * a.kv_stride;
    float s = 0;
    if (kj != nullptr)
      for (int64_t d = 0; d < hd; ++d) s += qs[d] * to_f(kj[d]);
    scores[j] = s;
    local_max = fmaxf(local_max, s);
  }
  const float mx = block_max(local_max, scratch);
  float local_sum = 0;
  for (int64_t j = threadIdx.x; j < nk; j += blockDim.x) {
    const float p = __expf(scores[j] - mx);
    scores[j] = p;
    local_sum += p;
  }
  const float inv = 1.0f / block_sum(local_sum, scratch);
  T* o = static_cast<T*>(a.out) + t * a.heads * hd + h * hd;
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float acc = 0;
    for (int64_t j = 0; j < nk; ++j) {
      const int64_t o = j < n_cache ? slot(j) : 0;
      const T* vj = j < n_cache ? (o < 0 ? nullptr : vc + o) : vf + (j - n_cache) * a.kv_stride;
      if (vj != nullptr) acc += scores[j] * to_f(vj[d]);
    }
    o[d] = from_f<T>(acc * inv);
  }
}
}  // namespace

template <typename T>
cudaError_t packed_attention(const cpu::AttentionArgs& a, int64_t tokens, int64_t max_keys, cudaStream_t stream) {
  if (tokens == 0) return cudaSuccess;
  const size_t shared = static_cast<size_t>(a.head_dim + max_keys) * sizeof(float);
  if (shared > 48 * 1024) {  // raise the opt-in only when a larger size is first needed (an eager
    // warm-up run: the decode loop never records a shape it has not run before)
    static std::atomic<int> opted_in[64];
    int device = 0;
    cudaError_t e = cudaGetDevice(&device);
    if (e != cudaSuccess) return e;
    std::atomic<int>& have = opted_in[device & 63];
    if (static_cast<int>(shared) > have.load()) {
      e = cudaFuncSetAttribute(attention_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(shared));
      if (e != cudaSuccess) return e;
      have.store(static_cast<int>(shared));
    }
  }
  dim3 grid(static_cast<unsigned>(tokens), static_cast<unsigned>(a.heads));
  return launch_kernel(attention_kernel<T>, grid, kThreads, shared, stream, a);
}

#define INSTANTIATE(T) \
  template cudaError_t packed_attention<T>(const cpu::AttentionArgs&, int64_t, int64_t, cudaStream_t);
BLOCKBATCH_CUDA_INSTANTIATE(INSTANTIATE)
#undef INSTANTIATE

}  // namespace blockbatch::cuda
