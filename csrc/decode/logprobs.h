// Per-position log-probabilities at commit time (the `logprobs` option, docs/ALGORITHMS.md
// "Logprobs"): a policy hands each step's commit to record() with the logits rows the commit read,
// and the table keeps, for every canvas position, the values of the last step that wrote it.
//
// What is recorded is the raw model distribution: float32 log_softmax of the logits row (before
// temperature, top_p, top_k or the proposal limit), the committed token's entry and the `top`
// largest entries (ids and values, at::topk's order). Everything stays on the model's device until
// finish (one [L, 1 + 2 top] table; the vocabulary never leaves it), and record() bakes no host
// value into the device work, so a step captured in a CUDA graph replays it correctly.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include <c10/core/Device.h>

namespace blockbatch {

class LogprobRecord {
 public:
  LogprobRecord() = default;  // off: record() does nothing
  // top: the option's value (nullopt: off); length: the canvas' positions.
  LogprobRecord(std::optional<int64_t> top, int64_t length, c10::Device device);
  bool on() const { return table_.defined(); }

  // One step's commits: `positions` [n] (int64, on the rows' device) are canvas positions, `rows`
  // [n, vocab] the logits rows the commit read for them, `before` / `after` [n] the tokens they held
  // before and after the step. Positions whose token changed take this step's values.
  void record(const at::Tensor& positions, const at::Tensor& rows, const at::Tensor& before, const at::Tensor& after);
  // The same from host vectors (a host canvas): positions, and the tokens before / after.
  void record(const std::vector<int64_t>& positions, const at::Tensor& rows, const std::vector<int64_t>& before,
              const std::vector<int64_t>& after);
  // What `canvas` holds at `positions` (empty when off): a host canvas' tokens before and after a step.
  std::vector<int64_t> held(const std::vector<int64_t>& canvas, const std::vector<int64_t>& positions) const;
  // Positions [from, from + count) lose their values: the decoder rewrote them without reading them
  // (an early stop's fill), so no step committed what they now hold.
  void forget(int64_t from, int64_t count);

  // Host float64 [count, 1 + 2 top] for positions [from, from + count): the token's log-prob, then
  // `top` ids, then their log-probs; NaN where no step committed the position (a filled EOS).
  // Undefined when off.
  at::Tensor rows(int64_t from, int64_t count) const;

 private:
  int64_t top_ = 0;
  at::Tensor table_;  // [L, 1 + 2 top] float64 on the device
};

}  // namespace blockbatch
