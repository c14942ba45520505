#include "decode/batch/kv_pool.h"

#include <ATen/ops/empty.h>
#include <c10/core/StreamGuard.h>
#include <c10/util/Exception.h>

#include <vector>

#include "decode/batch/pack.h"  // default_stream_of

namespace blockbatch {

KvPool::KvPool(const Network& model, int64_t rows, int64_t max_length, bool scratch)
    : rows_(rows), max_length_(max_length) {
  TORCH_CHECK_VALUE(rows >= 0 && max_length > 0, "KvPool: rows >= 0 and max_length > 0");
  const c10::OptionalStreamGuard on(default_stream_of(model.device()));  // the pool where it is used
  const int64_t all = rows + (scratch ? 1 : 0);
  if (all == 0) return;
  // Uninitialised: take() zeroes each range as it hands it out, so the pages of rows never used are
  // never touched (an mmap'd CPU allocation then takes no memory for them).
  const at::Tensor like = model.new_kv(0, max_length);  // the layout (and max_length's check)
  std::vector<int64_t> shape = like.sizes().vec();
  shape[0] = all;
  double bytes = static_cast<double>(c10::elementSize(like.scalar_type()));
  for (int64_t d : shape) bytes *= static_cast<double>(d);
  try {
    pool_ = at::empty(shape, like.options());
  } catch (const c10::Error& e) {  // OutOfMemoryError (CUDA), the CPU allocator's enforce
    TORCH_CHECK_VALUE(false, "the KV pool of ", all, " rows of ", max_length, " positions (",
                      bytes / static_cast<double>(int64_t{1} << 30), " GiB) cannot be allocated on ", model.device(),
                      ": lower kv_budget_bytes, max_batch or max_length (", e.what_without_backtrace(), ")");
  }
  if (scratch) pool_.narrow(0, rows, 1).zero_();  // every padded pack writes it
}

std::optional<KvPool::Lease> KvPool::take(int64_t rows) {
  TORCH_CHECK_VALUE(rows >= 1 && rows <= rows_, "a request needs ", rows, " KV rows of ", max_length_,
                    " positions but the KV budget holds ", rows_,
                    " (raise kv_budget_bytes, or decode it with fewer block sizes)");
  int64_t at = 0;  // first fit, the ranges in row order
  for (const auto& [first, n] : taken_) {
    if (first - at >= rows) break;
    at = first + n;
  }
  if (at + rows > rows_) return std::nullopt;
  taken_[at] = rows;
  in_use_ += rows;
  Lease lease{at, rows, pool_.narrow(0, at, rows)};
  lease.view.zero_();  // as a fresh buffer: nothing of an earlier request is ever read
  return lease;
}

void KvPool::give_back(const Lease& lease) {
  if (taken_.erase(lease.first)) in_use_ -= lease.rows;
}

}  // namespace blockbatch
