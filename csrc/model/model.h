// The native LLaDA transformer: owns its weights, runs packed variable-length forwards over
// per-row KV buffers (python/blockbatch/reference/model.py is its readable twin).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <torch/custom_class.h>

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "model/config.h"

namespace blockbatch {

// How the queries of a forward use the KV buffer (ALGORITHMS.md section 3).
enum class KvMode {
  kFull,    // queries attend to themselves; their K/V are written when a buffer is given
  kDual,    // queries' K/V overwrite their slots, then attention over all L keys of the row
  kPrefix,  // attention over the row's cached [0, s) plus the queries; nothing written
};
KvMode parse_kv_mode(const std::string& mode);

// One packed forward: R rows, T tokens in total, row r = tokens [cu_seqlens[r], cu_seqlens[r+1]).
struct ForwardBatch {
  at::Tensor tokens;       // [T] int64
  at::Tensor positions;    // [T] int64, absolute canvas positions
  at::Tensor cu_seqlens;   // [R + 1] int64
  at::Tensor kv;           // [rows, layers, 2, kv_heads, L, head_dim] or undefined (full mode only)
  at::Tensor kv_rows;      // [R] int64: KV row of each query row (default: r)
  at::Tensor prefix_lens;  // [R] int64, prefix mode: cached slots [0, s) attended
  at::Tensor logit_index;  // [n] int64 into [0, T): rows of the logits returned (default: all)
  KvMode mode = KvMode::kFull;
};

struct LayerWeights {
  at::Tensor attn_norm, wqkv, attn_out, ff_norm, w_gate_up, ff_out;
};

class Model : public torch::CustomClassHolder {
 public:
  // ints/floats: the config fields (python ModelConfig.int_fields / float_fields);
  // weights: HF names (model.transformer.*), all on one device; dtype: "float32",
  // "bfloat16", "float16" or "" to keep the weights' dtype.
  Model(const c10::Dict<std::string, int64_t>& ints, const c10::Dict<std::string, double>& floats,
        const c10::Dict<std::string, at::Tensor>& weights, const std::string& dtype);
  Model(ModelConfig config, const std::unordered_map<std::string, at::Tensor>& weights, c10::ScalarType dtype);

  const ModelConfig& config() const { return config_; }
  c10::ScalarType dtype() const { return wte_.scalar_type(); }
  c10::Device device() const { return wte_.device(); }

  // Logits [n, vocab_size] in the model dtype (n = logit_index size, or T).
  at::Tensor forward(const ForwardBatch& batch) const;
  // Validates a batch (shapes, dtypes, devices, ranges); throws naming the argument.
  void check(const ForwardBatch& batch) const;
  // A zeroed KV buffer [rows, layers, 2, kv_heads, length, head_dim] in the model dtype/device.
  at::Tensor new_kv(int64_t rows, int64_t length) const;

 private:
  void build(const std::unordered_map<std::string, at::Tensor>& weights, c10::ScalarType dtype);

  ModelConfig config_;
  at::Tensor wte_, ln_f_, lm_head_, rope_table_;
  std::vector<LayerWeights> layers_;
};

// Expected HF tensor names and shapes for a config (mirrors loading.expected_weight_shapes).
std::vector<std::pair<std::string, std::vector<int64_t>>> expected_weight_shapes(const ModelConfig& config);
ModelConfig config_from_dicts(const c10::Dict<std::string, int64_t>& ints, const c10::Dict<std::string, double>& floats);

}  // namespace blockbatch
