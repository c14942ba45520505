// The tensor-level ops the model and the decode loop call: `blockbatch::ops::*` go through the
// dispatcher (CPU, CUDA or Meta chosen by the inputs' dispatch key), so callers are written once
// and run on whichever device their tensors live on. The schemas and the per-backend
// registrations are in csrc/torch/bindings.cpp; the implementations in csrc/ops/{cpu,cuda}/ and
// csrc/ops/meta.cpp (declared in ops/impl.h); the argument checks in ops/checks.h.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <optional>
#include <string>
#include <tuple>

namespace blockbatch {

namespace ops {
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor add_rms_norm_(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, double eps);
at::Tensor silu_mul(const at::Tensor& gate_up);
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight);
// The routed experts of a mixture-of-experts layer: out[t] = sum over slots k of weights[t, k] *
// SwiGLU expert chosen[t, k] of x[t] (gate_up [E, 2m, d], down [E, d, m]). ops/moe.cpp.
at::Tensor moe_experts(const at::Tensor& x, const at::Tensor& chosen, const at::Tensor& weights,
                       const at::Tensor& gate_up, const at::Tensor& down);
// Whether moe_experts on `device` keeps the router's choices on the device, so a CUDA graph can
// record it (CUDA with BLOCKBATCH_MOE_KERNEL=fused); read per call.
bool moe_experts_capturable(c10::Device device);
void rope_(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos_sin);
void kv_write_(const at::Tensor& kv, const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
               const at::Tensor& cu_seqlens, const at::Tensor& kv_rows, int64_t layer,
               const std::optional<at::Tensor>& kv_pages = std::nullopt);
void rope_kv_write_(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                    const at::Tensor& cos_sin, const at::Tensor& kv, const at::Tensor& cu_seqlens,
                    const at::Tensor& kv_rows, int64_t layer, const std::optional<at::Tensor>& kv_pages = std::nullopt);
at::Tensor packed_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_seqlens,
                            const std::optional<at::Tensor>& kv, const std::optional<at::Tensor>& kv_rows,
                            const std::optional<at::Tensor>& cache_lens, int64_t layer, bool attend_fresh,
                            const std::optional<at::Tensor>& kv_pages = std::nullopt,
                            const std::optional<at::Tensor>& key_index = std::nullopt,
                            const std::optional<at::Tensor>& key_offsets = std::nullopt);
std::tuple<at::Tensor, at::Tensor> confidence(const at::Tensor& logits, int64_t exclude);
std::tuple<at::Tensor, at::Tensor> sparse_probs(const at::Tensor& logits, double floor, int64_t max_k);
at::Tensor commit_(const at::Tensor& canvas, const at::Tensor& window, const at::Tensor& token, const at::Tensor& conf,
                   const at::Tensor& k, int64_t mask_id, int64_t eos_id, const std::string& rule, double threshold,
                   double factor);
// BlockBatch bookkeeping on the canvas' device (ops/cpu/branches.cpp, ops/cuda/branches.cpp, kernels/branches.h).
void bb_absorb_(const at::Tensor& canvas, const at::Tensor& state, const at::Tensor& eos_prob,
                const at::Tensor& map_ids, const at::Tensor& map_probs, const at::Tensor& spans,
                const at::Tensor& token, const at::Tensor& conf, const at::Tensor& ids, const at::Tensor& probs,
                const at::Tensor& logits, int64_t prompt_len, int64_t mask_id, int64_t eos_id, double threshold,
                bool stop_on_eos);
void bb_coordinate_(const at::Tensor& canvas, const at::Tensor& state, const at::Tensor& eos_prob,
                    const at::Tensor& flags, const at::Tensor& sync_src, const at::Tensor& map_ids,
                    const at::Tensor& map_probs, int64_t prompt_len, int64_t mask_id, double merge_gate, bool merge,
                    bool sync, int64_t sync_gap, int64_t refresh_tokens, bool periodic_refresh);
void kv_copy_rows_(const at::Tensor& kv, const at::Tensor& src,
                   const std::optional<at::Tensor>& kv_pages = std::nullopt);
}  // namespace ops

}  // namespace blockbatch
