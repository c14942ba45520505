// Dream-family decoding (docs/ALGORITHMS.md section 5): the pieces the Dream policies share.
//
// Dream reads canvas position p from the model output at p - 1 (the "shift"). The Dream policies
// keep the canvas on the host (it is uploaded with each forward's index buffer, a few KB) and run
// the forward and the proposal maths on the model's device with the same ATen calls, on tensors of
// the same shapes, as the float32 reference (python/blockbatch/reference/dream.py), so that on the
// CPU ties fall the same way. Each step reads back only what the host bookkeeping needs.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "decode/decode.h"
#include "decode/step.h"
#include "decode/step_runner.h"

namespace blockbatch::dream {

// Dream's proposal over the rows of `logits` ([n, V], float32): temperature scaling, top-p, top-k,
// softmax; token = the most probable (first on ties) or a draw from `generator` when
// temperature > 0, among the ids below `limit` (the softmax covers every id); confidence by `alg`
// (probability, top-1 minus top-2, or minus the entropy).
struct Proposal {
  at::Tensor conf;  // [n] float32
  at::Tensor x0;    // [n] int64
};
Proposal propose(at::Tensor logits, Alg alg, double temperature, at::Generator& generator,
                 std::optional<double> top_p, std::optional<int64_t> top_k, int64_t limit);

// Draws `samples` indices per row of `probs` ([rows, V]) without replacement, from `generator`
// (a CPU generator: rows on another device are drawn on the host and moved back).
at::Tensor multinomial(const at::Tensor& probs, int64_t samples, at::Generator& generator);

// One packed forward whose tokens are gathered from a host canvas (uploaded after the index
// buffer in the same host-to-device copy). The logits live on the device until the next run.
class Forwards {
 public:
  Forwards(const Network& model, bool use_graphs) : model_(model), runner_(model, use_graphs) {}
  // kind: a caller's tag that keeps steps of equal shapes but different meaning apart.
  at::Tensor run(const PackedQueries& q, KvMode mode, const at::Tensor& kv, const std::vector<int64_t>& canvas,
                 int64_t kind);
  const StepRunner& runner() const { return runner_; }

 private:
  const Network& model_;
  StepRunner runner_;
};

// Host copies of device tensors (any dtypes convertible to int64 / float64), in one copy.
std::vector<at::Tensor> to_host(const std::vector<at::Tensor>& tensors);

// Finishes the stats every policy fills the same way (nfe, wall time, graph counters).
void finish_stats(DecodeStats& st, const StepRunner& runner, double wall_ms);

}  // namespace blockbatch::dream

namespace blockbatch {

// The Dream policies (called by decode() with resolved options; decode.h has the LLaDA ones).
DecodeResult decode_dream_vanilla(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o,
                                  const Stop& stop);
DecodeResult decode_dream_cached(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o,
                                 const Stop& stop);
DecodeResult decode_dream_blockbatch(const Network& model, const std::vector<int64_t>& prompt,
                                     const DecodeOptions& o, const Stop& stop);

}  // namespace blockbatch
