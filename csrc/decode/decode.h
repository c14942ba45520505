// The decode entry point: one request, the whole denoising loop in C++.
#pragma once

#include <cstdint>
#include <vector>

#include "decode/options.h"
#include "decode/stop.h"
#include "model/network.h"

namespace blockbatch {

struct DecodeResult {
  std::vector<int64_t> tokens;  // [prompt | generation]
  DecodeStats stats;
};

// Validates the options and the prompt (ids in the vocabulary, no mask id), then runs the policy.
// cancel: a host int64 another thread may set to nonzero to stop the decode (checked once per
// forward; the decode then throws "decode cancelled ..."), or nullptr.
DecodeResult decode(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& options,
                    const int64_t* cancel = nullptr);

// Policies (called by decode after validation, with DecodeOptions::resolved options: every
// std::optional the table resolves is set). Both check `stop` before every forward, and
// every loop has a bound: a step that commits nothing fails (Stop::no_progress).
DecodeResult decode_single_branch(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o,
                                  const Stop& stop);
DecodeResult decode_blockbatch(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o,
                               const Stop& stop);

}  // namespace blockbatch
