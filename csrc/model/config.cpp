#include "model/config.h"

#include <c10/util/Exception.h>

#include <cmath>

namespace blockbatch {

const char* family_name(Family family) {
  switch (family) {
    case Family::kLLaDA: return "llada";
    case Family::kDream: return "dream";
  }
  return "";
}

void ModelConfig::validate() const {
  TORCH_CHECK_VALUE(family == Family::kLLaDA || family == Family::kDream,
                    "config: key 'family' = ", static_cast<int64_t>(family),
                    " is not a model family (0: llada, 1: dream)");
  TORCH_CHECK_VALUE(attention_bias == (family == Family::kDream), "config: key 'attention_bias' = ", attention_bias,
                    ": ", family_name(family), attention_bias ? " has no q/k/v biases" : " always has q/k/v biases");
  auto bounded = [](const char* key, int64_t v, int64_t limit) {
    TORCH_CHECK_VALUE(v > 0, "config: key '", key, "' must be a positive integer, got ", v);
    TORCH_CHECK_VALUE(v <= limit, "config: key '", key, "' = ", v, " is larger than the supported maximum ", limit);
  };
  bounded("d_model", d_model, kMaxDim);
  bounded("n_layers", n_layers, kMaxLayers);
  bounded("n_heads", n_heads, kMaxDim);
  bounded("n_kv_heads", n_kv_heads, kMaxDim);
  bounded("mlp_hidden_size", mlp_hidden_size, kMaxDim);
  bounded("vocab_size", vocab_size, kMaxDim);
  bounded("embedding_size", embedding_size, kMaxDim);
  bounded("max_sequence_length", max_sequence_length, kMaxSequenceLength);
  TORCH_CHECK_VALUE(d_model % n_heads == 0, "config: key 'n_heads' = ", n_heads, " must divide d_model = ", d_model);
  TORCH_CHECK_VALUE(n_heads % n_kv_heads == 0, "config: key 'n_kv_heads' = ", n_kv_heads,
                    " must divide n_heads = ", n_heads);
  TORCH_CHECK_VALUE(head_dim() % 2 == 0, "config: key 'n_heads' gives an odd head_dim ", head_dim(),
                    "; RoPE needs an even head_dim");
  TORCH_CHECK_VALUE(max_sequence_length * head_dim() <= kMaxRopeElements,
                    "config: key 'max_sequence_length' = ", max_sequence_length, " times head_dim = ", head_dim(),
                    " is more than the ", kMaxRopeElements, " entries the RoPE table may hold");
  TORCH_CHECK_VALUE(embedding_size >= vocab_size, "config: key 'embedding_size' = ", embedding_size,
                    " is smaller than vocab_size = ", vocab_size);
  TORCH_CHECK_VALUE(std::isfinite(rope_theta) && rope_theta > 0,
                    "config: key 'rope_theta' must be a positive finite number, got ", rope_theta);
  TORCH_CHECK_VALUE(std::isfinite(rms_norm_eps) && rms_norm_eps > 0,
                    "config: key 'rms_norm_eps' must be a positive finite number, got ", rms_norm_eps);
  TORCH_CHECK_VALUE(mask_token_id >= 0 && mask_token_id < vocab_size, "config: key 'mask_token_id' = ", mask_token_id,
                    " is outside the vocabulary [0, ", vocab_size, ")");
  TORCH_CHECK_VALUE(eos_token_id >= 0 && eos_token_id < vocab_size, "config: key 'eos_token_id' = ", eos_token_id,
                    " is outside the vocabulary [0, ", vocab_size, ")");
  TORCH_CHECK_VALUE(proposal_vocab == 0 || (proposal_vocab > eos_token_id && proposal_vocab <= vocab_size),
                    "config: key 'proposal_vocab' = ", proposal_vocab,
                    " must be 0 (every id) or in (eos_token_id = ", eos_token_id, ", vocab_size = ", vocab_size,
                    "]: EOS must stay proposable");
  TORCH_CHECK_VALUE(mask_token_id != eos_token_id, "config: key 'eos_token_id' = ", eos_token_id,
                    " equals mask_token_id");
}

}  // namespace blockbatch
