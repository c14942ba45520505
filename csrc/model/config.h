// Model configuration (every family; what a family is: model/families.h), mirrored from
// python/blockbatch/config.py.
#pragma once

#include <cstdint>
#include <string>

namespace blockbatch {

// Sane upper bounds (python/blockbatch/config.py has the same): checked before anything sized by
// a config value is allocated. The weights bound every shape; these bound what no weight does:
// the RoPE table [max_sequence_length, head_dim] and the n_layers-long tensor list.
constexpr int64_t kMaxSequenceLength = int64_t{1} << 20;
constexpr int64_t kMaxLayers = int64_t{1} << 16;
constexpr int64_t kMaxDim = int64_t{1} << 24;           // d_model, mlp_hidden_size, vocab_size, embedding_size
constexpr int64_t kMaxRopeElements = int64_t{1} << 28;  // max_sequence_length * head_dim

// The model family: a property of the checkpoint (config.json's model_type), never a flag.
enum class Family : int64_t {
  kLLaDA = 0,   // LLaDA: unshifted logits, no attention biases
  kDream = 1,   // Dream (Qwen2 body): q/k/v biases; logits shifted (position i read from output i - 1)
  kLLaDA2 = 2,  // LLaDA2 (block-diffusion MoE): QK-norm, partial rotary, mixture-of-experts MLPs, block-causal
  kSDAR = 3,    // SDAR (dense Qwen3 body): split q/k/v, QK-norm, full rotary, block-causal
};
const char* family_name(Family family);  // "llada" | "dream" | "llada2" | "sdar"
// The config.json key a family writes a ModelConfig field under (LLaDA: the field's own name; Dream and
// LLaDA2: Qwen2's, e.g. n_layers -> num_hidden_layers; LLaDA2's own fields: head_size -> head_dim, ...).
// Every validate() message names keys through it, so each front door speaks the user's keys.
const char* config_key(Family family, const char* field);

struct ModelConfig {
  Family family = Family::kLLaDA;
  bool attention_bias = false;  // q/k/v projections carry biases (Dream)
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
  // Ids the decoders may propose: [0, proposal_vocab) (0: the whole vocabulary). Set from the
  // tokenizer when the embedding table is larger than it (Dream-7B: 152064 rows, ~151.7k ids the
  // tokenizer can produce); the softmax still runs over the whole vocabulary.
  int64_t proposal_vocab = 0;
  int64_t proposal_limit() const { return proposal_vocab > 0 ? proposal_vocab : vocab_size; }

  // The optional parts (0 / false where the family's row, model/families.h BodyOptions, has none;
  // today LLaDA2 has them all): an explicit head size, RoPE on the first rope_dims of a head,
  // per-head RMSNorm of q and k, a bias on the attention output, and the mixture of experts of the
  // layers from first_dense_layers on (num_experts 0: every layer dense). head_size and rope_dims are
  // never "unset" where the row has them: the readers resolve config.json's defaults (head_dim =
  // hidden_size // num_attention_heads, rope_dims = int(head_dim * partial_rotary_factor)), and
  // validate() refuses 0 there, as the reference does. Elsewhere 0 (the only legal value) means
  // d_model / n_heads and the whole head.
  int64_t head_size = 0;
  int64_t rope_dims = 0;
  bool qk_norm = false;
  bool attn_out_bias = false;
  int64_t num_experts = 0;
  int64_t experts_per_token = 0;
  int64_t expert_groups = 1;       // n_group: groups of consecutive experts ranked by their two best scores
  int64_t expert_groups_kept = 1;  // topk_group
  int64_t moe_hidden_size = 0;     // each routed expert's SwiGLU width
  int64_t shared_experts = 0;      // a shared SwiGLU of moe_hidden_size * shared_experts (0: none)
  int64_t first_dense_layers = 0;  // first_k_dense_replace
  double routed_scaling = 1.0;

  int64_t head_dim() const { return head_size > 0 ? head_size : d_model / n_heads; }
  int64_t rope_dim() const { return rope_dims > 0 ? rope_dims : head_dim(); }
  bool moe_layer(int64_t layer) const { return num_experts > 0 && layer >= first_dense_layers; }
  // How many tensors a checkpoint with this config holds (9 per layer, 3 more with attention
  // biases, the embedding, the final norm, the LM head unless tied); call after validate()
  // (n_layers bounded, so no overflow).
  int64_t tensor_count() const;
  // Throws c10::ValueError naming the offending key when the config is inconsistent, a value is
  // out of its sane range, or a float is not finite.
  void validate() const;
};

}  // namespace blockbatch
