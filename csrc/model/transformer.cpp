// The native forward of every family (model/transformer.h): norms, GEMMs (ops::linear, ATen's GEMM or the
// weight-streaming CUDA kernel), RoPE, the KV writes and the attention go through the blockbatch ops; the
// MoE router through ATen on the device, the routed experts through ops::moe_experts. It runs on
// whichever device the weights live on.
#include "model/transformer.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/reciprocal.h>
#include <ATen/ops/searchsorted.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <utility>

#include "ops/ops.h"

namespace blockbatch {

namespace {
constexpr int64_t kInitialRopePositions = 4096;  // 2 MB at head_dim 128

at::Tensor swiglu(const SwiGLU& w, const at::Tensor& x) {
  return ops::linear(ops::silu_mul(ops::linear(x, w.gate_up)), w.down);
}
}  // namespace

Transformer::Transformer(ModelConfig config, const std::unordered_map<std::string, at::Tensor>& weights,
                         c10::ScalarType dtype)
    : config_(std::move(config)) {
  config_.validate();
  spec_ = &family_spec(config_.family);
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf,
              "dtype must be float32, bfloat16 or float16, got ", dtype);
  // The config against the weights before anything sized by it is built (the expected-tensor
  // list grows with n_layers and num_experts; the RoPE table below is bounded by validate()).
  const int64_t held = static_cast<int64_t>(weights.size());
  TORCH_CHECK(config_.n_layers <= held, "weights: config key '", config_key(config_.family, "n_layers"),
              "' = ", config_.n_layers, " needs ", config_.tensor_count(), " tensors but the dict holds ", held);
  // A MoE list also grows with num_experts (three tensors an expert in every MoE layer).
  TORCH_CHECK(!spec_->body.moe || config_.tensor_count() <= held, "weights: a ", spec_->name,
              " model with this config needs ", config_.tensor_count(), " tensors but the dict holds ", held);
  const std::optional<c10::Device> device = check_weights(weight_shapes(config_), weights, spec_->name);
  auto w = [&](const std::string& name) { return weights.at(name).to(dtype).contiguous(); };
  const WeightNames& n = spec_->weights;
  auto swiglu_of = [&](const std::string& p) {
    return SwiGLU{at::cat({w(p + n.gate), w(p + n.up)}, 0), w(p + n.down)};
  };
  wte_ = w(n.embed);
  norm_ = w(n.final_norm);
  lm_head_ = (config_.weight_tying ? wte_ : w(n.lm_head)).narrow(0, 0, config_.vocab_size).contiguous();
  layers_.clear();
  for (int64_t i = 0; i < config_.n_layers; ++i) {
    const std::string p = n.layer_prefix + std::to_string(i) + ".";
    Layer l;
    l.attn_norm = w(p + n.attn_norm);
    AttentionPart& a = l.attention;
    if (spec_->body.fused_qkv) {
      a.wqkv = w(p + n.qkv);
      if (config_.attention_bias) a.bqkv = w(p + n.qkv_bias);
    } else {
      a.wqkv = at::cat({w(p + n.q), w(p + n.k), w(p + n.v)}, 0);
      if (config_.attention_bias) a.bqkv = at::cat({w(p + n.q_bias), w(p + n.k_bias), w(p + n.v_bias)}, 0);
    }
    if (config_.qk_norm) {
      a.q_norm = w(p + n.q_norm);
      a.k_norm = w(p + n.k_norm);
    }
    a.out = w(p + n.attn_out);
    if (config_.attn_out_bias) a.out_bias = w(p + n.attn_out_bias);
    l.ff_norm = w(p + n.ff_norm);
    if (config_.moe_layer(i)) {
      // The router in float32 whatever the dtype (the authors' fp32 router logits).
      l.mlp.router = weights.at(p + n.router).to(at::kFloat).contiguous();
      l.mlp.expert_bias = weights.at(p + n.expert_bias).to(at::kFloat).contiguous();
      std::vector<at::Tensor> gate_up, down;
      for (int64_t e = 0; e < config_.num_experts; ++e) {
        SwiGLU expert = swiglu_of(p + n.experts + std::to_string(e) + ".");
        gate_up.push_back(std::move(expert.gate_up));
        down.push_back(std::move(expert.down));
      }
      l.mlp.experts = SwiGLU{at::stack(gate_up), at::stack(down)};
      if (config_.shared_experts > 0) l.mlp.shared = swiglu_of(p + n.shared_experts);
    } else {
      l.mlp.dense = swiglu_of(p + n.dense_mlp);
    }
    layers_.push_back(std::move(l));
  }
  // Inverse frequencies theta^-(2i / r) over the r = rope_dim() rotated dims, in the precision of the
  // family's reference (the table's row p does not depend on its length).
  const int64_t r = config_.rope_dim();
  if (spec_->body.rope_angles == RopeAngles::kFloat64) {
    const auto f64 = at::TensorOptions().dtype(at::kDouble).device(*device);
    rope_->inv_freq = at::reciprocal(at::pow(config_.rope_theta, at::arange(0, r, 2, f64).div(r)));
  } else {
    const auto i64 = at::TensorOptions().dtype(at::kLong).device(*device);
    rope_->inv_freq =
        at::pow(config_.rope_theta, at::arange(0, r, 2, i64).to(at::kFloat).div(static_cast<double>(r))).reciprocal();
  }
  rope_table(std::min<int64_t>(config_.max_sequence_length, kInitialRopePositions));
}

