#include "decode/logprobs.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/where.h>
#include <c10/util/Exception.h>

#include <limits>
#include <tuple>

namespace blockbatch {

LogprobRecord::LogprobRecord(std::optional<int64_t> top, int64_t length, c10::Device device) {
  if (!top) return;
  top_ = *top;
  table_ = at::full({length, 1 + 2 * top_}, std::numeric_limits<double>::quiet_NaN(),
                    at::TensorOptions().dtype(at::kDouble).device(device));
}

void LogprobRecord::record(const at::Tensor& positions, const at::Tensor& rows, const at::Tensor& before,
                           const at::Tensor& after) {
  if (!on() || positions.numel() == 0) return;
  TORCH_CHECK(rows.dim() == 2 && rows.size(0) == positions.numel() && before.numel() == positions.numel() &&
                  after.numel() == positions.numel(),
              "logprobs: internal error: ", positions.numel(), " positions, logits rows of shape ", rows.sizes());
  const at::Tensor ls = at::log_softmax(rows.to(at::kFloat), -1);
  const at::Tensor token = after.to(at::kLong).clamp(0, ls.size(1) - 1).unsqueeze(1);
  at::Tensor values = ls.gather(1, token).to(at::kDouble);  // [n, 1]
  if (top_ > 0) {
    auto [v, i] = at::topk(ls, top_, -1);
    values = at::cat({values, i.to(at::kDouble), v.to(at::kDouble)}, 1);
  }
  const at::Tensor changed = before.ne(after).unsqueeze(1);
  const at::Tensor now = table_.index_select(0, positions);
  table_.index_copy_(0, positions, at::where(changed, values, now));
}

void LogprobRecord::record(const std::vector<int64_t>& positions, const at::Tensor& rows,
                           const std::vector<int64_t>& before, const std::vector<int64_t>& after) {
  if (!on() || positions.empty()) return;
  const auto dev = [&](const std::vector<int64_t>& v) { return at::tensor(v, at::kLong).to(table_.device()); };
  record(dev(positions), rows, dev(before), dev(after));
}

std::vector<int64_t> LogprobRecord::held(const std::vector<int64_t>& canvas,
                                         const std::vector<int64_t>& positions) const {
  std::vector<int64_t> out;
  if (!on()) return out;
  out.reserve(positions.size());
  for (int64_t q : positions) out.push_back(canvas[q]);
  return out;
}

void LogprobRecord::forget(int64_t from, int64_t count) {
  if (on() && count > 0) table_.narrow(0, from, count).fill_(std::numeric_limits<double>::quiet_NaN());
}

at::Tensor LogprobRecord::rows(int64_t from, int64_t count) const {
  if (!on()) return {};
  return table_.narrow(0, from, count).cpu();
}

}  // namespace blockbatch
