// The per-backend implementations of the tensor-level ops, registered by csrc/torch/bindings.cpp:
// `*_cpu` (ops/cpu/), `*_meta` (ops/meta.cpp: shapes only, for FakeTensor / torch.compile) and,
// in a CUDA build, `*_cuda` (ops/cuda/). Each checks its arguments (ops/checks.h), then runs.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <tuple>

// CPU dispatch over the float dtypes the ops accept: float32, bfloat16 and float16 (the checks
// refuse every other dtype). Needs <ATen/Dispatch.h>.
#define BLOCKBATCH_DISPATCH_FLOATING(TYPE, NAME, ...)                                                       \
  AT_DISPATCH_SWITCH(TYPE, NAME,                                                                            \
                     AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__) AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__) \
                         AT_DISPATCH_CASE(at::kHalf, __VA_ARGS__))

namespace blockbatch {

// CPU (ops/cpu/forward_ops.cpp, commit.cpp, branches.cpp): also check the values the kernels index by.
at::Tensor rms_norm_cpu(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor add_rms_norm_cpu(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, double eps);
at::Tensor silu_mul_cpu(const at::Tensor& gate_up);
at::Tensor linear_cpu(const at::Tensor& x, const at::Tensor& weight);
at::Tensor moe_experts_cpu(const at::Tensor& x, const at::Tensor& chosen, const at::Tensor& weights,
                           const at::Tensor& gate_up, const at::Tensor& down);
// moe_experts on any device through ATen and blockbatch::ops (the choices read on the host): the
// CPU op, and the CUDA op unless its fused kernel is chosen (ops/moe.cpp).
at::Tensor moe_experts_grouped(const at::Tensor& x, const at::Tensor& chosen, const at::Tensor& weights,
                               const at::Tensor& gate_up, const at::Tensor& down);
void rope_cpu(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos_sin);
void kv_write_cpu(const at::Tensor& kv, const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                  const at::Tensor& cu_seqlens, const at::Tensor& kv_rows, int64_t layer,
                  const std::optional<at::Tensor>& kv_pages);
void rope_kv_write_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                       const at::Tensor& cos_sin, const at::Tensor& kv, const at::Tensor& cu_seqlens,
                       const at::Tensor& kv_rows, int64_t layer, const std::optional<at::Tensor>& kv_pages);
at::Tensor packed_attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& cu_seqlens, const std::optional<at::Tensor>& kv,
                                const std::optional<at::Tensor>& kv_rows, const std::optional<at::Tensor>& cache_lens,
                                int64_t layer, bool attend_fresh, const std::optional<at::Tensor>& kv_pages,
                                const std::optional<at::Tensor>& key_index,
                                const std::optional<at::Tensor>& key_offsets);
std::tuple<at::Tensor, at::Tensor> confidence_cpu(const at::Tensor& logits, int64_t exclude);
std::tuple<at::Tensor, at::Tensor> sparse_probs_cpu(const at::Tensor& logits, double floor, int64_t max_k);
at::Tensor commit_cpu(const at::Tensor& canvas, const at::Tensor& window, const at::Tensor& token,
                      const at::Tensor& conf, const at::Tensor& k, int64_t mask_id, int64_t eos_id,
                      const std::string& rule, double threshold, double factor);
void bb_absorb_cpu(const at::Tensor& canvas, const at::Tensor& state, const at::Tensor& eos_prob,
                   const at::Tensor& map_ids, const at::Tensor& map_probs, const at::Tensor& spans,
                   const at::Tensor& token, const at::Tensor& conf, const at::Tensor& ids, const at::Tensor& probs,
                   const at::Tensor& logits, int64_t prompt_len, int64_t mask_id, int64_t eos_id, double threshold,
                   bool stop_on_eos);
void bb_coordinate_cpu(const at::Tensor& canvas, const at::Tensor& state, const at::Tensor& eos_prob,
                       const at::Tensor& flags, const at::Tensor& sync_src, const at::Tensor& map_ids,
                       const at::Tensor& map_probs, int64_t prompt_len, int64_t mask_id, double merge_gate, bool merge,
                       bool sync, int64_t sync_gap, int64_t refresh_tokens, bool periodic_refresh);
void kv_copy_rows_cpu(const at::Tensor& kv, const at::Tensor& src, const std::optional<at::Tensor>& kv_pages);

// Meta (ops/meta.cpp): checks and output shapes only.
at::Tensor rms_norm_meta(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor add_rms_norm_meta(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, double eps);
at::Tensor silu_mul_meta(const at::Tensor& gate_up);
at::Tensor linear_meta(const at::Tensor& x, const at::Tensor& weight);
at::Tensor moe_experts_meta(const at::Tensor& x, const at::Tensor& chosen, const at::Tensor& weights,
                            const at::Tensor& gate_up, const at::Tensor& down);
void rope_meta(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos_sin);
void kv_write_meta(const at::Tensor& kv, const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                   const at::Tensor& cu_seqlens, const at::Tensor& kv_rows, int64_t layer,
                   const std::optional<at::Tensor>& kv_pages);
void rope_kv_write_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                        const at::Tensor& cos_sin, const at::Tensor& kv, const at::Tensor& cu_seqlens,
                        const at::Tensor& kv_rows, int64_t layer, const std::optional<at::Tensor>& kv_pages);
