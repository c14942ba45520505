// The native LLaDA / Dream forward: every step through a blockbatch op (GEMMs: ops::linear, ATen's GEMM or
// the weight-streaming CUDA kernel), so it runs on whichever device the weights live on.
#include "model/model.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/max.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/reciprocal.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <optional>
#include <set>

#include "model/attention.h"
#include "ops/ops.h"

namespace blockbatch {

namespace {

// Hugging Face tensor names of one family: the model-wide tensors and, per layer, the suffix
// after the layer prefix of each slot.
struct WeightNames {
  std::string wte, ln_f, lm_head, layer_prefix;
  std::string attn_norm, q, k, v, attn_out, ff_norm, gate, up, down, q_bias, k_bias, v_bias;
};

const WeightNames& weight_names(Family family) {
  static const WeightNames llada{"model.transformer.wte.weight",
                                 "model.transformer.ln_f.weight",
                                 "model.transformer.ff_out.weight",
                                 "model.transformer.blocks.",
                                 "attn_norm.weight",
                                 "q_proj.weight",
                                 "k_proj.weight",
                                 "v_proj.weight",
                                 "attn_out.weight",
                                 "ff_norm.weight",
                                 "ff_proj.weight",
                                 "up_proj.weight",
                                 "ff_out.weight",
                                 "",
                                 "",
                                 ""};
  static const WeightNames dream{"model.embed_tokens.weight",
                                 "model.norm.weight",
                                 "lm_head.weight",
                                 "model.layers.",
                                 "input_layernorm.weight",
                                 "self_attn.q_proj.weight",
                                 "self_attn.k_proj.weight",
                                 "self_attn.v_proj.weight",
                                 "self_attn.o_proj.weight",
                                 "post_attention_layernorm.weight",
                                 "mlp.gate_proj.weight",
                                 "mlp.up_proj.weight",
                                 "mlp.down_proj.weight",
                                 "self_attn.q_proj.bias",
                                 "self_attn.k_proj.bias",
                                 "self_attn.v_proj.bias"};
  return family == Family::kDream ? dream : llada;
}

}  // namespace

std::vector<std::pair<std::string, std::vector<int64_t>>> expected_weight_shapes(const ModelConfig& c) {
  const int64_t d = c.d_model, hd = c.head_dim(), m = c.mlp_hidden_size;
  const WeightNames& n = weight_names(c.family);
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  out.push_back({n.wte, {c.embedding_size, d}});
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = n.layer_prefix + std::to_string(i) + ".";
    out.push_back({p + n.attn_norm, {d}});
    out.push_back({p + n.q, {c.n_heads * hd, d}});
    out.push_back({p + n.k, {c.n_kv_heads * hd, d}});
    out.push_back({p + n.v, {c.n_kv_heads * hd, d}});
    if (c.attention_bias) {
      out.push_back({p + n.q_bias, {c.n_heads * hd}});
      out.push_back({p + n.k_bias, {c.n_kv_heads * hd}});
      out.push_back({p + n.v_bias, {c.n_kv_heads * hd}});
    }
    out.push_back({p + n.attn_out, {d, c.n_heads * hd}});
    out.push_back({p + n.ff_norm, {d}});
    out.push_back({p + n.gate, {m, d}});
    out.push_back({p + n.up, {m, d}});
    out.push_back({p + n.down, {d, m}});
  }
  out.push_back({n.ln_f, {d}});
  if (!c.weight_tying) out.push_back({n.lm_head, {c.embedding_size, d}});
  return out;
}

namespace {
constexpr int64_t kInitialRopePositions = 4096;  // 2 MB at head_dim 128
}  // namespace

Model::Model(ModelConfig config, const std::unordered_map<std::string, at::Tensor>& weights, c10::ScalarType dtype)
    : config_(std::move(config)) {
  config_.validate();
  build(weights, dtype);
}

void Model::build(const std::unordered_map<std::string, at::Tensor>& weights, c10::ScalarType dtype) {
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf,
              "dtype must be float32, bfloat16 or float16, got ", dtype);
  // The config against the weights before anything sized by it is built (the expected-tensor
  // list is n_layers long; the RoPE table below is bounded by validate()).
  TORCH_CHECK(config_.n_layers <= static_cast<int64_t>(weights.size()),
              "weights: config key 'n_layers' = ", config_.n_layers, " needs ", config_.tensor_count(),
              " tensors but the dict holds ", weights.size());
  const std::optional<c10::Device> device =
      check_weights(expected_weight_shapes(config_), weights, family_name(config_.family));
  auto w = [&](const std::string& name) { return weights.at(name).to(dtype).contiguous(); };
  const WeightNames& n = weight_names(config_.family);
  wte_ = w(n.wte);
  ln_f_ = w(n.ln_f);
  lm_head_ = (config_.weight_tying ? wte_ : w(n.lm_head)).narrow(0, 0, config_.vocab_size).contiguous();
  layers_.clear();
  for (int64_t i = 0; i < config_.n_layers; ++i) {
    const std::string p = n.layer_prefix + std::to_string(i) + ".";
    LayerWeights lw;
    lw.attn_norm = w(p + n.attn_norm);
    lw.wqkv = at::cat({w(p + n.q), w(p + n.k), w(p + n.v)}, 0);
    if (config_.attention_bias) lw.bqkv = at::cat({w(p + n.q_bias), w(p + n.k_bias), w(p + n.v_bias)}, 0);
    lw.attn_out = w(p + n.attn_out);
    lw.ff_norm = w(p + n.ff_norm);
    lw.w_gate_up = at::cat({w(p + n.gate), w(p + n.up)}, 0);
    lw.ff_out = w(p + n.down);
    layers_.push_back(std::move(lw));
  }
  const int64_t hd = config_.head_dim();
  auto f64 = at::TensorOptions().dtype(at::kDouble).device(*device);
  rope_->inv_freq = at::reciprocal(at::pow(config_.rope_theta, at::arange(0, hd, 2, f64).div(hd)));
  rope_table(std::min<int64_t>(config_.max_sequence_length, kInitialRopePositions));
}