at::Tensor Transformer::rope_table(int64_t positions) const {
  std::lock_guard<std::mutex> lock(rope_->mutex);
  const int64_t have = rope_->table.defined() ? rope_->table.size(0) : 0;
  if (positions <= have) return rope_->table;
  // cos | sin of one angle per frequency, rounded to float32 at the end; doubling bounds the growths.
  const int64_t n = std::min(config_.max_sequence_length, std::max(positions, 2 * have));
  TORCH_CHECK(positions <= n, "positions up to ", positions,
              " exceed max_sequence_length = ", config_.max_sequence_length);
  const at::Tensor& f = rope_->inv_freq;
  const at::Tensor steps = spec_->body.rope_angles == RopeAngles::kFloat64
                               ? at::arange(n, f.options())
                               : at::arange(n, f.options().dtype(at::kLong)).to(at::kFloat);
  const at::Tensor angles = steps.unsqueeze(1).mul(f.unsqueeze(0));
  if (rope_->table.defined()) rope_->retired.push_back(rope_->table);
  rope_->table = at::cat({angles.cos(), angles.sin()}, 1).to(at::kFloat).contiguous();
  return rope_->table;
}

bool Transformer::capturable() const {
  const bool moe = config_.num_experts > 0 && config_.first_dense_layers < config_.n_layers;
  return !moe || ops::moe_experts_capturable(device());
}

at::Tensor Transformer::new_kv(int64_t rows, int64_t length) const {
  return zero_kv(*this, wte_.options(), rows, length);
}

at::Tensor Transformer::head(const at::Tensor& hidden) const { return ops::linear(hidden, lm_head_); }

void Transformer::check(const ForwardBatch& b) const { check_forward_batch(*this, b); }

at::Tensor Transformer::attention(const AttentionPart& w, const at::Tensor& h, const AttnMeta& meta,
                                  const at::Tensor& positions, const at::Tensor& table, int64_t layer) const {
  const ModelConfig& c = config_;
  const int64_t T = h.size(0), hd = c.head_dim(), r = c.rope_dim(), H = c.n_heads, Hkv = c.n_kv_heads;
  at::Tensor qkv = ops::linear(h, w.wqkv);
  if (w.bqkv.defined()) qkv.add_(w.bqkv);  // x W^T + b, rounded as the references do it
  at::Tensor q, k, v;
  if (!w.q_norm.defined() && r == hd) {
    // The whole head rotated, nothing between the projection and RoPE: q, k, v stay views of qkv,
    // rotated (and K/V written) in place.
    q = qkv.narrow(1, 0, H * hd).view({T, H, hd});
    k = qkv.narrow(1, H * hd, Hkv * hd).view({T, Hkv, hd});
    v = qkv.narrow(1, (H + Hkv) * hd, Hkv * hd).view({T, Hkv, hd});
    if (meta.write) {  // rotate q and k and fill the fresh K/V slots in one pass
      ops::rope_kv_write_(q, k, v, meta.positions, table, meta.kv, meta.cu_seqlens, meta.kv_rows, layer,
                          meta.write_pages);
    } else {
      ops::rope_(q, positions, table);
      ops::rope_(k, positions, table);
    }
  } else {
    q = qkv.narrow(1, 0, H * hd).reshape({T * H, hd});
    k = qkv.narrow(1, H * hd, Hkv * hd).reshape({T * Hkv, hd});
    v = qkv.narrow(1, (H + Hkv) * hd, Hkv * hd).contiguous().view({T, Hkv, hd});
    if (w.q_norm.defined()) {
      q = ops::rms_norm(q, w.q_norm, c.rms_norm_eps);
      k = ops::rms_norm(k, w.k_norm, c.rms_norm_eps);
    }
    auto rotate = [&](at::Tensor t) {  // t: contiguous [T, heads, hd]; RoPE on its first r dims
      if (r == hd) {
        ops::rope_(t, positions, table);
        return t;
      }
      at::Tensor part = t.narrow(2, 0, r).contiguous();
      ops::rope_(part, positions, table);
      t.narrow(2, 0, r).copy_(part);
      return t;
    };
    q = rotate(q.contiguous().view({T, H, hd}));
    k = rotate(k.contiguous().view({T, Hkv, hd}));
    write_kv(k, v, meta, layer);
  }
  if (meta.query_capture.defined()) {  // DUET: the last n tokens' rotated queries of this layer
    const int64_t n = meta.query_capture.size(1);
    meta.query_capture.select(0, layer).copy_(q.view({T, H, hd}).narrow(0, T - n, n));
  }
  at::Tensor out = ops::linear(attend(q, k, v, meta, layer), w.out);
  if (w.out_bias.defined()) out.add_(w.out_bias);
  return out;
}

