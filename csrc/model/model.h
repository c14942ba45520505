// The native LLaDA / Dream transformer (the same body; Dream adds q/k/v biases): owns its
// weights, runs packed variable-length forwards over per-row KV buffers: the one native
// implementation of Network (model/network.h) for every family;
// python/blockbatch/reference/model.py is its readable twin.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/config.h"
#include "model/network.h"

namespace blockbatch {

struct LayerWeights {
  at::Tensor attn_norm, wqkv, attn_out, ff_norm, w_gate_up, ff_out;
  at::Tensor bqkv;  // [q | k | v] biases (Dream), undefined without attention biases
};

class Model : public Network {
 public:
  // weights: HF names (LLaDA model.transformer.*, Dream model.layers.* / lm_head), all on one
  // device, converted to dtype (float32, bfloat16 or float16). Validates the config and checks
  // every tensor's name and shape.
  Model(ModelConfig config, const std::unordered_map<std::string, at::Tensor>& weights, c10::ScalarType dtype);

  const ModelConfig& config() const override { return config_; }
  c10::ScalarType dtype() const override { return wte_.scalar_type(); }
  c10::Device device() const override { return wte_.device(); }

  at::Tensor forward(const ForwardBatch& batch) const override;
  void check(const ForwardBatch& batch) const override;
  at::Tensor new_kv(int64_t rows, int64_t length) const override;

 private:
  void build(const std::unordered_map<std::string, at::Tensor>& weights, c10::ScalarType dtype);
  // The RoPE table [n, head_dim] (cos | sin per position, float32) with n >= positions: sized by
  // what forwards need (grown, never shrunk), not by max_sequence_length (Dream: 131072).
  at::Tensor rope_table(int64_t positions) const;

  // The RoPE table and the ones it replaced: a table outgrown while another thread's forward or a
  // recorded CUDA graph still reads it stays alive with the model.
  struct Rope {
    std::mutex mutex;
    at::Tensor table, inv_freq;
    std::vector<at::Tensor> retired;
  };

  ModelConfig config_;
  at::Tensor wte_, ln_f_, lm_head_;
  std::shared_ptr<Rope> rope_ = std::make_shared<Rope>();
  std::vector<LayerWeights> layers_;
};

// Expected HF tensor names and shapes for a config (mirrors loading.expected_weight_shapes).
std::vector<std::pair<std::string, std::vector<int64_t>>> expected_weight_shapes(const ModelConfig& config);

}  // namespace blockbatch
