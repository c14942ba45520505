#include "decode/step.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/div.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/gather.h>
#include <ATen/ops/log.h>
#include <ATen/ops/neg.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/softmax.h>

#include <limits>

#include "torch/ops.h"

namespace blockbatch {

at::Tensor PackedQueries::run(const Model& model, const at::Tensor& kv, KvMode mode) const {
  // One int64 host buffer -> one copy to the device; the index tensors are views into it.
  const int64_t n_tok = size(), n_rows = rows();
  const bool prefix = mode == KvMode::kPrefix, select = !logit_index.empty();
  std::vector<int64_t> host;
  host.reserve(2 * n_tok + n_rows + 1 + n_rows + (prefix ? n_rows : 0) + logit_index.size());
  auto append = [&](const std::vector<int64_t>& v) { host.insert(host.end(), v.begin(), v.end()); };
  append(tokens);
  append(positions);
  append(cu_seqlens);
  append(kv_rows);
  if (prefix) append(prefix_lens);
  if (select) append(logit_index);
  at::Tensor all = at::from_blob(host.data(), {static_cast<int64_t>(host.size())}, at::kLong)
                       .to(model.device(), /*non_blocking=*/false, /*copy=*/true);
  int64_t at_ = 0;
  auto take = [&](int64_t n) {
    at::Tensor t = all.narrow(0, at_, n);
    at_ += n;
    return t;
  };
  ForwardBatch b;
  b.tokens = take(n_tok);
  b.positions = take(n_tok);
  b.cu_seqlens = take(n_rows + 1);
  at::Tensor rows = take(n_rows);
  if (kv.defined()) b.kv_rows = rows;
  if (prefix) b.prefix_lens = take(n_rows);
  if (select) b.logit_index = take(static_cast<int64_t>(logit_index.size()));
  b.kv = kv;
  b.mode = mode;
  return model.forward(b);
}

Proposals propose(const at::Tensor& logits, int64_t mask_id, double temperature, at::Generator& generator) {
  Proposals p;
  const int64_t n = logits.size(0);
  at::Tensor token, conf;
  if (temperature > 0) {
    // Fast-dLLM's Gumbel-max: argmax(exp(l) / (-log u)^T), u ~ U(0, 1) in float64.
    at::Tensor l64 = logits.to(at::kDouble).cpu();
    at::Tensor noise = at::rand(l64.sizes(), generator, at::TensorOptions().dtype(at::kDouble));
    at::Tensor score = at::div(l64.exp(), at::pow(at::neg(at::log(noise)), temperature));
    score.select(1, mask_id).fill_(-std::numeric_limits<double>::infinity());
    token = at::argmax(score, -1);
    conf = at::softmax(l64, -1).gather(-1, token.unsqueeze(-1)).squeeze(-1);
  } else {
    std::tie(token, conf) = ops::confidence(logits.contiguous(), mask_id);
    token = token.cpu();
    conf = conf.cpu();
  }
  p.token.assign(token.const_data_ptr<int64_t>(), token.const_data_ptr<int64_t>() + n);
  p.conf.assign(conf.const_data_ptr<double>(), conf.const_data_ptr<double>() + n);
  return p;
}

}  // namespace blockbatch
