// Meta (shape-only) implementations: let the ops run under FakeTensor and torch.compile.
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include "ops/checks.h"
#include "ops/impl.h"

namespace blockbatch {

at::Tensor rms_norm_meta(const at::Tensor& x, const at::Tensor& weight, double) {
  check_rms_norm(x, weight);
  return at::empty({x.size(0), x.size(1)}, x.options());
}

at::Tensor add_rms_norm_meta(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, double) {
  check_add_rms_norm(x, delta, weight);
  return at::empty({x.size(0), x.size(1)}, x.options());
}

at::Tensor silu_mul_meta(const at::Tensor& gate_up) {
  check_silu_mul(gate_up);
  return at::empty({gate_up.size(0), gate_up.size(1) / 2}, gate_up.options());
}

at::Tensor linear_meta(const at::Tensor& x, const at::Tensor& weight) {
  check_linear(x, weight);
  return at::empty({x.size(0), weight.size(0)}, x.options());
}

at::Tensor moe_experts_meta(const at::Tensor& x, const at::Tensor& chosen, const at::Tensor& weights,
                            const at::Tensor& gate_up, const at::Tensor& down) {
  check_moe_experts(x, chosen, weights, gate_up, down);
  return at::empty({x.size(0), x.size(1)}, x.options());
}

void rope_meta(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos_sin) {
  check_rope(x, positions, cos_sin);
}

void rope_kv_write_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                        const at::Tensor& cos_sin, const at::Tensor& kv, const at::Tensor& cu_seqlens,
                        const at::Tensor& kv_rows, int64_t layer, const std::optional<at::Tensor>& kv_pages) {
  check_rope_kv_write(q, k, v, positions, cos_sin, kv, cu_seqlens, kv_rows, layer, kv_pages);
}

void kv_write_meta(const at::Tensor& kv, const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                   const at::Tensor& cu_seqlens, const at::Tensor& kv_rows, int64_t layer,
                   const std::optional<at::Tensor>& kv_pages) {
  check_kv_write(kv, k, v, positions, cu_seqlens, kv_rows, layer, kv_pages);
}

at::Tensor packed_attention_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& cu_seqlens, const std::optional<at::Tensor>& kv,
                                 const std::optional<at::Tensor>& kv_rows, const std::optional<at::Tensor>& cache_lens,
                                 int64_t layer, bool, const std::optional<at::Tensor>& kv_pages,
                                 const std::optional<at::Tensor>& key_index,
                                 const std::optional<at::Tensor>& key_offsets) {
  check_packed_attention(q, k, v, cu_seqlens, kv, kv_rows, cache_lens, layer, kv_pages, key_index, key_offsets);
  return at::empty({q.size(0), q.size(1) * q.size(2)}, q.options());
}

std::tuple<at::Tensor, at::Tensor> confidence_meta(const at::Tensor& logits, int64_t) {
  TORCH_CHECK(logits.dim() == 2, "logits must be [rows, vocab], got shape ", logits.sizes());
  return {at::empty({logits.size(0)}, logits.options().dtype(at::kLong)),
          at::empty({logits.size(0)}, logits.options().dtype(at::kDouble))};
}

std::tuple<at::Tensor, at::Tensor> sparse_probs_meta(const at::Tensor& logits, double, int64_t max_k) {
  check_logits(logits);
  return {at::empty({logits.size(0), max_k}, logits.options().dtype(at::kLong)),
          at::empty({logits.size(0), max_k}, logits.options().dtype(at::kDouble))};
}

at::Tensor commit_meta(const at::Tensor& canvas, const at::Tensor& window, const at::Tensor& token,
                       const at::Tensor& conf, const at::Tensor& k, int64_t, int64_t, const std::string& rule, double,
                       double) {
  check_commit(canvas, window, token, conf, k, rule);
  return at::empty({3}, canvas.options());
}

void bb_absorb_meta(const at::Tensor& canvas, const at::Tensor& state, const at::Tensor& eos_prob,
                    const at::Tensor& map_ids, const at::Tensor& map_probs, const at::Tensor& spans,
                    const at::Tensor& token, const at::Tensor& conf, const at::Tensor& ids, const at::Tensor& probs,
                    const at::Tensor& logits, int64_t prompt_len, int64_t, int64_t, double, bool) {
  check_absorb(check_branches(canvas, state, eos_prob, map_ids, map_probs, prompt_len), canvas, spans, token, conf, ids,
               probs, logits);
}

void bb_coordinate_meta(const at::Tensor& canvas, const at::Tensor& state, const at::Tensor& eos_prob,
                        const at::Tensor& flags, const at::Tensor& sync_src, const at::Tensor& map_ids,
                        const at::Tensor& map_probs, int64_t prompt_len, int64_t, double, bool, bool, int64_t, int64_t,
                        bool) {
  check_coordinate(check_branches(canvas, state, eos_prob, map_ids, map_probs, prompt_len), canvas, flags, sync_src);
}

void kv_copy_rows_meta(const at::Tensor& kv, const at::Tensor& src, const std::optional<at::Tensor>& kv_pages) {
  check_kv_copy_rows(kv, src, kv_pages);
}

}  // namespace blockbatch
