// The native LLaDA2 forward (model/llada2.h). Norms, GEMMs, RoPE, the KV writes and the attention go
// through the blockbatch ops, as in the LLaDA / Dream body; the router through ATen on the device,
// the routed experts through ops::moe_experts (one GEMM per active expert, or on CUDA the opt-in
// kernels that keep the router's choices on the device).
#include "model/llada2.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/max.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <optional>

#include "model/attention.h"
#include "ops/ops.h"

namespace blockbatch {

namespace {
const std::string kPrefix = "model.";

void add_swiglu(std::vector<std::pair<std::string, std::vector<int64_t>>>& out, const std::string& p, int64_t width,
                int64_t d) {
  out.push_back({p + "gate_proj.weight", {width, d}});
  out.push_back({p + "up_proj.weight", {width, d}});
  out.push_back({p + "down_proj.weight", {d, width}});
}
}  // namespace

std::vector<std::pair<std::string, std::vector<int64_t>>> llada2_weight_shapes(const ModelConfig& c) {
  const int64_t d = c.d_model, hd = c.head_dim(), qkv = (c.n_heads + 2 * c.n_kv_heads) * hd;
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  out.push_back({kPrefix + "word_embeddings.weight", {c.embedding_size, d}});
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = kPrefix + "layers." + std::to_string(i) + ".";
    out.push_back({p + "input_layernorm.weight", {d}});
    out.push_back({p + "attention.query_key_value.weight", {qkv, d}});
    if (c.attention_bias) out.push_back({p + "attention.query_key_value.bias", {qkv}});
    if (c.qk_norm) {
      out.push_back({p + "attention.query_layernorm.weight", {hd}});
      out.push_back({p + "attention.key_layernorm.weight", {hd}});
    }
    out.push_back({p + "attention.dense.weight", {d, c.n_heads * hd}});
    if (c.attn_out_bias) out.push_back({p + "attention.dense.bias", {d}});
    out.push_back({p + "post_attention_layernorm.weight", {d}});
    if (c.moe_layer(i)) {
      out.push_back({p + "mlp.gate.weight", {c.num_experts, d}});
      out.push_back({p + "mlp.gate.expert_bias", {c.num_experts}});
      for (int64_t e = 0; e < c.num_experts; ++e) {
        add_swiglu(out, p + "mlp.experts." + std::to_string(e) + ".", c.moe_hidden_size, d);
      }
      if (c.shared_experts > 0) add_swiglu(out, p + "mlp.shared_experts.", c.moe_hidden_size * c.shared_experts, d);
    } else {
      add_swiglu(out, p + "mlp.", c.mlp_hidden_size, d);
    }
  }
  out.push_back({kPrefix + "norm.weight", {d}});
  if (!c.weight_tying) out.push_back({"lm_head.weight", {c.embedding_size, d}});
  return out;
}

