// torch.classes.blockbatch.Options: one request's decode options, built and checked once
// (torch.ops.blockbatch.options, from Python's DecodeOptions) and taken as they are by every entry
// point (decode.typed, decode_batch, Scheduler.add, kv_request_rows): no option crosses the seam
// as text, and none is parsed or checked twice.
#pragma once

#include <torch/custom_class.h>

#include <utility>

#include "decode/options.h"

namespace blockbatch {

struct OptionsHandle : torch::CustomClassHolder {
  explicit OptionsHandle(DecodeOptions o) : options(std::move(o)) {}
  const DecodeOptions options;
};

using OptionsPtr = c10::intrusive_ptr<OptionsHandle>;

}  // namespace blockbatch
