#include "torch/model_handle.h"

#include <c10/util/Exception.h>

#include <unordered_map>

#include "model/families.h"
#include "model/transformer.h"

namespace blockbatch {

namespace {
c10::ScalarType parse_dtype(const std::string& dtype, c10::ScalarType fallback) {
  if (dtype.empty()) return fallback;
  if (dtype == "float32") return at::kFloat;
  if (dtype == "bfloat16") return at::kBFloat16;
  if (dtype == "float16") return at::kHalf;
  TORCH_CHECK(false, "dtype must be 'float32', 'bfloat16', 'float16' or '' (keep), got '", dtype, "'");
}
}  // namespace

ModelConfig config_from_dicts(const c10::Dict<std::string, int64_t>& ints,
                              const c10::Dict<std::string, double>& floats) {
  auto get_int = [&](const char* key) {
    TORCH_CHECK(ints.contains(key), "config: required integer key '", key, "' is missing");
    return ints.at(key);
  };
  auto get_float = [&](const char* key) {
    TORCH_CHECK(floats.contains(key), "config: required float key '", key, "' is missing");
    return floats.at(key);
  };
  auto get_optional_int = [&](const char* key, int64_t fallback) {
    return ints.contains(key) ? ints.at(key) : fallback;
  };
  ModelConfig c;
  // Optional keys (a LLaDA config may leave them out): the family and the attention biases.
  const int64_t family = get_optional_int("family", 0);
  TORCH_CHECK_VALUE(family_by_id(family) != nullptr, "config: key 'family' must be ", family_ids_text(), ", got ",
                    family);
  c.family = static_cast<Family>(family);
  const int64_t bias = get_optional_int("attention_bias", 0);
  TORCH_CHECK_VALUE(bias == 0 || bias == 1, "config: key 'attention_bias' must be 0 or 1, got ", bias);
  c.attention_bias = bias == 1;
  c.proposal_vocab = get_optional_int("proposal_vocab", 0);
  c.d_model = get_int("d_model");
  c.n_layers = get_int("n_layers");
  c.n_heads = get_int("n_heads");
  c.n_kv_heads = get_int("n_kv_heads");
  c.mlp_hidden_size = get_int("mlp_hidden_size");
  c.vocab_size = get_int("vocab_size");
  c.embedding_size = get_int("embedding_size");
  c.mask_token_id = get_int("mask_token_id");
  c.eos_token_id = get_int("eos_token_id");
  c.max_sequence_length = get_int("max_sequence_length");
  const int64_t tying = get_int("weight_tying");
  TORCH_CHECK_VALUE(tying == 0 || tying == 1, "config: key 'weight_tying' must be 0 or 1, got ", tying);
  c.weight_tying = tying == 1;
  c.rope_theta = get_float("rope_theta");
  c.rms_norm_eps = get_float("rms_norm_eps");
  // The keys of optional parts (model/families.h BodyOptions; absent where a family has no such part).
  auto flag = [&](const char* key) {
    const int64_t v = get_optional_int(key, 0);
    TORCH_CHECK_VALUE(v == 0 || v == 1, "config: key '", key, "' must be 0 or 1, got ", v);
    return v == 1;
  };
  c.head_size = get_optional_int("head_size", 0);
  c.rope_dims = get_optional_int("rope_dims", 0);
  c.qk_norm = flag("qk_norm");
  c.attn_out_bias = flag("attn_out_bias");
  c.num_experts = get_optional_int("num_experts", 0);
  c.experts_per_token = get_optional_int("experts_per_token", 0);
  c.expert_groups = get_optional_int("expert_groups", 1);
  c.expert_groups_kept = get_optional_int("expert_groups_kept", 1);
  c.moe_hidden_size = get_optional_int("moe_hidden_size", 0);
  c.shared_experts = get_optional_int("shared_experts", 0);
  c.first_dense_layers = get_optional_int("first_dense_layers", 0);
  c.routed_scaling = floats.contains("routed_scaling") ? floats.at("routed_scaling") : 1.0;
  c.validate();
  return c;
}

ModelHandle::ModelHandle(const c10::Dict<std::string, int64_t>& ints, const c10::Dict<std::string, double>& floats,
                         const c10::Dict<std::string, at::Tensor>& weights, const std::string& dtype) {
  ModelConfig config = config_from_dicts(ints, floats);
  std::unordered_map<std::string, at::Tensor> map;
  for (const auto& item : weights) map.emplace(item.key(), item.value());
  TORCH_CHECK(!map.empty(), "weights: the dict is empty");
  const c10::ScalarType type = parse_dtype(dtype, map.begin()->second.scalar_type());
  model_ = std::make_shared<const Transformer>(std::move(config), map, type);
}

}  // namespace blockbatch
