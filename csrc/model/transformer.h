// The one native transformer body: a Network (model/network.h) assembled from parts by a family's row
// (model/families.h) and the checkpoint's weights. Every family is this body: LLaDA (split q/k/v, SwiGLU),
// Dream (+ q/k/v biases), LLaDA2 (fused qkv, QK-norm, partial rotary, attention output bias, MoE layers).
// python/blockbatch/reference/{model,llada2}.py are its readable twins.
//
//   embedding -> per layer: RMSNorm, attention part, residual; RMSNorm, MLP part, residual -> RMSNorm, head
//
// The attention part: q/k/v projection (fused or split in the checkpoint, one GEMM here), optional
// biases, optional per-head QK-norm, RoPE on the first rope_dim() dims of a head, grouped-query
// attention through attend() (model/attention.h), output projection with an optional bias. The MLP
// part: a dense SiLU-gated SwiGLU, or (layers from first_dense_layers on) a mixture of experts with a
// group-limited sigmoid router, an expert bias and optional shared experts.
//
// Block-causal families need no mask here: the block decoder gives each block its own query row in
// dual mode, whose kv_lens ends at that block's end (ALGORITHMS.md 11.1).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/attention.h"
#include "model/config.h"
#include "model/families.h"
#include "model/network.h"

namespace blockbatch {

struct SwiGLU {
  at::Tensor gate_up, down;  // [2 * width, d] (gate rows, then up), [d, width]; stacked experts: [E, 2m, d], [E, d, m]
};

struct AttentionPart {
  at::Tensor wqkv;            // [(H + 2 Hkv) * hd, d]: [q | k | v] rows, fused or concatenated at load
  at::Tensor bqkv;            // [q | k | v] biases, undefined without
  at::Tensor q_norm, k_norm;  // [hd] per-head RMSNorm weights, undefined without QK-norm
  at::Tensor out, out_bias;   // [d, H * hd], [d] (undefined without)
};

struct MlpPart {
  SwiGLU dense;                    // dense layers
  at::Tensor router, expert_bias;  // MoE layers: [E, d], [E] (float32 whatever the dtype)
  SwiGLU experts;                  // stacked, as ops::moe_experts takes them
  SwiGLU shared;                   // undefined tensors without shared experts
};

struct Layer {
  at::Tensor attn_norm, ff_norm;
  AttentionPart attention;
  MlpPart mlp;
};

class Transformer : public Network {
 public:
  // weights: the HF names of the family's row, all on one device, converted to dtype (float32,
  // bfloat16 or float16). Validates the config and checks every tensor's name and shape.
  Transformer(ModelConfig config, const std::unordered_map<std::string, at::Tensor>& weights, c10::ScalarType dtype);

  const ModelConfig& config() const override { return config_; }
  c10::ScalarType dtype() const override { return wte_.scalar_type(); }
  c10::Device device() const override { return wte_.device(); }
  at::Tensor forward(const ForwardBatch& batch) const override;
  void check(const ForwardBatch& batch) const override;
  at::Tensor new_kv(int64_t rows, int64_t length) const override;
  at::Tensor head(const at::Tensor& hidden) const override;
  // The router's choices stay on the device only with moe_experts' fused CUDA kernels
  // (BLOCKBATCH_MOE_KERNEL=fused); the grouped path reads them on the host: no CUDA graph then.
  bool capturable() const override;

 private:
  at::Tensor attention(const AttentionPart& w, const at::Tensor& h, const AttnMeta& meta, const at::Tensor& positions,
                       const at::Tensor& rope_table, int64_t layer) const;
  at::Tensor mlp(const MlpPart& w, const at::Tensor& h, int64_t layer) const;
  at::Tensor moe(const MlpPart& w, const at::Tensor& x) const;
  // The RoPE table [n, rope_dim] (float32 cos | sin, angles as the row's RopeAngles says) with
  // n >= positions: sized by what forwards need (grown, never shrunk), not by max_sequence_length.
  at::Tensor rope_table(int64_t positions) const;

  // The RoPE table and the ones it replaced: a table outgrown while another thread's forward or a
  // recorded CUDA graph still reads it stays alive with the model.
  struct Rope {
    std::mutex mutex;
    at::Tensor table, inv_freq;
    std::vector<at::Tensor> retired;
  };

  ModelConfig config_;
  const FamilySpec* spec_;
  at::Tensor wte_, norm_, lm_head_;
  std::vector<Layer> layers_;
  std::shared_ptr<Rope> rope_ = std::make_shared<Rope>();
};

}  // namespace blockbatch
