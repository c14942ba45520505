// The decode entry point: one request, the whole denoising loop in C++.
#pragma once

#include <cstdint>
#include <vector>

#include "decode/options.h"
#include "model/model.h"

namespace blockbatch {

struct DecodeResult {
  std::vector<int64_t> tokens;  // [prompt | generation]
  DecodeStats stats;
};

// Validates the options and the prompt (ids in the vocabulary, no mask id), then runs the policy.
DecodeResult decode(const Model& model, const std::vector<int64_t>& prompt, const DecodeOptions& options);

// Policies (called by decode after validation).
DecodeResult decode_single_branch(const Model& model, const std::vector<int64_t>& prompt, const DecodeOptions& o);
DecodeResult decode_blockbatch(const Model& model, const std::vector<int64_t>& prompt, const DecodeOptions& o);

}  // namespace blockbatch
