// The host-canvas readout's shared pieces (host_canvas.h).
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/div.h>
#include <ATen/ops/gather.h>
#include <ATen/ops/linspace.h>
#include <ATen/ops/log.h>
#include <ATen/ops/max.h>
#include <ATen/ops/multinomial.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/zeros_like.h>

#include <algorithm>
#include <limits>

#include "decode/policies/host_canvas.h"

namespace blockbatch::host {

namespace {
constexpr double kEntropyEps = 1e-10;  // Dream's entropy: sum(p * log(p + 1e-10))
}  // namespace

at::Tensor timesteps(double eps, int64_t steps) { return at::linspace(1, eps, steps + 1, at::kFloat); }

float timestep_ratio(const at::Tensor& timesteps, int64_t step) {
  const float* t = timesteps.const_data_ptr<float>();
  return 1.0f - t[step + 1] / t[step];
}

int64_t timestep_count(float ratio, bool last, int64_t masks) {
  return last ? masks : static_cast<int64_t>(static_cast<float>(masks) * ratio);
}

at::Tensor multinomial(const at::Tensor& probs, int64_t samples, at::Generator& generator) {
  if (probs.is_cpu()) return at::multinomial(probs, samples, /*replacement=*/false, generator);
  return at::multinomial(probs.cpu(), samples, false, generator).to(probs.device());
}

Proposal propose(at::Tensor logits, Alg alg, double temperature, at::Generator& generator, std::optional<double> top_p,
                 std::optional<int64_t> top_k, int64_t limit) {
  const double lowest = std::numeric_limits<float>::lowest();  // float32 logits (torch.finfo.min)
  if (temperature > 0) logits = at::div(logits, temperature);
  if (top_p && *top_p < 1) {  // keep the smallest prefix of the sorted vocabulary reaching top_p
    auto [ordered, order] = at::sort(logits, -1, /*descending=*/true);
    at::Tensor drop = at::cumsum(at::softmax(ordered, -1), -1) > *top_p;
    const int64_t V = logits.size(-1);
    drop.narrow(-1, 1, V - 1).copy_(drop.narrow(-1, 0, V - 1).clone());
    drop.narrow(-1, 0, 1).fill_(false);
    drop = at::zeros_like(logits, at::kBool).scatter_(-1, order, drop);
    logits = logits.masked_fill(drop, lowest);
  }
  if (top_k) {
    const at::Tensor kth = std::get<0>(at::topk(logits, std::min(*top_k, logits.size(-1)))).narrow(-1, -1, 1);
    logits = logits.masked_fill(logits < kth, lowest);
  }
  const at::Tensor probs = at::softmax(logits, -1);
  at::Tensor pick = probs;
  const int64_t V = probs.size(-1);
  if (limit < V) {  // ids the tokenizer cannot produce never win (nor are drawn)
    pick = probs.clone();
    pick.narrow(-1, limit, V - limit).fill_(temperature > 0 ? 0.0 : -1.0);
  }
  Proposal p;
  if (temperature > 0) {
    p.x0 = multinomial(pick.reshape({-1, V}), 1, generator).reshape(probs.sizes().slice(0, 1));
    p.conf = at::gather(probs, -1, p.x0.unsqueeze(-1)).squeeze(-1);
  } else {
    std::tie(p.conf, p.x0) = at::max(pick, -1);
  }
  if (alg == Alg::kMargin) {
    const at::Tensor top2 = std::get<0>(at::topk(probs, 2, -1));
    p.conf = top2.select(-1, 0) - top2.select(-1, 1);
  } else if (alg == Alg::kEntropy) {
    p.conf = at::sum(probs * at::log(probs + kEntropyEps), -1);
  }
  return p;
}

std::vector<at::Tensor> to_host(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> wide;
  for (const at::Tensor& t : tensors)
    wide.push_back(t.to(at::isFloatingType(t.scalar_type()) ? at::kDouble : at::kLong));
  return read_back(wide);
}

}  // namespace blockbatch::host
