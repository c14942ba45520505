// CUDA implementation of packed_attention: the tensor-core flash attention (bf16 / fp16, where it
// applies) or the reference kernel.
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <type_traits>

#include "kernels/cuda/kernels.cuh"
#include "ops/checks.h"
#include "ops/cuda/common.h"
#include "ops/cuda/settings.h"
#include "ops/impl.h"

namespace blockbatch {

using namespace cuda_ops;

at::Tensor packed_attention_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& cu_seqlens, const std::optional<at::Tensor>& kv,
                                 const std::optional<at::Tensor>& kv_rows, const std::optional<at::Tensor>& cache_lens,
                                 int64_t layer, bool attend_fresh, const std::optional<at::Tensor>& kv_pages,
                                 const std::optional<at::Tensor>& key_index,
                                 const std::optional<at::Tensor>& key_offsets) {
  check_packed_attention(q, k, v, cu_seqlens, kv, kv_rows, cache_lens, layer, kv_pages, key_index, key_offsets);
  check_cuda(cu_seqlens, "cu_seqlens");
  const c10::cuda::CUDAGuard guard(q.device());
  at::Tensor out = at::empty({q.size(0), q.size(1) * q.size(2)}, q.options());
  const cpu::AttentionArgs a = attention_args(q, k, v, cu_seqlens, kv, kv_rows, cache_lens, layer, attend_fresh, out,
                                              kv_pages, key_index, key_offsets);
  const int64_t max_keys = (attend_fresh ? q.size(0) : 0) + (kv.has_value() ? a.geometry.length : 0);  // no host sync
  const int sm_major = device_attribute<cudaDevAttrComputeCapabilityMajor>(q.get_device());
  dispatch_cuda_type(q.scalar_type(), "packed_attention", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    if constexpr (!std::is_same_v<T, float>) {
      if (cuda::flash_attention_supported(a, 1, sm_major)) {
        // Batch-invariant mode: one split, whatever the pack (the heuristic reads its size).
        const int splits =
            batch_invariant()
                ? 1
                : attention_splits(cuda::flash_attention_splits(
                      a, q.size(0), max_keys, device_attribute<cudaDevAttrMultiProcessorCount>(q.get_device())));
        at::Tensor part;  // split-key partial results (fp32), merged by the launch's second kernel
        if (splits > 1) part = at::empty({splits, q.size(0), q.size(1), q.size(2) + 2}, q.options().dtype(at::kFloat));
        const int variant = attention_variant();
        check_launch(cuda::flash_attention<T>(a, q.size(0), splits, splits > 1 ? part.data_ptr<float>() : nullptr,
                                              variant, stream),
                     "packed_attention (tensor cores)");
        return;
      }
    }
    check_launch(cuda::packed_attention<T>(a, q.size(0), max_keys, stream), "packed_attention");
  });
  return out;
}

}  // namespace blockbatch
