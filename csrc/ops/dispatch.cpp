// blockbatch::ops::* — call the registered ops through the dispatcher, so the model and the
// decode loop are written once and run on whichever device their tensors live on.
#include <ATen/core/dispatch/Dispatcher.h>

#include "ops/ops.h"

namespace blockbatch::ops {

namespace {
template <typename Sig>
c10::TypedOperatorHandle<Sig> handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Sig>();
}
}  // namespace

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  static auto op = handle<at::Tensor(const at::Tensor&, const at::Tensor&, double)>("blockbatch::rms_norm");
  return op.call(x, weight, eps);
}

at::Tensor add_rms_norm_(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, double eps) {
  static auto op =
      handle<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, double)>("blockbatch::add_rms_norm_");
  return op.call(x, delta, weight, eps);
}

at::Tensor silu_mul(const at::Tensor& gate_up) {
  static auto op = handle<at::Tensor(const at::Tensor&)>("blockbatch::silu_mul");
  return op.call(gate_up);
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight) {
  static auto op = handle<at::Tensor(const at::Tensor&, const at::Tensor&)>("blockbatch::linear");
  return op.call(x, weight);
}

at::Tensor moe_experts(const at::Tensor& x, const at::Tensor& chosen, const at::Tensor& weights,
                       const at::Tensor& gate_up, const at::Tensor& down) {
  using T = const at::Tensor&;
  static auto op = handle<at::Tensor(T, T, T, T, T)>("blockbatch::moe_experts");
  return op.call(x, chosen, weights, gate_up, down);
}

void rope_(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos_sin) {
  static auto op = handle<void(const at::Tensor&, const at::Tensor&, const at::Tensor&)>("blockbatch::rope_");
  op.call(x, positions, cos_sin);
}

void kv_write_(const at::Tensor& kv, const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
               const at::Tensor& cu_seqlens, const at::Tensor& kv_rows, int64_t layer,
               const std::optional<at::Tensor>& kv_pages) {
  using T = const at::Tensor&;
  using P = const std::optional<at::Tensor>&;
  static auto op = handle<void(T, T, T, T, T, T, int64_t, P)>("blockbatch::kv_write_");
  op.call(kv, k, v, positions, cu_seqlens, kv_rows, layer, kv_pages);
}

void rope_kv_write_(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                    const at::Tensor& cos_sin, const at::Tensor& kv, const at::Tensor& cu_seqlens,
                    const at::Tensor& kv_rows, int64_t layer, const std::optional<at::Tensor>& kv_pages) {
  using T = const at::Tensor&;
  using P = const std::optional<at::Tensor>&;
  static auto op = handle<void(T, T, T, T, T, T, T, T, int64_t, P)>("blockbatch::rope_kv_write_");
  op.call(q, k, v, positions, cos_sin, kv, cu_seqlens, kv_rows, layer, kv_pages);
}

at::Tensor packed_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_seqlens,
                            const std::optional<at::Tensor>& kv, const std::optional<at::Tensor>& kv_rows,
                            const std::optional<at::Tensor>& cache_lens, int64_t layer, bool attend_fresh,
                            const std::optional<at::Tensor>& kv_pages, const std::optional<at::Tensor>& key_index,
                            const std::optional<at::Tensor>& key_offsets) {
  using T = const at::Tensor&;
  using P = const std::optional<at::Tensor>&;
  static auto op = handle<at::Tensor(T, T, T, T, P, P, P, int64_t, bool, P, P, P)>("blockbatch::packed_attention");
  return op.call(q, k, v, cu_seqlens, kv, kv_rows, cache_lens, layer, attend_fresh, kv_pages, key_index, key_offsets);
}

std::tuple<at::Tensor, at::Tensor> confidence(const at::Tensor& logits, int64_t exclude) {
  static auto op = handle<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, int64_t)>("blockbatch::confidence");
  return op.call(logits, exclude);
}

std::tuple<at::Tensor, at::Tensor> sparse_probs(const at::Tensor& logits, double floor, int64_t max_k) {
  static auto op =
      handle<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, double, int64_t)>("blockbatch::sparse_probs");
  return op.call(logits, floor, max_k);
}

at::Tensor commit_(const at::Tensor& canvas, const at::Tensor& window, const at::Tensor& token, const at::Tensor& conf,
                   const at::Tensor& k, int64_t mask_id, int64_t eos_id, const std::string& rule, double threshold,
                   double factor) {
  static auto op =
      handle<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                        int64_t, int64_t, const std::string&, double, double)>("blockbatch::commit_");
  return op.call(canvas, window, token, conf, k, mask_id, eos_id, rule, threshold, factor);
}

void bb_absorb_(const at::Tensor& canvas, const at::Tensor& state, const at::Tensor& eos_prob,
                const at::Tensor& map_ids, const at::Tensor& map_probs, const at::Tensor& spans,
                const at::Tensor& token, const at::Tensor& conf, const at::Tensor& ids, const at::Tensor& probs,
                const at::Tensor& logits, int64_t prompt_len, int64_t mask_id, int64_t eos_id, double threshold,
                bool stop_on_eos) {
  using T = const at::Tensor&;
  static auto op =
      handle<void(T, T, T, T, T, T, T, T, T, T, T, int64_t, int64_t, int64_t, double, bool)>("blockbatch::bb_absorb_");
  op.call(canvas, state, eos_prob, map_ids, map_probs, spans, token, conf, ids, probs, logits, prompt_len, mask_id,
          eos_id, threshold, stop_on_eos);
}

void bb_coordinate_(const at::Tensor& canvas, const at::Tensor& state, const at::Tensor& eos_prob,
                    const at::Tensor& flags, const at::Tensor& sync_src, const at::Tensor& map_ids,
                    const at::Tensor& map_probs, int64_t prompt_len, int64_t mask_id, double merge_gate, bool merge,
                    bool sync, int64_t sync_gap, int64_t refresh_tokens, bool periodic_refresh) {
  using T = const at::Tensor&;
  static auto op = handle<void(T, T, T, T, T, T, T, int64_t, int64_t, double, bool, bool, int64_t, int64_t, bool)>(
      "blockbatch::bb_coordinate_");
  op.call(canvas, state, eos_prob, flags, sync_src, map_ids, map_probs, prompt_len, mask_id, merge_gate, merge, sync,
          sync_gap, refresh_tokens, periodic_refresh);
}

void kv_copy_rows_(const at::Tensor& kv, const at::Tensor& src, const std::optional<at::Tensor>& kv_pages) {
  static auto op =
      handle<void(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&)>("blockbatch::kv_copy_rows_");
  op.call(kv, src, kv_pages);
}

}  // namespace blockbatch::ops
