// moe_experts: the routed experts of a mixture-of-experts layer, given the router's choices.
// The grouped implementation (the CPU op, and the CUDA op's default) reads the choices on the host
// and runs one GEMM per active expert through blockbatch::ops::linear; the CUDA op's opt-in fused
// path (ops/cuda/moe.cpp, kernels/cuda/moe.cu) keeps them on the device.
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <vector>

#include "ops/checks.h"
#include "ops/impl.h"
#include "ops/ops.h"
#ifdef BLOCKBATCH_WITH_CUDA
#include "ops/cuda/settings.h"
#endif

namespace blockbatch {

at::Tensor moe_experts_grouped(const at::Tensor& x, const at::Tensor& chosen, const at::Tensor& weights,
                               const at::Tensor& gate_up, const at::Tensor& down) {
  const int64_t T = x.size(0), K = chosen.size(1), E = gate_up.size(0), d = x.size(1);
  // Tokens grouped per expert (ascending expert, then token, then slot): one GEMM per active expert,
  // and ops::linear computes a row the same way whatever else shares it (it pads small products),
  // so a token's result does not depend on its neighbours.
  const at::Tensor host = chosen.cpu().contiguous();
  const int64_t* ch = host.const_data_ptr<int64_t>();
  std::vector<std::vector<int64_t>> rows(E), slots(E);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      const int64_t e = ch[t * K + k];
      TORCH_CHECK_INDEX(e >= 0 && e < E, "chosen[", t, ", ", k, "] = ", e, " is not an expert of gate_up (", E,
                        " experts)");
      rows[e].push_back(t);
      slots[e].push_back(k);
    }
  }
  at::Tensor out = at::zeros({T, K, d}, x.options());
  const auto index = at::TensorOptions().dtype(at::kLong).device(x.device());
  for (int64_t e = 0; e < E; ++e) {
    if (rows[e].empty()) continue;
    const int64_t n = static_cast<int64_t>(rows[e].size());
    const at::Tensor r = at::from_blob(rows[e].data(), {n}, at::kLong).to(index, false, true);
    const at::Tensor s = at::from_blob(slots[e].data(), {n}, at::kLong).to(index, false, true);
    const at::Tensor hidden = ops::silu_mul(ops::linear(x.index_select(0, r), gate_up.select(0, e)));
    out.index_put_({r, s}, ops::linear(hidden, down.select(0, e)));
  }
  // The slot-weighted sum in float32 (the dtype of weights), rounded once.
  return out.mul(weights.unsqueeze(-1)).sum(1).to(x.scalar_type());
}

at::Tensor moe_experts_cpu(const at::Tensor& x, const at::Tensor& chosen, const at::Tensor& weights,
                           const at::Tensor& gate_up, const at::Tensor& down) {
  check_moe_experts(x, chosen, weights, gate_up, down);
  return moe_experts_grouped(x, chosen, weights, gate_up, down);
}

namespace ops {
bool moe_experts_capturable(c10::Device device) {
#ifdef BLOCKBATCH_WITH_CUDA
  if (device.is_cuda()) return cuda_ops::moe_fused();
#endif
  (void)device;
  return false;
}
}  // namespace ops

}  // namespace blockbatch
