#include "model/families.h"

#include <c10/util/Exception.h>

#include <cstring>

namespace blockbatch {

namespace {

// Dream, LLaDA2 (and any Qwen-style config.json) write Qwen2's key names.
const std::vector<std::pair<const char*, const char*>> kQwen2Keys = {
    {"d_model", "hidden_size"},
    {"n_layers", "num_hidden_layers"},
    {"n_heads", "num_attention_heads"},
    {"n_kv_heads", "num_key_value_heads"},
    {"mlp_hidden_size", "intermediate_size"},
    {"embedding_size", "vocab_size"},
    {"max_sequence_length", "max_position_embeddings"},
    {"weight_tying", "tie_word_embeddings"},
};

std::vector<std::pair<const char*, const char*>> llada2_keys() {
  std::vector<std::pair<const char*, const char*>> keys = kQwen2Keys;
  keys.insert(keys.end(), {
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
                          });
  return keys;
}

// The LLaDA2 authors' config class (python/blockbatch/families/llada2.py read_config).
constexpr ConfigDefaults kLLaDA2Defaults{/*rope_theta=*/10000.0,
                                         /*rms_norm_eps=*/1e-5,
                                         /*max_sequence_length=*/32768,
                                         /*partial_rotary_factor=*/0.5,
                                         /*qkv_bias=*/false,
                                         /*qk_norm=*/true,
                                         /*attn_out_bias=*/true,
                                         /*num_experts=*/16,
                                         /*experts_per_token=*/2,
                                         /*expert_groups=*/8,
                                         /*expert_groups_kept=*/4,
                                         /*shared_experts=*/0,
                                         /*routed_scaling=*/2.5};

// The SDAR authors' config class (python/blockbatch/families/sdar.py read_config): a dense Qwen3 body.
constexpr ConfigDefaults kSDARDefaults{/*rope_theta=*/10000.0,
                                       /*rms_norm_eps=*/1e-6,
                                       /*max_sequence_length=*/32768,
                                       /*partial_rotary_factor=*/1.0,
                                       /*qkv_bias=*/false,
                                       /*qk_norm=*/true,
                                       /*attn_out_bias=*/false,
                                       /*num_experts=*/0,
                                       /*experts_per_token=*/0,
                                       /*expert_groups=*/1,
                                       /*expert_groups_kept=*/1,
                                       /*shared_experts=*/0,
                                       /*routed_scaling=*/1.0};

std::vector<std::pair<const char*, const char*>> sdar_keys() {
  std::vector<std::pair<const char*, const char*>> keys = kQwen2Keys;
  keys.push_back({"head_size", "head_dim"});
  return keys;
}

std::vector<FamilySpec> make_table() {
  std::vector<FamilySpec> rows;
  // LLaDA (OLMo-style names): split q/k/v without biases, a SwiGLU MLP, unshifted logits.
  rows.push_back(FamilySpec{
      Family::kLLaDA,
      "llada",
      "LLaDA",
      "llada",
      BodyOptions{/*fused_qkv=*/false, /*qkv_bias=*/Option::kNever, /*qk_norm=*/Option::kNever,
                  /*attn_out_bias=*/Option::kNever, /*explicit_head_size=*/false, /*partial_rotary=*/false,
                  RopeAngles::kFloat64, /*moe=*/false},
      /*logit_shift=*/0,
      AttentionPattern::kBidirectional,
      /*default_options=*/{},
      /*keys=*/{},
      /*default_mask_id=*/-1,
      /*default_eos_id=*/-1,
      /*ids_in_generation_config=*/false,
      /*defaults=*/nullptr,
      WeightNames{"model.transformer.wte.weight",
                  "model.transformer.ln_f.weight",
                  "model.transformer.ff_out.weight",
                  "model.transformer.blocks.",
                  "attn_norm.weight",
                  "q_proj.weight",
                  "k_proj.weight",
                  "v_proj.weight",
                  "",
                  "",
                  "",
                  "",
                  "",
                  "",
                  "",
                  "attn_out.weight",
                  "",
                  "ff_norm.weight",
                  "",
                  "ff_proj.weight",
                  "up_proj.weight",
                  "ff_out.weight",
                  "",
                  "",
                  "",
                  ""},
      /*missing_hints=*/{},
  });
  // Dream (a Qwen2 body): q/k/v biases, logits shifted by one.
  rows.push_back(FamilySpec{
      Family::kDream,
      "dream",
      "Dream",
      "Dream",
      BodyOptions{/*fused_qkv=*/false, /*qkv_bias=*/Option::kAlways, /*qk_norm=*/Option::kNever,
                  /*attn_out_bias=*/Option::kNever, /*explicit_head_size=*/false, /*partial_rotary=*/false,
                  RopeAngles::kFloat64, /*moe=*/false},
      /*logit_shift=*/1,
      AttentionPattern::kBidirectional,
      /*default_options=*/{},
      kQwen2Keys,
      /*default_mask_id=*/-1,
      /*default_eos_id=*/-1,
      /*ids_in_generation_config=*/true,
      /*defaults=*/nullptr,
      WeightNames{"model.embed_tokens.weight",
                  "model.norm.weight",
                  "lm_head.weight",
                  "model.layers.",
                  "input_layernorm.weight",
                  "self_attn.q_proj.weight",
                  "self_attn.k_proj.weight",
                  "self_attn.v_proj.weight",
                  "",
                  "self_attn.q_proj.bias",
                  "self_attn.k_proj.bias",
                  "self_attn.v_proj.bias",
                  "",
                  "",
                  "",
                  "self_attn.o_proj.weight",
                  "",
                  "post_attention_layernorm.weight",
                  "mlp.",
                  "gate_proj.weight",
                  "up_proj.weight",
                  "down_proj.weight",
                  "",
                  "",
                  "",
                  ""},
      /*missing_hints=*/{{{"_proj.bias"}, nullptr, " (Dream's q/k/v projections carry biases)"}},
  });
  // LLaDA2 (model_type llada2_moe): fused qkv, QK-norm, partial rotary, MoE from first_k_dense_replace on,
  // block-causal; the authors' generate() mask and EOS ids when config.json names none.
  rows.push_back(FamilySpec{
      Family::kLLaDA2,
      "llada2",
      "LLaDA2",
      "llada2_moe",
      BodyOptions{/*fused_qkv=*/true, /*qkv_bias=*/Option::kConfig, /*qk_norm=*/Option::kConfig,
                  /*attn_out_bias=*/Option::kConfig, /*explicit_head_size=*/true, /*partial_rotary=*/true,
                  RopeAngles::kFloat32, /*moe=*/true},
      /*logit_shift=*/0,
      AttentionPattern::kBlockCausal,
      // Only its own policy, at the authors' threshold (the options table's default is LLaDA's 0.9).
      /*default_options=*/{{"policy", "block"}, {"threshold", "0.95"}},
      llada2_keys(),
      /*default_mask_id=*/156895,
      /*default_eos_id=*/156892,
      /*ids_in_generation_config=*/false,
      &kLLaDA2Defaults,
      WeightNames{"model.word_embeddings.weight",
                  "model.norm.weight",
                  "lm_head.weight",
                  "model.layers.",
                  "input_layernorm.weight",
                  "",
                  "",
                  "",
                  "attention.query_key_value.weight",
                  "",
                  "",
                  "",
                  "attention.query_key_value.bias",
                  "attention.query_layernorm.weight",
                  "attention.key_layernorm.weight",
                  "attention.dense.weight",
                  "attention.dense.bias",
                  "post_attention_layernorm.weight",
                  "mlp.",
                  "gate_proj.weight",
                  "up_proj.weight",
                  "down_proj.weight",
                  "mlp.gate.weight",
                  "mlp.gate.expert_bias",
                  "mlp.experts.",
                  "mlp.shared_experts."},
      /*missing_hints=*/
      {{{".mlp.experts.", ".mlp.gate.", ".mlp.shared_experts."},
        nullptr,
        " (the layers from first_k_dense_replace on are mixtures of experts)"},
       {{"layernorm"}, ".attention.", " (use_qk_norm: per-head RMSNorm weights of q and k)"}},
  });
  // SDAR (model_type sdar, SDARForCausalLM; TraDo's body): a dense Qwen3 body (split q/k/v/o without
  // biases, per-head QK-norm before RoPE on the whole head, GQA, untied lm_head), block-causal; special
  // ids from config.json (required).
  rows.push_back(FamilySpec{
      Family::kSDAR,
      "sdar",
      "SDAR",
      "sdar",
      BodyOptions{/*fused_qkv=*/false, /*qkv_bias=*/Option::kNever, /*qk_norm=*/Option::kAlways,
                  /*attn_out_bias=*/Option::kNever, /*explicit_head_size=*/true, /*partial_rotary=*/false,
                  RopeAngles::kFloat32, /*moe=*/false},
      /*logit_shift=*/0,
      AttentionPattern::kBlockCausal,
      // Only the block policy, at the authors' generate.py defaults (low_confidence_dynamic, 0.85, blocks of 4).
      /*default_options=*/{{"policy", "block"}, {"threshold", "0.85"}, {"block_length", "4"}},
      sdar_keys(),
      /*default_mask_id=*/-1,
      /*default_eos_id=*/-1,
      /*ids_in_generation_config=*/false,
      &kSDARDefaults,
      WeightNames{"model.embed_tokens.weight",
                  "model.norm.weight",
                  "lm_head.weight",
                  "model.layers.",
                  "input_layernorm.weight",
                  "self_attn.q_proj.weight",
                  "self_attn.k_proj.weight",
                  "self_attn.v_proj.weight",
                  "",
                  "",
                  "",
                  "",
                  "",
                  "self_attn.q_norm.weight",
                  "self_attn.k_norm.weight",
                  "self_attn.o_proj.weight",
                  "",
                  "post_attention_layernorm.weight",
                  "mlp.",
                  "gate_proj.weight",
                  "up_proj.weight",
                  "down_proj.weight",
                  "",
                  "",
                  "",
                  ""},
      /*missing_hints=*/{{{"_norm.weight"}, ".self_attn.", " (SDAR: per-head RMSNorm weights of q and k)"}},
  });
  for (size_t i = 0; i < rows.size(); ++i) {
    TORCH_INTERNAL_ASSERT(static_cast<size_t>(rows[i].id) == i, "family table: row ", i, " has another id");
  }
  return rows;
}

}  // namespace

const std::vector<FamilySpec>& families() {
  static const std::vector<FamilySpec> table = make_table();
  return table;
}

const FamilySpec* family_by_id(int64_t id) {
  const auto& rows = families();
  return id >= 0 && id < static_cast<int64_t>(rows.size()) ? &rows[id] : nullptr;
}

const FamilySpec& family_spec(Family family) {
  const FamilySpec* spec = family_by_id(static_cast<int64_t>(family));
  TORCH_CHECK_VALUE(spec, "config: key 'family' = ", static_cast<int64_t>(family), " is not a model family (",
                    family_ids_text(), ")");
  return *spec;
}

const FamilySpec* family_by_model_type(const std::string& model_type) {
  for (const FamilySpec& spec : families()) {
    if (model_type == spec.model_type) return &spec;
  }
  return nullptr;
}

namespace {
// "a, b or c"
std::string listed(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += i + 1 == items.size() ? " or " : ", ";
    out += items[i];
  }
  return out;
}
}  // namespace