at::Tensor Model::rope_table(int64_t positions) const {
  std::lock_guard<std::mutex> lock(rope_->mutex);
  const int64_t have = rope_->table.defined() ? rope_->table.size(0) : 0;
  if (positions <= have) return rope_->table;
  // cos | sin of one angle per frequency, computed in float64 exactly as the reference does, then
  // rounded to float32: row p does not depend on the table's length. Doubling bounds the growths.
  const int64_t n = std::min(config_.max_sequence_length, std::max(positions, 2 * have));
  TORCH_CHECK(positions <= n, "positions up to ", positions,
              " exceed max_sequence_length = ", config_.max_sequence_length);
  const at::Tensor angles = at::arange(n, rope_->inv_freq.options()).unsqueeze(1).mul(rope_->inv_freq.unsqueeze(0));
  if (rope_->table.defined()) rope_->retired.push_back(rope_->table);
  rope_->table = at::cat({angles.cos(), angles.sin()}, 1).to(at::kFloat).contiguous();
  return rope_->table;
}

at::Tensor Model::new_kv(int64_t rows, int64_t length) const { return zero_kv(*this, wte_.options(), rows, length); }

void Model::check(const ForwardBatch& b) const { check_forward_batch(*this, b); }

at::Tensor Model::forward(const ForwardBatch& batch) const {
  // Index tensors are read through raw pointers (the value checks, the kernels): any strided view
  // (base[::2], an expand()) is made contiguous first. A no-op for the decode loop's own buffers.
  const ForwardBatch b = contiguous_indices(batch);
  check(b);
  const auto& c = config_;
  const int64_t T = b.tokens.size(0), hd = c.head_dim();
  // A bound on the positions, for the RoPE table: the caller's, else the KV length (positions
  // index it), else read from the positions (a device sync off the CPU; the decode loops say it).
  int64_t positions = b.max_positions;
  if (positions <= 0) positions = b.kv.defined() ? b.kv_length() : (T > 0 ? b.positions.max().item<int64_t>() + 1 : 1);
  const at::Tensor rope_table = this->rope_table(positions);
  const int64_t q_width = c.n_heads * hd, kv_width = c.n_kv_heads * hd;
  const AttnMeta meta = attention_meta(b);  // once per forward: every layer attends through it

  // Each residual add is fused with the RMSNorm after it (add_rms_norm_): x += attention output,
  // then ff_norm; x += MLP output, then the next layer's attn_norm. The last MLP add stays plain.
  at::Tensor x = wte_.index_select(0, b.tokens);
  at::Tensor h = ops::rms_norm(x, layers_[0].attn_norm, c.rms_norm_eps);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LayerWeights& w = layers_[l];
    at::Tensor qkv = ops::linear(h, w.wqkv);
    if (w.bqkv.defined()) qkv.add_(w.bqkv);  // Dream: x W^T + b, rounded as the reference does it
    at::Tensor q = qkv.narrow(1, 0, q_width).view({T, c.n_heads, hd});
    at::Tensor k = qkv.narrow(1, q_width, kv_width).view({T, c.n_kv_heads, hd});
    at::Tensor v = qkv.narrow(1, q_width + kv_width, kv_width).view({T, c.n_kv_heads, hd});
    if (meta.write) {  // rotate q and k and fill the fresh K/V slots in one pass
      ops::rope_kv_write_(q, k, v, meta.positions, rope_table, meta.kv, meta.cu_seqlens, meta.kv_rows, l,
                          meta.write_pages);
    } else {
      ops::rope_(q, b.positions, rope_table);
      ops::rope_(k, b.positions, rope_table);
    }
    at::Tensor attn = attend(q, k, v, meta, l);
    h = ops::add_rms_norm_(x, ops::linear(attn, w.attn_out), w.ff_norm, c.rms_norm_eps);
    const at::Tensor mlp = ops::linear(ops::silu_mul(ops::linear(h, w.w_gate_up)), w.ff_out);
    if (l + 1 < c.n_layers) {
      h = ops::add_rms_norm_(x, mlp, layers_[l + 1].attn_norm, c.rms_norm_eps);
    } else {
      x.add_(mlp);
    }
  }
  at::Tensor last = b.logit_index.defined() ? x.index_select(0, b.logit_index) : x;
  return ops::linear(ops::rms_norm(last, ln_f_, c.rms_norm_eps), lm_head_);
}

}  // namespace blockbatch