LLaDA2Model::LLaDA2Model(ModelConfig config, const std::unordered_map<std::string, at::Tensor>& weights,
                         c10::ScalarType dtype)
    : config_(std::move(config)) {
  config_.validate();
  TORCH_CHECK(config_.family == Family::kLLaDA2, "LLaDA2Model: the config is of family ", family_name(config_.family));
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf,
              "dtype must be float32, bfloat16 or float16, got ", dtype);
  const int64_t needed = config_.tensor_count();
  TORCH_CHECK(needed <= static_cast<int64_t>(weights.size()), "weights: a llada2 model with this config needs ", needed,
              " tensors but the dict holds ", weights.size());
  const std::optional<c10::Device> device =
      check_weights(llada2_weight_shapes(config_), weights, family_name(config_.family));
  auto w = [&](const std::string& name) { return weights.at(name).to(dtype).contiguous(); };
  auto swiglu = [&](const std::string& p) {
    return SwiGLU{at::cat({w(p + "gate_proj.weight"), w(p + "up_proj.weight")}, 0), w(p + "down_proj.weight")};
  };
  wte_ = w(kPrefix + "word_embeddings.weight");
  norm_ = w(kPrefix + "norm.weight");
  lm_head_ = (config_.weight_tying ? wte_ : w("lm_head.weight")).narrow(0, 0, config_.vocab_size).contiguous();
  for (int64_t i = 0; i < config_.n_layers; ++i) {
    const std::string p = kPrefix + "layers." + std::to_string(i) + ".";
    LLaDA2Layer l;
    l.attn_norm = w(p + "input_layernorm.weight");
    l.wqkv = w(p + "attention.query_key_value.weight");
    if (config_.attention_bias) l.bqkv = w(p + "attention.query_key_value.bias");
    if (config_.qk_norm) {
      l.q_norm = w(p + "attention.query_layernorm.weight");
      l.k_norm = w(p + "attention.key_layernorm.weight");
    }
    l.dense = w(p + "attention.dense.weight");
    if (config_.attn_out_bias) l.dense_bias = w(p + "attention.dense.bias");
    l.ff_norm = w(p + "post_attention_layernorm.weight");
    if (config_.moe_layer(i)) {
      // The router in float32 whatever the dtype (the authors' fp32 router logits).
      l.router = weights.at(p + "mlp.gate.weight").to(at::kFloat).contiguous();
      l.expert_bias = weights.at(p + "mlp.gate.expert_bias").to(at::kFloat).contiguous();
      // The experts stacked ([E, 2m, d] gate|up, [E, d, m] down), as moe_experts takes them.
      std::vector<at::Tensor> gate_up, down;
      for (int64_t e = 0; e < config_.num_experts; ++e) {
        SwiGLU expert = swiglu(p + "mlp.experts." + std::to_string(e) + ".");
        gate_up.push_back(std::move(expert.gate_up));
        down.push_back(std::move(expert.down));
      }
      l.experts = SwiGLU{at::stack(gate_up), at::stack(down)};
      if (config_.shared_experts > 0) l.shared = swiglu(p + "mlp.shared_experts.");
    } else {
      l.mlp = swiglu(p + "mlp.");
    }
    layers_.push_back(std::move(l));
  }
  // RoPE as the authors' model computes it: float32 inverse frequencies theta^-(2i / r) times float32
  // positions, cos | sin of the r / 2 angles (rotate-half pairing over the first r dims).
  const int64_t r = config_.rope_dim();
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(*device);
  const at::Tensor exponents = at::arange(0, r, 2, f32.dtype(at::kLong)).to(at::kFloat).div(static_cast<double>(r));
  inv_freq_ = at::pow(config_.rope_theta, exponents).reciprocal();
  rope_table(std::min<int64_t>(config_.max_sequence_length, 4096));
}

at::Tensor LLaDA2Model::rope_table(int64_t positions) const {
  std::lock_guard<std::mutex> lock(rope_->mutex);
  const int64_t have = rope_->table.defined() ? rope_->table.size(0) : 0;
  if (positions <= have) return rope_->table;
  // Row p does not depend on the table's length; doubling bounds the growths.
  const int64_t n = std::min(config_.max_sequence_length, std::max(positions, 2 * have));
  TORCH_CHECK(positions <= n, "positions up to ", positions,
              " exceed max_sequence_length = ", config_.max_sequence_length);
  const at::Tensor angles =
      at::arange(n, inv_freq_.options().dtype(at::kLong)).to(at::kFloat).unsqueeze(1).mul(inv_freq_.unsqueeze(0));
  rope_->table = at::cat({angles.cos(), angles.sin()}, 1).contiguous();
  return rope_->table;
}

bool LLaDA2Model::capturable() const {
  const bool moe = config_.num_experts > 0 && config_.first_dense_layers < config_.n_layers;
  return !moe || ops::moe_experts_capturable(device());
}

at::Tensor LLaDA2Model::new_kv(int64_t rows, int64_t length) const {
  return zero_kv(*this, wte_.options(), rows, length);
}

void LLaDA2Model::check(const ForwardBatch& b) const { check_forward_batch(*this, b); }

namespace {
at::Tensor swiglu(const SwiGLU& w, const at::Tensor& x) {
  return ops::linear(ops::silu_mul(ops::linear(x, w.gate_up)), w.down);
}
}  // namespace

