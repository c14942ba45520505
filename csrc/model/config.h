// Model configuration (LLaDA family), mirrored from python/blockbatch/config.py.
#pragma once

#include <cstdint>
#include <string>

namespace blockbatch {

struct ModelConfig {
  int64_t d_model = 0;
  int64_t n_layers = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t mlp_hidden_size = 0;
  int64_t vocab_size = 0;
  int64_t embedding_size = 0;
  int64_t mask_token_id = -1;
  int64_t eos_token_id = -1;
  int64_t max_sequence_length = 0;
  bool weight_tying = false;
  double rope_theta = 0;
  double rms_norm_eps = 0;

  int64_t head_dim() const { return d_model / n_heads; }
  // Throws c10::Error naming the offending key when the config is inconsistent.
  void validate() const;
};

}  // namespace blockbatch
