#include "model/config.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <cstring>
#include <utility>

#include "model/families.h"

namespace blockbatch {

int64_t ModelConfig::tensor_count() const {
  const bool fused = family_spec(family).body.fused_qkv;
  const int64_t model_wide = 2 + (weight_tying ? 0 : 1);  // embeddings, final norm, LM head
  // norms, q/k/v (fused or apart, + biases), q/k norms, output (+ bias); a SwiGLU, or router + expert bias +
  // experts (+ shared)
  const int64_t attention =
      3 + (fused ? 1 : 3) + (attention_bias ? (fused ? 1 : 3) : 0) + (qk_norm ? 2 : 0) + (attn_out_bias ? 1 : 0);
  int64_t count = model_wide;
  for (int64_t l = 0; l < n_layers; ++l) {
    count += attention + (moe_layer(l) ? 2 + 3 * num_experts + (shared_experts > 0 ? 3 : 0) : 3);
  }
  return count;
}

namespace {
// The parts a family's row says its models may have (model/families.h BodyOptions), checked by the keys its
// config.json holds. The reference's rules (python/blockbatch/reference/llada2.py cfg_ok): rope_dim =
// int(head_dim * partial_rotary_factor) must be even and in (0, head_dim]; 0 is a value here, never "unset".
void validate_parts(const ModelConfig& c, const FamilySpec& spec) {
  auto key = [&](const char* field) { return config_key(c.family, field); };
  const BodyOptions& o = spec.body;
  if (o.explicit_head_size) {
    TORCH_CHECK_VALUE(c.head_size >= 1 && c.head_size <= kMaxDim, "config: key '", key("head_size"),
                      "' = ", c.head_size, " must be in [1, ", kMaxDim, "]");
  }
  if (o.partial_rotary) {
    TORCH_CHECK_VALUE(c.rope_dims > 0 && c.rope_dims <= c.head_size && c.rope_dims % 2 == 0, "config: key '",
                      key("rope_dims"), "' gives head_dim * partial_rotary_factor = ", c.rope_dims,
                      " rotary dims (head_dim = ", c.head_size, "); they must be even and in (0, head_dim]");
  }
  if (o.moe) {
    TORCH_CHECK_VALUE(c.first_dense_layers >= 0 && c.first_dense_layers <= kMaxLayers, "config: key '",
                      key("first_dense_layers"), "' = ", c.first_dense_layers, " must be in [0, ", kMaxLayers, "]");
  }
  // The optional parts: present exactly when the row says so (Option::kConfig: either).
  struct Part {
    const char* field;
    Option option;
    bool present;
    const char* what;
  };
  for (const Part& p :
       {Part{"attention_bias", o.qkv_bias, c.attention_bias, "q/k/v biases"},
        Part{"qk_norm", o.qk_norm, c.qk_norm, "QK-norm"},
        Part{"attn_out_bias", o.attn_out_bias, c.attn_out_bias, "attention output bias"},
        Part{"head_size", o.explicit_head_size ? Option::kConfig : Option::kNever, c.head_size != 0,
             "explicit head size"},
        Part{"rope_dims", o.partial_rotary ? Option::kConfig : Option::kNever, c.rope_dims != 0, "partial rotary"},
        Part{"num_experts", o.moe ? Option::kConfig : Option::kNever, c.num_experts != 0, "experts"}}) {
    TORCH_CHECK_VALUE(p.option == Option::kConfig || p.present == (p.option == Option::kAlways), "config: key '",
                      key(p.field), p.present ? "' is set, but " : "' is unset, but ", spec.name, " models ",
                      p.option == Option::kAlways ? "always have " : "have no ", p.what);
  }
  if (!o.moe || c.num_experts == 0) return;  // every layer dense (config.json's num_experts: null)
  TORCH_CHECK_VALUE(c.num_experts > 0 && c.num_experts <= (1 << 16), "config: key 'num_experts' = ", c.num_experts,
                    " must be in [1, 65536] (or null: every layer dense)");
  TORCH_CHECK_VALUE(c.expert_groups > 0 && c.num_experts % c.expert_groups == 0 && c.num_experts / c.expert_groups >= 2,
                    "config: key '", key("expert_groups"), "' = ", c.expert_groups,
                    " must divide num_experts = ", c.num_experts,
                    " into groups of at least 2 (a group is ranked by its two best scores)");
  TORCH_CHECK_VALUE(c.expert_groups_kept >= 1 && c.expert_groups_kept <= c.expert_groups, "config: key '",
                    key("expert_groups_kept"), "' = ", c.expert_groups_kept, " must be in [1, ", key("expert_groups"),
                    " = ", c.expert_groups, "]");
  const int64_t choosable = c.expert_groups_kept * (c.num_experts / c.expert_groups);
  TORCH_CHECK_VALUE(c.experts_per_token >= 1 && c.experts_per_token <= choosable, "config: key '",
                    key("experts_per_token"), "' = ", c.experts_per_token, " must be in [1, ", choosable,
                    "] (the experts of the ", key("expert_groups_kept"), " kept groups)");
  TORCH_CHECK_VALUE(c.moe_hidden_size > 0 && c.moe_hidden_size <= kMaxDim, "config: key '", key("moe_hidden_size"),
                    "' = ", c.moe_hidden_size, " must be in [1, ", kMaxDim, "]");
  // shared_experts bounded first: the product below must not overflow.
  TORCH_CHECK_VALUE(
      c.shared_experts >= 0 && c.shared_experts <= kMaxDim && c.shared_experts * c.moe_hidden_size <= kMaxDim,
      "config: key '", key("shared_experts"), "' = ", c.shared_experts, " must be >= 0 and its width at most ",
      kMaxDim);
  TORCH_CHECK_VALUE(std::isfinite(c.routed_scaling) && c.routed_scaling > 0, "config: key '", key("routed_scaling"),
                    "' must be a positive finite number, got ", c.routed_scaling);
}
}  // namespace

void ModelConfig::validate() const {
  const FamilySpec& spec = family_spec(family);  // names key 'family' when it is no family's id
  validate_parts(*this, spec);
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
  // The reference allows an odd explicit head_dim (only its rope_dims must be even); the engine's
  // kernels do not, so it is refused here by the key the user wrote.
  if (spec.body.explicit_head_size) {
    TORCH_CHECK_VALUE(head_size % 2 == 0, "config: key '", key("head_size"), "' = ", head_size,
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
