#include "model/config.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <cstring>
#include <utility>

namespace blockbatch {

const char* family_name(Family family) {
  switch (family) {
    case Family::kLLaDA: return "llada";
    case Family::kDream: return "dream";
    case Family::kLLaDA2: return "llada2";
  }
  return "";
}

namespace {
// Dream and LLaDA2 write Qwen2's key names; LLaDA2 adds its own (python/blockbatch/families/*.py read_config).
constexpr std::pair<const char*, const char*> kQwen2Keys[] = {
    {"d_model", "hidden_size"},
    {"n_layers", "num_hidden_layers"},
    {"n_heads", "num_attention_heads"},
    {"n_kv_heads", "num_key_value_heads"},
    {"mlp_hidden_size", "intermediate_size"},
    {"embedding_size", "vocab_size"},
    {"max_sequence_length", "max_position_embeddings"},
    {"weight_tying", "tie_word_embeddings"},
};
constexpr std::pair<const char*, const char*> kLLaDA2Keys[] = {
    {"head_size", "head_dim"},
    {"rope_dims", "partial_rotary_factor"},
    {"attention_bias", "use_qkv_bias"},
    {"qk_norm", "use_qk_norm"},
    {"attn_out_bias", "use_bias"},
    {"experts_per_token", "num_experts_per_tok"},
    {"expert_groups", "n_group"},
    {"expert_groups_kept", "topk_group"},
    {"moe_hidden_size", "moe_intermediate_size"},
    {"shared_experts", "num_shared_experts"},
    {"first_dense_layers", "first_k_dense_replace"},
    {"routed_scaling", "routed_scaling_factor"},
};
}  // namespace

const char* config_key(Family family, const char* field) {
  if (family == Family::kLLaDA) return field;
  for (const auto& [name, key] : kQwen2Keys) {
    if (std::strcmp(field, name) == 0) return key;
  }
  if (family == Family::kLLaDA2) {
    for (const auto& [name, key] : kLLaDA2Keys) {
      if (std::strcmp(field, name) == 0) return key;
    }
  }
  return field;
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
// The reference's rules (python/blockbatch/reference/llada2.py cfg_ok): rope_dim = int(head_dim *
// partial_rotary_factor) must be even and in (0, head_dim]; 0 is a value here, never "unset".
void validate_llada2(const ModelConfig& c) {
  TORCH_CHECK_VALUE(c.head_size >= 1 && c.head_size <= kMaxDim, "config: key 'head_dim' = ", c.head_size,
                    " must be in [1, ", kMaxDim, "]");
  TORCH_CHECK_VALUE(c.rope_dims > 0 && c.rope_dims <= c.head_size && c.rope_dims % 2 == 0,
                    "config: key 'partial_rotary_factor' gives head_dim * partial_rotary_factor = ", c.rope_dims,
                    " rotary dims (head_dim = ", c.head_size, "); they must be even and in (0, head_dim]");
  TORCH_CHECK_VALUE(c.first_dense_layers >= 0 && c.first_dense_layers <= kMaxLayers,
                    "config: key 'first_k_dense_replace' = ", c.first_dense_layers, " must be in [0, ", kMaxLayers,
                    "]");
  if (c.num_experts == 0) return;  // every layer dense (config.json's num_experts: null)
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
  // shared_experts bounded first: the product below must not overflow.
  TORCH_CHECK_VALUE(
      c.shared_experts >= 0 && c.shared_experts <= kMaxDim && c.shared_experts * c.moe_hidden_size <= kMaxDim,
      "config: key 'num_shared_experts' = ", c.shared_experts, " must be >= 0 and its width at most ", kMaxDim);
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
  auto key = [&](const char* field) { return config_key(family, field); };
  auto bounded = [&](const char* field, int64_t v, int64_t limit) {
    const char* name = config_key(family, field);
    TORCH_CHECK_VALUE(v > 0, "config: key '", name, "' must be a positive integer, got ", v);
    TORCH_CHECK_VALUE(v <= limit, "config: key '", name, "' = ", v, " is larger than the supported maximum ", limit);
  };
  bounded("d_model", d_model, kMaxDim);
  bounded("n_layers", n_layers, kMaxLayers);
  bounded("n_heads", n_heads, kMaxDim);
  bounded("n_kv_heads", n_kv_heads, kMaxDim);
  bounded("mlp_hidden_size", mlp_hidden_size, kMaxDim);
  bounded("vocab_size", vocab_size, kMaxDim);
  bounded("embedding_size", embedding_size, kMaxDim);
  bounded("max_sequence_length", max_sequence_length, kMaxSequenceLength);
  TORCH_CHECK_VALUE(head_size > 0 || d_model % n_heads == 0, "config: key '", key("n_heads"), "' = ", n_heads,
                    " must divide ", key("d_model"), " = ", d_model);
  TORCH_CHECK_VALUE(n_heads % n_kv_heads == 0, "config: key '", key("n_kv_heads"), "' = ", n_kv_heads, " must divide ",
                    key("n_heads"), " = ", n_heads);
  // The reference allows an odd LLaDA2 head_dim (only its rope_dims must be even); the engine's
  // kernels do not, so it is refused here by the key the user wrote.
  if (family == Family::kLLaDA2) {
    TORCH_CHECK_VALUE(head_size % 2 == 0, "config: key 'head_dim' = ", head_size,
                      " is odd; the engine's attention kernels need an even head_dim");
  } else {
    TORCH_CHECK_VALUE(head_dim() % 2 == 0, "config: key '", key("n_heads"), "' gives an odd head_dim ", head_dim(),
                      " (", key("d_model"), " / ", key("n_heads"), "); RoPE needs an even head_dim");
  }
  TORCH_CHECK_VALUE(max_sequence_length * head_dim() <= kMaxRopeElements, "config: key '", key("max_sequence_length"),
                    "' = ", max_sequence_length, " times head_dim = ", head_dim(), " is more than the ",
                    kMaxRopeElements, " entries the RoPE table may hold");
  TORCH_CHECK_VALUE(embedding_size >= vocab_size, "config: key '", key("embedding_size"), "' = ", embedding_size,
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