at::Tensor Transformer::moe(const MlpPart& w, const at::Tensor& x) const {
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

at::Tensor Transformer::mlp(const MlpPart& w, const at::Tensor& h, int64_t layer) const {
  if (!config_.moe_layer(layer)) return swiglu(w.dense, h);
  return h.size(0) > 0 ? moe(w, h) : at::zeros_like(h);
}

at::Tensor Transformer::forward(const ForwardBatch& batch) const {
  // Index tensors are read through raw pointers (the value checks, the kernels): any strided view
  // (base[::2], an expand()) is made contiguous first. A no-op for the decode loop's own buffers.
  const ForwardBatch b = contiguous_indices(batch);
  check(b);
  const ModelConfig& c = config_;
  const int64_t T = b.tokens.size(0);
  // A bound on the positions, for the RoPE table: the caller's, else the KV length (positions
  // index it), else read from the positions (a device sync off the CPU; the decode loops say it).
  int64_t positions = b.max_positions;
  if (positions <= 0) positions = b.kv.defined() ? b.kv_length() : (T > 0 ? b.positions.max().item<int64_t>() + 1 : 1);
  const at::Tensor table = rope_table(positions);
  AttnMeta meta = attention_meta(b);  // once per forward (again after a row pruning): every layer attends through it
  at::Tensor pos = b.positions;
  at::Tensor kept;  // defined once rows were pruned: the tokens x holds, of [0, T)

  // Each residual add is fused with the RMSNorm after it (add_rms_norm_): x += attention output,
  // then ff_norm; x += MLP output, then the next layer's attn_norm. The last MLP add stays plain.
  at::Tensor x = wte_.index_select(0, b.tokens);
  at::Tensor h = ops::rms_norm(x, layers_[0].attn_norm, c.rms_norm_eps);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const Layer& w = layers_[l];
    h = ops::add_rms_norm_(x, attention(w.attention, h, meta, pos, table, l), w.ff_norm, c.rms_norm_eps);
    const at::Tensor out = mlp(w.mlp, h, l);
    if (l + 1 < c.n_layers) {
      h = ops::add_rms_norm_(x, out, layers_[l + 1].attn_norm, c.rms_norm_eps);
    } else {
      x.add_(out);
    }
    if (l == b.row_keep_layer && b.row_keep) {  // DUET: the deeper layers run the kept tokens only
      kept = b.row_keep(x);
      if (kept.defined()) {
        TORCH_CHECK(
            kept.dim() == 1 && kept.scalar_type() == at::kLong && kept.device() == device() && kept.size(0) <= T,
            "row_keep must return int64 token indices [n <= tokens] on the model's device");
        kept = kept.contiguous();
        x = x.index_select(0, kept);
        h = h.index_select(0, kept);
        ForwardBatch pruned = b;
        pruned.tokens = b.tokens.index_select(0, kept);
        pruned.positions = pos = b.positions.index_select(0, kept);
        pruned.cu_seqlens = at::searchsorted(kept, b.cu_seqlens);  // each row keeps its own kept tokens
        meta = attention_meta(pruned);
      }
    }
  }
  if (kept.defined()) {  // a dropped token's logits are zeros (uniform)
    const at::Tensor logits = ops::linear(ops::rms_norm(x, norm_, c.rms_norm_eps), lm_head_);
    at::Tensor all = at::zeros({T, logits.size(1)}, logits.options()).index_copy_(0, kept, logits);
    return b.logit_index.defined() ? all.index_select(0, b.logit_index) : all;
  }
  at::Tensor last = b.logit_index.defined() ? x.index_select(0, b.logit_index) : x;
  return ops::linear(ops::rms_norm(last, norm_, c.rms_norm_eps), lm_head_);
}

}  // namespace blockbatch
