// The TorchBind face of a model: torch.classes.blockbatch.Model holds the plain C++ body
// (model/transformer.h) and hands it to the ops as the Network the decode loop sees.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <torch/custom_class.h>

#include <memory>
#include <string>

#include "model/network.h"

namespace blockbatch {

class ModelHandle : public torch::CustomClassHolder {
 public:
  // ints/floats: the config fields (python ModelConfig.int_fields / float_fields);
  // weights: the HF names of the family's row (model/families.h), all on one device; dtype: "float32",
  // "bfloat16", "float16" or "" to keep the weights' dtype.
  ModelHandle(const c10::Dict<std::string, int64_t>& ints, const c10::Dict<std::string, double>& floats,
              const c10::Dict<std::string, at::Tensor>& weights, const std::string& dtype);

  const Network& network() const { return *model_; }
  // So an op can pass the handle where a `const Network&` is taken (decode(*model, ...)).
  operator const Network&() const { return *model_; }

 private:
  std::shared_ptr<const Network> model_;
};

// The config from TorchBind's dicts (python ModelConfig.int_fields / float_fields), validated
// (ModelConfig::validate); throws c10::ValueError naming the key.
ModelConfig config_from_dicts(const c10::Dict<std::string, int64_t>& ints,
                              const c10::Dict<std::string, double>& floats);

}  // namespace blockbatch
