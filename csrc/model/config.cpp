#include "model/config.h"

#include <c10/util/Exception.h>

#include <cmath>

namespace blockbatch {

const char* family_name(Family family) {
  switch (family) {
    case Family::kLLaDA: return "llada";
    case Family::kDream: return "dream";
    case Family::kLLaDA2: return "llada2";
  }
  return "";
}

int64_t ModelConfig::tensor_count() const {
  const int64_t model_wide = 2 + (weight_tying ? 0 : 1);  // embeddings, final norm, LM head
  if (family != Family::kLLaDA2) return (attention_bias ? 12 : 9) * n_layers + model_wide;
  // norms, fused qkv (+ bias), q/k norms, dense (+ bias); a SwiGLU, or router + expert bias + experts (+ shared)
  const int64_t attention = 4 + (attention_bias ? 1 : 0) + (qk_norm ? 2 : 0) + (attn_out_bias ? 1 : 0);
  int64_t count = model_wide;
  for (int64_t l = 0; l < n_layers; ++l) {
    count += attention + (moe_layer(l) ? 2 + 3 * num_experts + (shared_experts > 0 ? 3 : 0) : 3);
  }
  return count;
}

namespace {
// LLaDA2's own keys: head size, partial rotary and the mixture of experts (names as config.json has them).
void validate_llada2(const ModelConfig& c) {
  TORCH_CHECK_VALUE(c.head_size >= 0 && c.head_size <= kMaxDim, "config: key 'head_dim' = ", c.head_size,
                    " must be in [1, ", kMaxDim, "]");
  TORCH_CHECK_VALUE(c.rope_dims >= 0 && c.rope_dims <= c.head_dim() && c.rope_dim() % 2 == 0,
                    "config: key 'partial_rotary_factor' gives ", c.rope_dim(),
                    " rotary dims of head_dim = ", c.head_dim(), "; they must be even and in [2, head_dim]");
  TORCH_CHECK_VALUE(c.first_dense_layers >= 0 && c.first_dense_layers <= kMaxLayers,
                    "config: key 'first_k_dense_replace' = ", c.first_dense_layers, " must be in [0, ", kMaxLayers,
                    "]");
  if (c.num_experts == 0) return;
  TORCH_CHECK_VALUE(c.num_experts > 0 && c.num_experts <= (1 << 16), "config: key 'num_experts' = ", c.num_experts,
                    " must be in [1, 65536] (or null: every layer dense)");
  TORCH_CHECK_VALUE(c.expert_groups > 0 && c.num_experts % c.expert_groups == 0 && c.num_experts / c.expert_groups >= 2,
                    "config: key 'n_group' = ", c.expert_groups, " must divide num_experts = ", c.num_experts,
                    " into groups of at least 2 (a group is ranked by its two best scores)");
  TORCH_CHECK_VALUE(c.expert_groups_kept >= 1 && c.expert_groups_kept <= c.expert_groups,
                    "config: key 'topk_group' = ", c.expert_groups_kept, " must be in [1, n_group = ", c.expert_groups,
                    "]");
  const int64_t choosable = c.expert_groups_kept * (c.num_experts / c.expert_groups);
  TORCH_CHECK_VALUE(c.experts_per_token >= 1 && c.experts_per_token <= choosable,
                    "config: key 'num_experts_per_tok' = ", c.experts_per_token, " must be in [1, ", choosable,
                    "] (the experts of the topk_group kept groups)");
  TORCH_CHECK_VALUE(c.moe_hidden_size > 0 && c.moe_hidden_size <= kMaxDim,
                    "config: key 'moe_intermediate_size' = ", c.moe_hidden_size, " must be in [1, ", kMaxDim, "]");
  TORCH_CHECK_VALUE(c.shared_experts >= 0 && c.shared_experts * c.moe_hidden_size <= kMaxDim,
                    "config: key 'num_shared_experts' = ", c.shared_experts, " must be >= 0 and its width at most ",
                    kMaxDim);
  TORCH_CHECK_VALUE(std::isfinite(c.routed_scaling) && c.routed_scaling > 0,
                    "config: key 'routed_scaling_factor' must be a positive finite number, got ", c.routed_scaling);
}
}  // namespace

void ModelConfig::validate() const {
  TORCH_CHECK_VALUE(family == Family::kLLaDA || family == Family::kDream || family == Family::kLLaDA2,
                    "config: key 'family' = ", static_cast<int64_t>(family),
                    " is not a model family (0: llada, 1: dream, 2: llada2)");
  if (family == Family::kLLaDA2) {
    validate_llada2(*this);
  } else {
    TORCH_CHECK_VALUE(attention_bias == (family == Family::kDream), "config: key 'attention_bias' = ", attention_bias,
                      ": ", family_name(family), attention_bias ? " has no q/k/v biases" : " always has q/k/v biases");
    // LLaDA2's keys, each by name: the other families have none of them.
    for (const auto& [key, unset] : {std::pair{"head_size", head_size == 0}, std::pair{"rope_dims", rope_dims == 0},
                                     std::pair{"qk_norm", !qk_norm}, std::pair{"attn_out_bias", !attn_out_bias},
                                     std::pair{"num_experts", num_experts == 0}}) {
      TORCH_CHECK_VALUE(unset, "config: key '", key, "' is a LLaDA2 key; ", family_name(family),
                        " models have no explicit head size, partial rotary, QK-norm, output bias or experts");
    }
  }
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
  TORCH_CHECK_VALUE(head_size > 0 || d_model % n_heads == 0, "config: key 'n_heads' = ", n_heads,
                    " must divide d_model = ", d_model);
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
