// CUDA implementations of RoPE and the KV buffer writes: rope_, kv_write_ and the fused
// rope_kv_write_.
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

namespace {

// The KV buffer's geometry for a slot write, once its row indices are known to be on the device.
cpu::KvGeometry kv_slots(const at::Tensor& kv, const at::Tensor& cu_seqlens, const at::Tensor& kv_rows,
                         const std::optional<at::Tensor>& kv_pages) {
  check_cuda(cu_seqlens, "cu_seqlens");
  check_cuda(kv_rows, "kv_rows");
  return kv_geometry(kv, kv_pages);  // paged: the table is read on the device (entries outside: no write)
}

}  // namespace

void rope_cuda(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos_sin) {
  check_rope(x, positions, cos_sin);
  const c10::cuda::CUDAGuard guard(x.device());
  dispatch_cuda_type(x.scalar_type(), "rope_", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    check_launch(cuda::rope_inplace<T>(ptr<T>(x), x.size(0), x.stride(0), x.size(1), x.size(2),
                                       positions.const_data_ptr<int64_t>(), cos_sin.const_data_ptr<float>(),
                                       cos_sin.size(0), c10::cuda::getCurrentCUDAStream()),
                 "rope_");
  });
}

void kv_write_cuda(const at::Tensor& kv, const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                   const at::Tensor& cu_seqlens, const at::Tensor& kv_rows, int64_t layer,
                   const std::optional<at::Tensor>& kv_pages) {
  check_kv_write(kv, k, v, positions, cu_seqlens, kv_rows, layer, kv_pages);
  const c10::cuda::CUDAGuard guard(kv.device());
  const cpu::KvGeometry g = kv_slots(kv, cu_seqlens, kv_rows, kv_pages);
  dispatch_cuda_type(kv.scalar_type(), "kv_write_", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    check_launch(
        cuda::kv_write<T>(ptr<T>(kv), g, layer, ptr<T>(k), ptr<T>(v), k.stride(0), positions.const_data_ptr<int64_t>(),
                          cu_seqlens.const_data_ptr<int64_t>(), kv_rows.const_data_ptr<int64_t>(),
                          cu_seqlens.size(0) - 1, k.size(0), c10::cuda::getCurrentCUDAStream()),
        "kv_write_");
  });
}

void rope_kv_write_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                        const at::Tensor& cos_sin, const at::Tensor& kv, const at::Tensor& cu_seqlens,
                        const at::Tensor& kv_rows, int64_t layer, const std::optional<at::Tensor>& kv_pages) {
  check_rope_kv_write(q, k, v, positions, cos_sin, kv, cu_seqlens, kv_rows, layer, kv_pages);
  const c10::cuda::CUDAGuard guard(kv.device());
  const cpu::KvGeometry g = kv_slots(kv, cu_seqlens, kv_rows, kv_pages);
  dispatch_cuda_type(kv.scalar_type(), "rope_kv_write_", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const bool vectorized = rope_vectorized();
    check_launch(cuda::rope_kv_write<T>(ptr<T>(q), q.stride(0), q.size(1), ptr<T>(k), ptr<T>(v), k.stride(0),
                                        positions.const_data_ptr<int64_t>(), cos_sin.const_data_ptr<float>(),
                                        cos_sin.size(0), ptr<T>(kv), g, layer, cu_seqlens.const_data_ptr<int64_t>(),
                                        kv_rows.const_data_ptr<int64_t>(), cu_seqlens.size(0) - 1, k.size(0),
                                        vectorized, c10::cuda::getCurrentCUDAStream()),
                 "rope_kv_write_");
  });
}

}  // namespace blockbatch
