// moe_experts on CUDA: the grouped path (ops/moe.cpp: the router's choices read on the host, one
// cuBLAS GEMM per active expert) by default, or with BLOCKBATCH_MOE_KERNEL=fused the kernels of
// kernels/cuda/moe.cu, which keep the choices on the device (no host sync: a CUDA graph can record
// the layer). Expert ids outside [0, experts) are refused on the host by the grouped path and
// skipped by the kernels.
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

at::Tensor moe_experts_cuda(const at::Tensor& x, const at::Tensor& chosen, const at::Tensor& weights,
                            const at::Tensor& gate_up, const at::Tensor& down) {
  check_moe_experts(x, chosen, weights, gate_up, down);
  check_cuda(x, "x");
  if (!moe_fused()) return moe_experts_grouped(x, chosen, weights, gate_up, down);
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t T = x.size(0), K = chosen.size(1), E = gate_up.size(0), d = x.size(1), m = down.size(2);
  at::Tensor out = at::empty({T, d}, x.options());
  at::Tensor hidden = at::empty({T * K, m}, x.options());
  at::Tensor expert_out = at::empty({T * K, d}, x.options());
  dispatch_cuda_type(x.scalar_type(), "moe_experts", [&](auto* tag) {
    using T_ = std::remove_pointer_t<decltype(tag)>;
    check_launch(cuda::moe_experts<T_>(ptr<T_>(x), ptr<int64_t>(chosen), ptr<float>(weights), ptr<T_>(gate_up),
                                       ptr<T_>(down), ptr<T_>(hidden), ptr<T_>(expert_out), ptr<T_>(out), T, K, E, d, m,
                                       c10::cuda::getCurrentCUDAStream()),
                 "moe_experts");
  });
  return out;
}

}  // namespace blockbatch
