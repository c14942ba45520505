// CUDA implementations of the ops that turn logits into decisions: confidence (proposal and its
// probability), sparse_probs (BlockBatch's probability maps) and commit_ (one commit-rule step).
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

std::tuple<at::Tensor, at::Tensor> confidence_cuda(const at::Tensor& logits, int64_t exclude) {
  TORCH_CHECK(logits.dim() == 2 && logits.size(1) > 0 && logits.is_contiguous(),
              "logits must be a contiguous [rows, vocab] tensor, got shape ", logits.sizes());
  const c10::cuda::CUDAGuard guard(logits.device());
  at::Tensor argmax = at::empty({logits.size(0)}, logits.options().dtype(at::kLong));
  at::Tensor conf = at::empty({logits.size(0)}, logits.options().dtype(at::kDouble));
  dispatch_cuda_type(logits.scalar_type(), "confidence", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    check_launch(
        cuda::confidence<T>(ptr<T>(logits), logits.size(0), logits.size(1), exclude, argmax.data_ptr<int64_t>(),
                            conf.data_ptr<double>(), c10::cuda::getCurrentCUDAStream()),
        "confidence");
  });
  return {argmax, conf};
}

std::tuple<at::Tensor, at::Tensor> sparse_probs_cuda(const at::Tensor& logits, double floor, int64_t max_k) {
  check_logits(logits);
  check_sparse_probs(logits, floor, max_k);
  const c10::cuda::CUDAGuard guard(logits.device());
  at::Tensor ids = at::empty({logits.size(0), max_k}, logits.options().dtype(at::kLong));
  at::Tensor probs = at::empty({logits.size(0), max_k}, logits.options().dtype(at::kDouble));
  dispatch_cuda_type(logits.scalar_type(), "sparse_probs", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    check_launch(
        cuda::sparse_probs<T>(ptr<T>(logits), logits.size(0), logits.size(1), floor, max_k, ids.data_ptr<int64_t>(),
                              probs.data_ptr<double>(), c10::cuda::getCurrentCUDAStream()),
        "sparse_probs");
  });
  return {ids, probs};
}

at::Tensor commit_cuda(const at::Tensor& canvas, const at::Tensor& window, const at::Tensor& token,
                       const at::Tensor& conf, const at::Tensor& k, int64_t mask_id, int64_t eos_id,
                       const std::string& rule, double threshold, double factor) {
  check_commit(canvas, window, token, conf, k, rule);  // window values: the kernel skips those outside the canvas
  const c10::cuda::CUDAGuard guard(canvas.device());
  at::Tensor counts = at::empty({3}, canvas.options());
  const int code = rule == "threshold" ? 0 : rule == "fixed" ? 1 : 2;  // one of the three (check_commit)
  check_launch(cuda::commit(canvas.data_ptr<int64_t>(), canvas.size(0), window.const_data_ptr<int64_t>(),
                            token.const_data_ptr<int64_t>(), conf.const_data_ptr<double>(), k.const_data_ptr<int64_t>(),
                            window.size(0), mask_id, eos_id, code, threshold, factor, counts.data_ptr<int64_t>(),
                            c10::cuda::getCurrentCUDAStream()),
               "commit_");
  return counts;
}

}  // namespace blockbatch