std::string family_ids_text() {
  std::vector<std::string> items;
  for (const FamilySpec& spec : families()) {
    items.push_back(std::to_string(static_cast<int64_t>(spec.id)) + " (" + spec.name + ")");
  }
  return listed(items);
}

std::string model_types_text() {
  std::vector<std::string> items;
  for (const FamilySpec& spec : families()) items.push_back(std::string("\"") + spec.model_type + "\"");
  return listed(items);
}

std::string family_names_text() {
  std::vector<std::string> items;
  for (const FamilySpec& spec : families()) items.push_back(spec.display_name);
  return listed(items);
}

std::string missing_tensor_hint(const FamilySpec& spec, const std::string& name) {
  auto has = [&](const char* part) { return name.find(part) != std::string::npos; };
  for (const MissingHint& h : spec.missing_hints) {
    bool any = false;
    for (const char* part : h.parts) any = any || has(part);
    if (any && (h.also == nullptr || has(h.also))) return h.hint;
  }
  return "";
}

const char* family_name(Family family) {
  const FamilySpec* spec = family_by_id(static_cast<int64_t>(family));
  return spec ? spec->name : "";
}

const char* config_key(Family family, const char* field) {
  const FamilySpec* spec = family_by_id(static_cast<int64_t>(family));
  if (spec == nullptr) return field;
  for (const auto& [name, key] : spec->keys) {
    if (std::strcmp(field, name) == 0) return key;
  }
  return field;
}

