// The native LLaDA2 transformer (model_type "llada2_moe": LLaDA2.0 / 2.1, mini and flash): a Network
// whose layers carry a fused qkv projection, per-head RMSNorm of q and k, RoPE on the first
// rope_dim() dims of a head, and (from first_dense_layers on) a mixture of experts with a
// group-limited sigmoid router. python/blockbatch/reference/llada2.py is its readable twin.
//
// Block-causal attention needs no mask here: the block decoder (decode/policies/block.cpp) gives each
// block its own query row in dual mode, whose kv_lens ends at that block's end, so a position sees
// its block and the earlier ones (ALGORITHMS.md 11.1). The forward itself is the LLaDA one's.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "model/config.h"
#include "model/network.h"

namespace blockbatch {

struct SwiGLU {
  at::Tensor gate_up, down;  // [2 * width, d] (gate rows, then up), [d, width]
};

struct LLaDA2Layer {
  at::Tensor attn_norm, wqkv, bqkv, q_norm, k_norm, dense, dense_bias, ff_norm;
  SwiGLU mlp;                      // dense layers
  at::Tensor router, expert_bias;  // MoE layers: [E, d] (float32), [E] (float32)
  SwiGLU experts;                  // stacked: gate_up [E, 2m, d], down [E, d, m]
  SwiGLU shared;                   // undefined tensors without shared experts
};

class LLaDA2Model : public Network {
 public:
  LLaDA2Model(ModelConfig config, const std::unordered_map<std::string, at::Tensor>& weights, c10::ScalarType dtype);

  const ModelConfig& config() const override { return config_; }
  c10::ScalarType dtype() const override { return wte_.scalar_type(); }
  c10::Device device() const override { return wte_.device(); }
  at::Tensor forward(const ForwardBatch& batch) const override;
  void check(const ForwardBatch& batch) const override;
  at::Tensor new_kv(int64_t rows, int64_t length) const override;
  // The router's choices stay on the device only with moe_experts' fused CUDA kernels
  // (BLOCKBATCH_MOE_KERNEL=fused); the grouped path reads them on the host: no CUDA graph then.
  bool capturable() const override;

 private:
  at::Tensor moe(const LLaDA2Layer& w, const at::Tensor& x) const;
  // The RoPE table [n, rope_dim] (float32 cos | sin) with n >= positions, grown as forwards need it
  // (never sized by max_sequence_length up front).
  at::Tensor rope_table(int64_t positions) const;

  ModelConfig config_;
  at::Tensor wte_, norm_, lm_head_, inv_freq_;
  std::vector<LLaDA2Layer> layers_;
  struct Rope {
    std::mutex mutex;
    at::Tensor table;
  };
  std::shared_ptr<Rope> rope_ = std::make_shared<Rope>();
};

// Hugging Face names and shapes of a LLaDA2 checkpoint of `config` (mirrors families/llada2.py).
std::vector<std::pair<std::string, std::vector<int64_t>>> llada2_weight_shapes(const ModelConfig& config);

}  // namespace blockbatch
