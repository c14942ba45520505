// The C++ family table: what a model family is, as facts about the model (python/blockbatch/families/
// is its Python twin). One row per family: its id, names, config.json model_type, the options of the
// one transformer body (model/transformer.h) it is assembled with, its logit shift and attention
// pattern, the special ids the C++ falls back to, the config.json key names and the Hugging Face
// weight names. Nothing outside this table (and the policies' per-family rules tables in
// decode/policies/, keyed by the row's name) asks which family a model is: a new family is a new row
// (docs/adding-a-family.md).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/config.h"

namespace blockbatch {

// Whether a config option exists for a family, and if so whether config.json may choose it.
enum class Option {
  kNever,   // the family has no such part (the config field must keep its default)
  kAlways,  // every model of the family has it (the config field must be set)
  kConfig,  // config.json chooses (with the family's default)
};

// How the RoPE table's angles are computed: bit-for-bit what each family's reference does.
enum class RopeAngles {
  kFloat64,  // inverse frequencies and angles in float64, the cos | sin rounded to float32 (LLaDA, Dream)
  kFloat32,  // float32 inverse frequencies times float32 positions (the LLaDA2 authors' model)
};

enum class AttentionPattern {
  kBidirectional,  // every position sees the whole canvas
  kBlockCausal,    // a position sees its own block and every earlier one (the block decoder's kv_lens)
};

// The parts of the body a family's layers are assembled from (model/transformer.h).
struct BodyOptions {
  bool fused_qkv;           // one [q | k | v] projection tensor in the checkpoint (else q, k, v apart)
  Option qkv_bias;          // biases on the q / k / v projections
  Option qk_norm;           // per-head RMSNorm of q and k before RoPE
  Option attn_out_bias;     // a bias on the attention output projection
  bool explicit_head_size;  // config.json gives head_dim (else d_model / n_heads)
  bool partial_rotary;      // RoPE on the first rope_dims of a head (else the whole head)
  RopeAngles rope_angles;   // how the RoPE table is computed
  bool moe;                 // the MLP may be a mixture of experts (num_experts > 0, from first_dense_layers on)
};

// Hugging Face tensor names: the model-wide tensors, then per layer the suffix after
// `layer_prefix + <layer> + "."` of each slot ("" where the family has no such tensor).
struct WeightNames {
  const char* embed;
  const char* final_norm;
  const char* lm_head;
  const char* layer_prefix;
  const char* attn_norm;
  const char* q;
  const char* k;
  const char* v;
  const char* qkv;  // fused_qkv
  const char* q_bias;
  const char* k_bias;
  const char* v_bias;
  const char* qkv_bias;  // fused_qkv
  const char* q_norm;
  const char* k_norm;
  const char* attn_out;
  const char* attn_out_bias;
  const char* ff_norm;
  // A SwiGLU under a prefix: <prefix><gate>, <prefix><up>, <prefix><down>.
  const char* dense_mlp;  // the dense layers' SwiGLU prefix (after the layer prefix)
  const char* gate;
  const char* up;
  const char* down;
  // MoE layers (BodyOptions::moe): router weight and bias, expert e's SwiGLU under <experts><e>.,
  // the shared experts' SwiGLU under <shared_experts>.
  const char* router;
  const char* expert_bias;
  const char* experts;
  const char* shared_experts;
};

// What a missing optional config.json key means for a family whose readers take the defaults of the
// authors' config class (LLaDA2; the other rows require those keys and have none).
struct ConfigDefaults {
  double rope_theta;
  double rms_norm_eps;
  int64_t max_sequence_length;
  double partial_rotary_factor;           // partial_rotary families
  bool qkv_bias, qk_norm, attn_out_bias;  // the Option::kConfig parts
  int64_t num_experts, experts_per_token, expert_groups, expert_groups_kept, shared_experts;  // moe families
  double routed_scaling;
};

// A hint added to "tensor '<name>' is missing" when the name holds any of `parts` (and `also`, if set).
struct MissingHint {
  std::vector<const char*> parts;
  const char* also;
  const char* hint;
};

struct FamilySpec {
  Family id;
  const char* name;          // "llada": ModelConfig's family, the options table's family column
  const char* display_name;  // "LLaDA": messages about a checkpoint
  const char* model_type;    // config.json's model_type
  BodyOptions body;
  int64_t logit_shift;  // canvas position p reads model output p - logit_shift
  AttentionPattern attention;
  // The decode options a request gets where it sets none ({option, value}: families/<family>.py
  // DEFAULT_OPTIONS, which the bb_* binaries apply under their flags).
  std::vector<std::pair<const char*, const char*>> default_options;
  // config.json's keys of the ModelConfig fields that the family names otherwise ({field, key}).
  std::vector<std::pair<const char*, const char*>> keys;
  // Special ids taken where config.json names none (-1: the key is required).
  int64_t default_mask_id;
  int64_t default_eos_id;
  // Dream keeps its special ids in generation_config.json too (config.json wins).
  bool ids_in_generation_config;
  // The defaults of optional config.json keys; nullptr: those keys are required (io/checkpoint.cpp).
  const ConfigDefaults* defaults;
  WeightNames weights;
  std::vector<MissingHint> missing_hints;
};

// Every family, in id order (row i has id i).
const std::vector<FamilySpec>& families();
// The row of `family`; throws c10::ValueError naming key 'family' when it is no family's id.
const FamilySpec& family_spec(Family family);
// The row whose id is `id`, nullptr if none.
const FamilySpec* family_by_id(int64_t id);
// The row whose config.json model_type is `model_type`, nullptr if none.
const FamilySpec* family_by_model_type(const std::string& model_type);
// "0 (llada), 1 (dream) or 2 (llada2)" and "\"llada\", \"Dream\" or \"llada2_moe\"": the ids and model
// types as messages list them.
std::string family_ids_text();
std::string model_types_text();
// The families' display names as a help text lists them: "LLaDA, Dream, LLaDA2 or SDAR".
std::string family_names_text();
// The hint for missing tensor `name` of `spec` ("" if none).
std::string missing_tensor_hint(const FamilySpec& spec, const std::string& name);

// Hugging Face names and shapes of every tensor of a checkpoint of `config` (mirrors
// python/blockbatch/families/<family>.py weight_shapes); call after validate().
std::vector<std::pair<std::string, std::vector<int64_t>>> weight_shapes(const ModelConfig& config);

}  // namespace blockbatch