at::Tensor LLaDA2Model::moe(const LLaDA2Layer& w, const at::Tensor& x) const {
  const ModelConfig& c = config_;
  const int64_t T = x.size(0), E = c.num_experts, G = c.expert_groups, K = c.experts_per_token;
  // The router (reference/llada2.py route): sigmoid scores; experts chosen on scores + expert_bias
  // within the topk_group groups of the best two-score sums; weights from the raw scores.
  const at::Tensor scores = ops::linear(x.to(at::kFloat), w.router).sigmoid();
  const at::Tensor biased = scores.add(w.expert_bias);
  const at::Tensor group_scores = std::get<0>(biased.view({T, G, E / G}).topk(2, -1)).sum(-1);
  const at::Tensor kept = std::get<1>(at::topk(group_scores, c.expert_groups_kept, -1, true, false));
  const at::Tensor group_mask = at::zeros_like(group_scores).scatter_(1, kept, 1.0);
  const at::Tensor expert_mask = group_mask.unsqueeze(-1).expand({T, G, E / G}).reshape({T, E});
  const at::Tensor chosen =
      std::get<1>(at::topk(biased.masked_fill(expert_mask.eq(0), -std::numeric_limits<double>::infinity()), K, -1));
  at::Tensor weights = scores.gather(1, chosen);
  if (K > 1) weights = weights.div(weights.sum(-1, true).add(1e-20));
  weights = weights.mul(c.routed_scaling);
  at::Tensor y =
      ops::moe_experts(x.contiguous(), chosen.contiguous(), weights.contiguous(), w.experts.gate_up, w.experts.down);
  if (w.shared.gate_up.defined()) y.add_(swiglu(w.shared, x));
  return y;
}

at::Tensor LLaDA2Model::forward(const ForwardBatch& batch) const {
  const ForwardBatch b = contiguous_indices(batch);
  check(b);
  const ModelConfig& c = config_;
  const int64_t T = b.tokens.size(0), hd = c.head_dim(), r = c.rope_dim();
  const int64_t H = c.n_heads, Hkv = c.n_kv_heads;
  const AttnMeta meta = attention_meta(b);  // once per forward (model/attention.h)
  int64_t positions = b.max_positions;      // a bound on the positions (as the LLaDA body finds it)
  if (positions <= 0) positions = b.kv.defined() ? b.kv_length() : (T > 0 ? b.positions.max().item<int64_t>() + 1 : 1);
  const at::Tensor table = rope_table(positions);
  auto rotate = [&](at::Tensor t) {  // t: contiguous [T, heads, hd]; RoPE on its first r dims
    if (r == hd) {
      ops::rope_(t, b.positions, table);
      return t;
    }
    at::Tensor part = t.narrow(2, 0, r).contiguous();
    ops::rope_(part, b.positions, table);
    t.narrow(2, 0, r).copy_(part);
    return t;
  };
  at::Tensor x = wte_.index_select(0, b.tokens);
  at::Tensor h = ops::rms_norm(x, layers_[0].attn_norm, c.rms_norm_eps);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const LLaDA2Layer& w = layers_[l];
    at::Tensor qkv = ops::linear(h, w.wqkv);
    if (w.bqkv.defined()) qkv.add_(w.bqkv);
    at::Tensor q = qkv.narrow(1, 0, H * hd).reshape({T * H, hd});
    at::Tensor k = qkv.narrow(1, H * hd, Hkv * hd).reshape({T * Hkv, hd});
    const at::Tensor v = qkv.narrow(1, (H + Hkv) * hd, Hkv * hd).contiguous().view({T, Hkv, hd});
    if (c.qk_norm) {
      q = ops::rms_norm(q, w.q_norm, c.rms_norm_eps);
      k = ops::rms_norm(k, w.k_norm, c.rms_norm_eps);
    }
    q = rotate(q.contiguous().view({T, H, hd}));
    k = rotate(k.contiguous().view({T, Hkv, hd}));
    write_kv(k, v, meta, l);
    at::Tensor attn = attend(q, k, v, meta, l);
    at::Tensor out = ops::linear(attn.reshape({T, H * hd}), w.dense);
    if (w.dense_bias.defined()) out.add_(w.dense_bias);
    h = ops::add_rms_norm_(x, out, w.ff_norm, c.rms_norm_eps);
    const at::Tensor mlp = c.moe_layer(l) ? (T > 0 ? moe(w, h) : at::zeros_like(h)) : swiglu(w.mlp, h);
    if (l + 1 < c.n_layers) {
      h = ops::add_rms_norm_(x, mlp, layers_[l + 1].attn_norm, c.rms_norm_eps);
    } else {
      x.add_(mlp);
    }
  }
  at::Tensor last = b.logit_index.defined() ? x.index_select(0, b.logit_index) : x;
  return ops::linear(ops::rms_norm(last, norm_, c.rms_norm_eps), lm_head_);
}

}  // namespace blockbatch
