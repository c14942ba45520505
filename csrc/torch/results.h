// What the decode ops hand back to Python, shared by decode, decode_batch and the Scheduler class.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

#include "decode/decode.h"

namespace blockbatch {

// A result as tensors: tokens [L] int64, the scalar counters (decode_stat_names) float64, the
// per-forward log [forwards, 2] (committed, query tokens) and per-branch stats [branches, 5]
// (block size, committed, merged, copied, forwards), and the logprobs [gen_length, 1 + 2 k] float64
// (DecodeResult::logprobs; [0, 0] when off).
std::vector<at::Tensor> result_tensors(const std::vector<int64_t>& tokens, const DecodeStats& stats,
                                       const at::Tensor& logprobs);

// A prompt tensor's ids (int64, 1-D; errors name `what`).
std::vector<int64_t> prompt_ids(const at::Tensor& prompt, const std::string& what);

}  // namespace blockbatch
