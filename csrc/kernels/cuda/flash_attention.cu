// Tensor-core attention (flash_common.cuh has the algorithm): the entry points of kernels.cuh,
// the key-split count, and combine_kernel, which merges the key splits' partial results. The
// kernels are in flash_tiles.cu (variants 1-3).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "kernels/cuda/flash_common.cuh"

namespace blockbatch::cuda {

namespace flash {
namespace {

// One block per (token, head), HD threads: merge the splits' partial results (flash_common.cuh's
// M / L / O formulas, for one output dimension of one query).
template <typename T, int HD>
__global__ void __launch_bounds__(HD)
    combine_kernel(const float* part, int splits, int64_t tokens, int64_t heads, T* out) {
  constexpr int W = HD + 2;
  const int64_t tok = blockIdx.x, h = blockIdx.y;
  const int d = threadIdx.x;
  float M = -INFINITY;
  for (int s = 0; s < splits; ++s) M = fmaxf(M, part[((s * tokens + tok) * heads + h) * W + HD]);
  float L = 0.0f, acc = 0.0f;
  if (M != -INFINITY) {  // else no split saw a key: L = 0, and the output is 0
    for (int s = 0; s < splits; ++s) {
      const float* p = part + ((s * tokens + tok) * heads + h) * W;
      const float w = merge_weight(p[HD], M);  // 0 for a split without keys (m = -inf)
      L += p[HD + 1] * w;
      acc += p[d] * w;
    }
  }
  out[tok * heads * HD + h * HD + d] = from_f<T>(L > 0.0f ? acc / L : 0.0f);
}

}  // namespace

template <typename T, int HD>
cudaError_t launch_combine(const cpu::AttentionArgs& a, int64_t tokens, int splits, const float* part,
                           cudaStream_t stream) {
  return launch_kernel(combine_kernel<T, HD>, dim3(static_cast<unsigned>(tokens), static_cast<unsigned>(a.heads)), HD,
                       0, stream, part, splits, tokens, a.heads, static_cast<T*>(a.out));
}

#define INSTANTIATE(T, HD) \
  template cudaError_t launch_combine<T, HD>(const cpu::AttentionArgs&, int64_t, int, const float*, cudaStream_t);
INSTANTIATE(__nv_bfloat16, 64)
INSTANTIATE(__nv_bfloat16, 128)
INSTANTIATE(__half, 64)
INSTANTIATE(__half, 128)
#undef INSTANTIATE

}  // namespace flash

bool flash_attention_supported(const cpu::AttentionArgs& a, int dtype_code, int sm_major) {
  return dtype_code != 0 && sm_major >= 8 && (a.head_dim == 64 || a.head_dim == 128) && a.q_stride % 8 == 0 &&
         a.kv_stride % 8 == 0 && aligned16(a.q) && aligned16(a.k) && aligned16(a.v) && aligned16(a.out) &&
         (a.cache == nullptr || aligned16(a.cache));
}

int flash_attention_splits(const cpu::AttentionArgs& a, int64_t tokens, int64_t max_keys, int sm_count) {
  using flash::kBlockK, flash::kBlockQ;
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
  using flash::launch_tiles;
  if (tokens == 0) return cudaSuccess;
  if (splits < 1 || (splits > 1 && part == nullptr) || variant < 1 || variant > 3) return cudaErrorInvalidValue;
  const bool hd64 = a.head_dim == 64;
  switch (variant) {
    case 1:
      return hd64 ? launch_tiles<T, 64, 1>(a, tokens, splits, part, stream)
                  : launch_tiles<T, 128, 1>(a, tokens, splits, part, stream);
    case 2:
      return hd64 ? launch_tiles<T, 64, 2>(a, tokens, splits, part, stream)
                  : launch_tiles<T, 128, 2>(a, tokens, splits, part, stream);
    default:
      return hd64 ? launch_tiles<T, 64, 3>(a, tokens, splits, part, stream)
                  : launch_tiles<T, 128, 3>(a, tokens, splits, part, stream);
  }
}

template cudaError_t flash_attention<__nv_bfloat16>(const cpu::AttentionArgs&, int64_t, int, float*, int, cudaStream_t);
template cudaError_t flash_attention<__half>(const cpu::AttentionArgs&, int64_t, int, float*, int, cudaStream_t);

}  // namespace blockbatch::cuda
