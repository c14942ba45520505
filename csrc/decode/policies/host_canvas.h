// The host-canvas readout (FamilyRules::readout == Readout::kHostTopk; docs/ALGORITHMS.md 5.2-5.5):
// what the policies share when a family ranks by at::topk's own order for equal values (Dream).
//
// The canvas stays on the host (uploaded with each forward's index buffer, a few KB); the forward
// and the proposal maths run on the model's device with the same ATen calls, on tensors of the
// same shapes, as the float32 reference (python/blockbatch/reference/dream.py), so that on the CPU
// ties fall the same way. Each step reads back only what the host bookkeeping needs.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "decode/decoder.h"

namespace blockbatch::host {

// The proposal of the host-canvas families (Dream's sample_tokens) over the rows of `logits`
// ([n, V], float32): temperature scaling, top-p, top-k, softmax; token = the most probable (first
// on ties) or a draw from `generator` when temperature > 0, among the ids below `limit` (the
// softmax covers every id); confidence by `alg` (probability, top-1 minus top-2, or minus the
// entropy).
struct Proposal {
  at::Tensor conf;  // [n] float32
  at::Tensor x0;    // [n] int64
};
Proposal propose(at::Tensor logits, Alg alg, double temperature, at::Generator& generator, std::optional<double> top_p,
                 std::optional<int64_t> top_k, int64_t limit);

// Dream's timestep schedule (ALGORITHMS.md 5.3), as the authors' float32 tensors: t = linspace(1, eps,
// steps + 1); step i commits int(masks * (1 - t[i+1] / t[i])) masks (the product in float32,
// truncated), every mask at the last step.
at::Tensor timesteps(double eps, int64_t steps);
float timestep_ratio(const at::Tensor& timesteps, int64_t step);  // 1 - t[i+1] / t[i]
int64_t timestep_count(float ratio, bool last, int64_t masks);

// Draws `samples` indices per row of `probs` ([rows, V]) without replacement, from `generator`
// (a CPU generator: rows on another device are drawn on the host and moved back).
at::Tensor multinomial(const at::Tensor& probs, int64_t samples, at::Generator& generator);

// Host copies of device tensors (any dtypes convertible to int64 / float64), in one copy.
std::vector<at::Tensor> to_host(const std::vector<at::Tensor>& tensors);

}  // namespace blockbatch::host
