// CUDA implementations of BlockBatch's bookkeeping ops (bb_absorb_, bb_coordinate_: the algorithms
// of kernels/branches.h on the device) and of kv_copy_rows_ (leader sync's KV row copy).
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <type_traits>

#include "kernels/branches.h"
#include "kernels/cuda/kernels.cuh"
#include "ops/checks.h"
#include "ops/cuda/common.h"
#include "ops/cuda/settings.h"
#include "ops/impl.h"

namespace blockbatch {

using namespace cuda_ops;

// Values (span rows, windows, sync sources) live on the device: checking them here would cost a
// host sync per step, so the kernels check them (branches.h span_ok / state_ok, kv_copy_rows'
// source row) and skip what is out of bounds. Host scalars (eos_id) are checked here.
void bb_absorb_cuda(const at::Tensor& canvas, const at::Tensor& state, const at::Tensor& eos_prob,
                    const at::Tensor& map_ids, const at::Tensor& map_probs, const at::Tensor& spans,
                    const at::Tensor& token, const at::Tensor& conf, const at::Tensor& ids, const at::Tensor& probs,
                    const at::Tensor& logits, int64_t prompt_len, int64_t mask_id, int64_t eos_id, double threshold,
                    bool stop_on_eos) {
  const BranchTensors d = check_branches(canvas, state, eos_prob, map_ids, map_probs, prompt_len);
  check_absorb(d, canvas, spans, token, conf, ids, probs, logits);
  if (stop_on_eos) check_eos_id(eos_id, logits.size(1));
  const c10::cuda::CUDAGuard guard(canvas.device());
  const branches::View v = branch_view(canvas, state, eos_prob, map_ids, map_probs, prompt_len, mask_id, eos_id);
  dispatch_cuda_type(logits.scalar_type(), "bb_absorb_", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    check_launch(cuda::bb_absorb<T>(v, spans.const_data_ptr<int64_t>(), spans.size(0), token.const_data_ptr<int64_t>(),
                                    conf.const_data_ptr<double>(), ids.const_data_ptr<int64_t>(),
                                    probs.const_data_ptr<double>(), ptr<T>(logits), logits.size(1),
                                    branches::AbsorbParams{threshold, stop_on_eos, logits.size(0)},
                                    c10::cuda::getCurrentCUDAStream()),
                 "bb_absorb_");
  });
}

void bb_coordinate_cuda(const at::Tensor& canvas, const at::Tensor& state, const at::Tensor& eos_prob,
                        const at::Tensor& flags, const at::Tensor& sync_src, const at::Tensor& map_ids,
                        const at::Tensor& map_probs, int64_t prompt_len, int64_t mask_id, double merge_gate, bool merge,
                        bool sync, int64_t sync_gap, int64_t refresh_tokens, bool periodic_refresh) {
  const BranchTensors d = check_branches(canvas, state, eos_prob, map_ids, map_probs, prompt_len);
  check_coordinate(d, canvas, flags, sync_src);
  const c10::cuda::CUDAGuard guard(canvas.device());
  check_launch(cuda::bb_coordinate(
                   branch_view(canvas, state, eos_prob, map_ids, map_probs, prompt_len, mask_id, -1),
                   flags.data_ptr<int64_t>(), sync_src.data_ptr<int64_t>(),
                   branches::CoordinateParams{merge_gate, merge, sync, sync_gap, refresh_tokens, periodic_refresh},
                   c10::cuda::getCurrentCUDAStream()),
               "bb_coordinate_");
}

void kv_copy_rows_cuda(const at::Tensor& kv, const at::Tensor& src, const std::optional<at::Tensor>& kv_pages) {
  check_kv_copy_rows(kv, src, kv_pages);
  const c10::cuda::CUDAGuard guard(kv.device());
  const cpu::KvPages pages = kv_copy_pages(kv, kv_pages);
  const int64_t page_bytes = pages.store ? kv.numel() / pages.store * kv.element_size() : 0;
  check_launch(cuda::kv_copy_rows(kv.data_ptr(), src.const_data_ptr<int64_t>(), src.size(0), page_bytes, pages,
                                  c10::cuda::getCurrentCUDAStream()),
               "kv_copy_rows_");
}

}  // namespace blockbatch
