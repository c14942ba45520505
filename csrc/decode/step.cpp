#include "decode/step.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/div.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/gather.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/log.h>
#include <ATen/ops/neg.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/softmax.h>

#include <algorithm>
#include <limits>

#include "ops/ops.h"

namespace blockbatch {

std::vector<int64_t> PackedQueries::host_buffer(KvMode mode) const {
  std::vector<int64_t> host;
  host.reserve(gather.size() + positions.size() + 2 * kv_rows.size() + 1 + prefix_lens.size() + kv_lens.size() +
               logit_index.size());
  auto append = [&](const std::vector<int64_t>& v) { host.insert(host.end(), v.begin(), v.end()); };
  append(gather);
  append(positions);
  append(cu_seqlens);
  append(kv_rows);
  if (mode == KvMode::kPrefix) append(prefix_lens);
  append(kv_lens);
  append(logit_index);
  return host;
}

ForwardBatch PackedQueries::batch(const at::Tensor& buffer, const at::Tensor& kv, KvMode mode,
                                  const at::Tensor& canvas) const {
  const int64_t n_tok = size(), n_rows = rows();
  int64_t at_ = 0;
  auto take = [&](int64_t n) {
    at::Tensor t = buffer.narrow(0, at_, n);
    at_ += n;
    return t;
  };
  ForwardBatch b;
  TORCH_CHECK(canvas.defined(), "PackedQueries: the canvas to gather tokens from is required");
  b.tokens = canvas.reshape({-1}).index_select(0, take(n_tok));
  b.positions = take(n_tok);
  b.cu_seqlens = take(n_rows + 1);
  at::Tensor rows_t = take(n_rows);
  if (kv.defined()) b.kv_rows = rows_t;
  if (mode == KvMode::kPrefix) b.prefix_lens = take(n_rows);
  if (!kv_lens.empty()) {
    TORCH_CHECK(mode == KvMode::kDual && static_cast<int64_t>(kv_lens.size()) == n_rows,
                "PackedQueries: kv_lens needs dual mode and one entry per row");
    b.kv_lens = take(n_rows);
  }
  if (!logit_index.empty()) b.logit_index = take(static_cast<int64_t>(logit_index.size()));
  b.kv = kv;
  b.mode = mode;
  for (int64_t p : positions) b.max_positions = std::max(b.max_positions, p + 1);
  return b;
}

Proposals sample_proposals(const at::Tensor& l64, int64_t mask_id, double temperature, at::Generator& generator) {
  // Fast-dLLM's Gumbel-max: argmax(exp(l) / (-log u)^T), u ~ U(0, 1) in float64.
  at::Tensor noise = at::rand(l64.sizes(), generator, at::TensorOptions().dtype(at::kDouble));
  at::Tensor score = at::div(l64.exp(), at::pow(at::neg(at::log(noise)), temperature));
  score.select(1, mask_id).fill_(-std::numeric_limits<double>::infinity());
  at::Tensor token = at::argmax(score, -1);
  at::Tensor conf = at::softmax(l64, -1).gather(-1, token.unsqueeze(-1)).squeeze(-1);
  return to_proposals(token, conf);
}

Proposals to_proposals(const at::Tensor& token, const at::Tensor& conf) {
  Proposals p;
  const int64_t n = token.numel();
  p.token.assign(token.const_data_ptr<int64_t>(), token.const_data_ptr<int64_t>() + n);
  p.conf.assign(conf.const_data_ptr<double>(), conf.const_data_ptr<double>() + n);
  return p;
}

at::Tensor pack_readout(const std::vector<at::Tensor>& tensors) {
  if (tensors.empty()) return at::empty({0}, at::kLong);  // a step that reads nothing back
  std::vector<at::Tensor> flat;
  for (const at::Tensor& t : tensors) {
    TORCH_CHECK(t.element_size() == 8, "readout: 8-byte elements expected, got ", t.scalar_type());
    flat.push_back(t.contiguous().view(at::kLong).reshape({-1}));
  }
  return at::cat(flat);
}

std::vector<at::Tensor> unpack_readout(const at::Tensor& host_flat, const std::vector<at::Tensor>& like) {
  std::vector<at::Tensor> out;
  int64_t at_ = 0;
  for (const at::Tensor& t : like) {
    out.push_back(host_flat.narrow(0, at_, t.numel()).view(t.scalar_type()).view(t.sizes()));
    at_ += t.numel();
  }
  return out;
}

std::vector<at::Tensor> read_back(const std::vector<at::Tensor>& tensors) {
  bool on_host = true;
  for (const at::Tensor& t : tensors) on_host = on_host && t.is_cpu();
  if (!on_host) return unpack_readout(pack_readout(tensors).cpu(), tensors);  // the one copy
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : tensors) out.push_back(t.contiguous());
  return out;
}

}  // namespace blockbatch
