#include "model/config.h"

#include <c10/util/Exception.h>

namespace blockbatch {

void ModelConfig::validate() const {
  auto positive = [](const char* key, int64_t v) {
    TORCH_CHECK(v > 0, "config: key '", key, "' must be a positive integer, got ", v);
  };
  positive("d_model", d_model);
  positive("n_layers", n_layers);
  positive("n_heads", n_heads);
  positive("n_kv_heads", n_kv_heads);
  positive("mlp_hidden_size", mlp_hidden_size);
  positive("vocab_size", vocab_size);
  positive("embedding_size", embedding_size);
  positive("max_sequence_length", max_sequence_length);
  TORCH_CHECK(d_model % n_heads == 0, "config: key 'n_heads' = ", n_heads, " must divide d_model = ", d_model);
  TORCH_CHECK(n_heads % n_kv_heads == 0, "config: key 'n_kv_heads' = ", n_kv_heads,
              " must divide n_heads = ", n_heads);
  TORCH_CHECK(head_dim() % 2 == 0, "config: head_dim = ", head_dim(), " must be even for RoPE");
  TORCH_CHECK(embedding_size >= vocab_size, "config: key 'embedding_size' = ", embedding_size,
              " is smaller than vocab_size = ", vocab_size);
  TORCH_CHECK(rope_theta > 0, "config: key 'rope_theta' must be positive, got ", rope_theta);
  TORCH_CHECK(rms_norm_eps > 0, "config: key 'rms_norm_eps' must be positive, got ", rms_norm_eps);
  TORCH_CHECK(mask_token_id >= 0 && mask_token_id < vocab_size, "config: key 'mask_token_id' = ", mask_token_id,
              " is outside the vocabulary [0, ", vocab_size, ")");
  TORCH_CHECK(eos_token_id >= 0 && eos_token_id < vocab_size, "config: key 'eos_token_id' = ", eos_token_id,
              " is outside the vocabulary [0, ", vocab_size, ")");
}

}  // namespace blockbatch