at::Tensor packed_attention_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& cu_seqlens, const std::optional<at::Tensor>& kv,
                                 const std::optional<at::Tensor>& kv_rows, const std::optional<at::Tensor>& cache_lens,
                                 int64_t layer, bool attend_fresh, const std::optional<at::Tensor>& kv_pages,
                                 const std::optional<at::Tensor>& key_index,
                                 const std::optional<at::Tensor>& key_offsets);
std::tuple<at::Tensor, at::Tensor> confidence_meta(const at::Tensor& logits, int64_t exclude);
std::tuple<at::Tensor, at::Tensor> sparse_probs_meta(const at::Tensor& logits, double floor, int64_t max_k);
at::Tensor commit_meta(const at::Tensor& canvas, const at::Tensor& window, const at::Tensor& token,
                       const at::Tensor& conf, const at::Tensor& k, int64_t mask_id, int64_t eos_id,
                       const std::string& rule, double threshold, double factor);
void bb_absorb_meta(const at::Tensor& canvas, const at::Tensor& state, const at::Tensor& eos_prob,
                    const at::Tensor& map_ids, const at::Tensor& map_probs, const at::Tensor& spans,
                    const at::Tensor& token, const at::Tensor& conf, const at::Tensor& ids, const at::Tensor& probs,
                    const at::Tensor& logits, int64_t prompt_len, int64_t mask_id, int64_t eos_id, double threshold,
                    bool stop_on_eos);
void bb_coordinate_meta(const at::Tensor& canvas, const at::Tensor& state, const at::Tensor& eos_prob,
                        const at::Tensor& flags, const at::Tensor& sync_src, const at::Tensor& map_ids,
                        const at::Tensor& map_probs, int64_t prompt_len, int64_t mask_id, double merge_gate, bool merge,
                        bool sync, int64_t sync_gap, int64_t refresh_tokens, bool periodic_refresh);
void kv_copy_rows_meta(const at::Tensor& kv, const at::Tensor& src, const std::optional<at::Tensor>& kv_pages);

#ifdef BLOCKBATCH_WITH_CUDA
// CUDA (ops/cuda/*.cpp): shape checks on the host; values that live on the device are checked
// (and skipped) by the kernels, so a step needs no host sync.
at::Tensor rms_norm_cuda(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor add_rms_norm_cuda(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, double eps);
at::Tensor silu_mul_cuda(const at::Tensor& gate_up);
at::Tensor linear_cuda(const at::Tensor& x, const at::Tensor& weight);
at::Tensor moe_experts_cuda(const at::Tensor& x, const at::Tensor& chosen, const at::Tensor& weights,
                            const at::Tensor& gate_up, const at::Tensor& down);
void rope_cuda(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos_sin);
void kv_write_cuda(const at::Tensor& kv, const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                   const at::Tensor& cu_seqlens, const at::Tensor& kv_rows, int64_t layer,
                   const std::optional<at::Tensor>& kv_pages);
void rope_kv_write_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                        const at::Tensor& cos_sin, const at::Tensor& kv, const at::Tensor& cu_seqlens,
                        const at::Tensor& kv_rows, int64_t layer, const std::optional<at::Tensor>& kv_pages);
at::Tensor packed_attention_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& cu_seqlens, const std::optional<at::Tensor>& kv,
                                 const std::optional<at::Tensor>& kv_rows, const std::optional<at::Tensor>& cache_lens,
                                 int64_t layer, bool attend_fresh, const std::optional<at::Tensor>& kv_pages,
                                 const std::optional<at::Tensor>& key_index,
                                 const std::optional<at::Tensor>& key_offsets);
std::tuple<at::Tensor, at::Tensor> confidence_cuda(const at::Tensor& logits, int64_t exclude);
std::tuple<at::Tensor, at::Tensor> sparse_probs_cuda(const at::Tensor& logits, double floor, int64_t max_k);
at::Tensor commit_cuda(const at::Tensor& canvas, const at::Tensor& window, const at::Tensor& token,
                       const at::Tensor& conf, const at::Tensor& k, int64_t mask_id, int64_t eos_id,
                       const std::string& rule, double threshold, double factor);
void bb_absorb_cuda(const at::Tensor& canvas, const at::Tensor& state, const at::Tensor& eos_prob,
                    const at::Tensor& map_ids, const at::Tensor& map_probs, const at::Tensor& spans,
                    const at::Tensor& token, const at::Tensor& conf, const at::Tensor& ids, const at::Tensor& probs,
                    const at::Tensor& logits, int64_t prompt_len, int64_t mask_id, int64_t eos_id, double threshold,
                    bool stop_on_eos);
void bb_coordinate_cuda(const at::Tensor& canvas, const at::Tensor& state, const at::Tensor& eos_prob,
                        const at::Tensor& flags, const at::Tensor& sync_src, const at::Tensor& map_ids,
                        const at::Tensor& map_probs, int64_t prompt_len, int64_t mask_id, double merge_gate, bool merge,
                        bool sync, int64_t sync_gap, int64_t refresh_tokens, bool periodic_refresh);
void kv_copy_rows_cuda(const at::Tensor& kv, const at::Tensor& src, const std::optional<at::Tensor>& kv_pages);
#endif

}  // namespace blockbatch
