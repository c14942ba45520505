// Runs the packed forwards of one decode request and reads back what the host needs.
//
// Every step is: one host-to-device copy of the packed index buffer, the forward, a readout
// (confidence, sparse probabilities, ...), and ONE device-to-host copy of the readout.
// On CUDA with graphs enabled, a step whose shape was seen before is replayed from a CUDA graph:
// the caller's shape key (mode, query tokens, rows, logit rows, step kind); in BlockBatch it changes only
// when the set of active branches (or the refresh set) changes, so a new set is captured on its
// second step and replayed from then on. The first step of a shape runs eagerly (it warms up
// cuBLAS and the kernels' attributes before any capture). Replays read the index buffer the
// host just copied into the graph's static input, so they compute exactly what eager runs do.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "decode/step.h"
#include "model/network.h"

namespace blockbatch {

class StepRunner {
 public:
  // A whole step on the device from its index buffer (already on the device): the logits and the
  // tensors to read back (8-byte elements). It may update device state (the canvas, the KV rows):
  // a replay does exactly what the recorded call did, with the new buffer contents.
  struct Body {
    at::Tensor logits;
    std::vector<at::Tensor> readout;
  };
  using Step = std::function<Body(const at::Tensor& buffer)>;
  using Key = StepKey;  // the step's shape: equal keys must mean equal launch shapes

  // use_graphs: capture / replay CUDA graphs (ignored on CPU and in builds without CUDA).
  StepRunner(const Network& model, bool use_graphs);
  ~StepRunner();
  StepRunner(const StepRunner&) = delete;
  StepRunner& operator=(const StepRunner&) = delete;

  struct Output {
    at::Tensor logits;             // on the device; valid until the next run
    std::vector<at::Tensor> host;  // host copies of the readout
  };
  // One step: copy `buffer` to the device, run `step` (or replay its graph), read back.
  Output run(const std::vector<int64_t>& buffer, const Key& key, const Step& step);
  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }

 private:
  struct Graphs;  // CUDA state (defined in step_runner.cpp when built with CUDA)
  const Network& model_;
  std::unique_ptr<Graphs> graphs_;
  int64_t captures_ = 0, replays_ = 0;
};

}  // namespace blockbatch