namespace {
using Shapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;

void add_swiglu(Shapes& out, const WeightNames& n, const std::string& prefix, int64_t width, int64_t d) {
  out.push_back({prefix + n.gate, {width, d}});
  out.push_back({prefix + n.up, {width, d}});
  out.push_back({prefix + n.down, {d, width}});
}
}  // namespace

std::vector<std::pair<std::string, std::vector<int64_t>>> weight_shapes(const ModelConfig& c) {
  const FamilySpec& spec = family_spec(c.family);
  const WeightNames& n = spec.weights;
  const int64_t d = c.d_model, hd = c.head_dim(), q = c.n_heads * hd, kv = c.n_kv_heads * hd;
  Shapes out;
  out.push_back({n.embed, {c.embedding_size, d}});
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = n.layer_prefix + std::to_string(i) + ".";
    out.push_back({p + n.attn_norm, {d}});
    if (spec.body.fused_qkv) {
      out.push_back({p + n.qkv, {q + 2 * kv, d}});
      if (c.attention_bias) out.push_back({p + n.qkv_bias, {q + 2 * kv}});
    } else {
      out.push_back({p + n.q, {q, d}});
      out.push_back({p + n.k, {kv, d}});
      out.push_back({p + n.v, {kv, d}});
      if (c.attention_bias) {
        out.push_back({p + n.q_bias, {q}});
        out.push_back({p + n.k_bias, {kv}});
        out.push_back({p + n.v_bias, {kv}});
      }
    }
    if (c.qk_norm) {
      out.push_back({p + n.q_norm, {hd}});
      out.push_back({p + n.k_norm, {hd}});
    }
    out.push_back({p + n.attn_out, {d, q}});
    if (c.attn_out_bias) out.push_back({p + n.attn_out_bias, {d}});
    out.push_back({p + n.ff_norm, {d}});
    if (c.moe_layer(i)) {
      out.push_back({p + n.router, {c.num_experts, d}});
      out.push_back({p + n.expert_bias, {c.num_experts}});
      for (int64_t e = 0; e < c.num_experts; ++e) {
        add_swiglu(out, n, p + n.experts + std::to_string(e) + ".", c.moe_hidden_size, d);
      }
      if (c.shared_experts > 0) add_swiglu(out, n, p + n.shared_experts, c.moe_hidden_size * c.shared_experts, d);
    } else {
      add_swiglu(out, n, p + n.dense_mlp, c.mlp_hidden_size, d);
    }
  }
  out.push_back({n.final_norm, {d}});
  if (!c.weight_tying) out.push_back({n.lm_head, {c.embedding_size, d}});
  return out;
}

}  // namespace blockbatch
