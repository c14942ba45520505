// The decode entry point: one request, the whole denoising loop in C++.
#pragma once

#include <cstdint>
#include <vector>

#include "decode/admit.h"
#include "decode/budget.h"
#include "decode/options.h"
#include "decode/stop.h"
#include "model/network.h"

namespace blockbatch {

struct DecodeResult {
  std::vector<int64_t> tokens;  // [prompt | generation]
  DecodeStats stats;
  // The `logprobs` option: host float64 [gen_length, 1 + 2 k] (decode/logprobs.h, LogprobRecord::rows);
  // undefined when off.
  at::Tensor logprobs;
};

// Validates the options and the prompt (ids in the vocabulary, no mask id), then runs the policy.
// cancel: a host int64 another thread may set to nonzero to stop the decode (checked once per
// forward; the decode then throws "decode cancelled ..."), or nullptr. progress: shown the
// canvases before every forward (decode/stop.h), or nullptr. reason: where the StopReason of an
// early stop is written before the decode throws, or nullptr. curve: a step-time curve for
// branch_budget = auto (the request's branches at load 1, decode/budget.h), or nullptr (all of them).
DecodeResult decode(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& options,
                    const int64_t* cancel = nullptr, const Progress* progress = nullptr, int64_t* reason = nullptr,
                    const StepCurve* curve = nullptr);

// check_prompt, decode_options_for and the whole admission of a request: decode/admit.h.

// Many requests at once: decode_batch and the step-wise Scheduler are in decode/batch/scheduler.h.

// The policies are step machines (decode/decoder.h), each request one; decode() drives one alone.

}  // namespace blockbatch
