// Tensor-level kernel ops. `blockbatch::ops::*` call through the dispatcher (CPU, CUDA or Meta
// chosen by the inputs' dispatch key); `*_cpu` / `*_meta` are the registered implementations.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <tuple>

#include "kernels/branches.h"
#include "kernels/cpu/kernels.h"

// CPU dispatch over the float dtypes the ops accept: float32, bfloat16 and float16 (the checks
// refuse every other dtype). Needs <ATen/Dispatch.h>.
#define BLOCKBATCH_DISPATCH_FLOATING(TYPE, NAME, ...)                     \
  AT_DISPATCH_SWITCH(TYPE, NAME, AT_DISPATCH_CASE(at::kFloat, __VA_ARGS__) \
                         AT_DISPATCH_CASE(at::kBFloat16, __VA_ARGS__)     \
                             AT_DISPATCH_CASE(at::kHalf, __VA_ARGS__))

namespace blockbatch {

namespace ops {
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor add_rms_norm_(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, double eps);
at::Tensor silu_mul(const at::Tensor& gate_up);
at::Tensor linear(const at::Tensor& x, const at::Tensor& weight);
void rope_(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos_sin);
void rope_kv_write_(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                    const at::Tensor& cos_sin, const at::Tensor& kv, const at::Tensor& cu_seqlens,
                    const at::Tensor& kv_rows, int64_t layer);
at::Tensor packed_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& cu_seqlens, const std::optional<at::Tensor>& kv,
                            const std::optional<at::Tensor>& kv_rows, const std::optional<at::Tensor>& cache_lens,
                            int64_t layer, bool attend_fresh);
std::tuple<at::Tensor, at::Tensor> confidence(const at::Tensor& logits, int64_t exclude);
std::tuple<at::Tensor, at::Tensor> sparse_probs(const at::Tensor& logits, double floor, int64_t max_k);
at::Tensor commit_(const at::Tensor& canvas, const at::Tensor& window, const at::Tensor& token, const at::Tensor& conf,
                   const at::Tensor& k, int64_t mask_id, int64_t eos_id, const std::string& rule, double threshold,
                   double factor);
// BlockBatch bookkeeping on the canvas' device (torch/branches_op.cpp, kernels/branches.h).
void bb_absorb_(const at::Tensor& canvas, const at::Tensor& state, const at::Tensor& eos_prob,
                const at::Tensor& map_ids, const at::Tensor& map_probs, const at::Tensor& spans,
                const at::Tensor& token, const at::Tensor& conf, const at::Tensor& ids, const at::Tensor& probs,
                const at::Tensor& logits, int64_t prompt_len, int64_t mask_id, int64_t eos_id, double threshold,
                bool stop_on_eos);
void bb_coordinate_(const at::Tensor& canvas, const at::Tensor& state, const at::Tensor& eos_prob,
                    const at::Tensor& flags, const at::Tensor& sync_src, const at::Tensor& map_ids,
                    const at::Tensor& map_probs, int64_t prompt_len, int64_t mask_id, double merge_gate, bool merge,
                    bool sync, int64_t sync_gap, int64_t refresh_tokens, bool periodic_refresh);
void kv_copy_rows_(const at::Tensor& kv, const at::Tensor& src);
}  // namespace ops

// Shapes of a request's bookkeeping tensors (checked by check_branches for every backend).
struct BranchTensors {
  int64_t B, L, K;
};
BranchTensors check_branches(const at::Tensor& canvas, const at::Tensor& state, const at::Tensor& eos_prob,
                             const at::Tensor& map_ids, const at::Tensor& map_probs, int64_t prompt_len);
void check_absorb(const BranchTensors& d, const at::Tensor& canvas, const at::Tensor& spans, const at::Tensor& token,
                  const at::Tensor& conf, const at::Tensor& ids, const at::Tensor& probs, const at::Tensor& logits);
void check_coordinate(const BranchTensors& d, const at::Tensor& canvas, const at::Tensor& flags,
                      const at::Tensor& sync_src);
void check_kv_copy_rows(const at::Tensor& kv, const at::Tensor& src);
// Values the bookkeeping kernels check on the device (and skip), checked on the host by the CPU ops.
void check_eos_id(int64_t eos_id, int64_t vocab);
void check_window(const branches::View& v, int64_t b);
branches::View branch_view(const at::Tensor& canvas, const at::Tensor& state, const at::Tensor& eos_prob,
                           const at::Tensor& map_ids, const at::Tensor& map_probs, int64_t prompt_len,
                           int64_t mask_id, int64_t eos_id);

// commit_ windows hold at most this many positions (the CUDA kernel keeps them in shared memory).
constexpr int64_t kMaxCommitWindow = 4096;
void check_commit(const at::Tensor& canvas, const at::Tensor& window, const at::Tensor& token, const at::Tensor& conf,
                  const at::Tensor& k, const std::string& rule);

at::Tensor rms_norm_cpu(const at::Tensor& x, const at::Tensor& weight, double eps);
at::Tensor add_rms_norm_cpu(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, double eps);
at::Tensor silu_mul_cpu(const at::Tensor& gate_up);
at::Tensor linear_cpu(const at::Tensor& x, const at::Tensor& weight);
void rope_cpu(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos_sin);
void kv_write_cpu(const at::Tensor& kv, const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                  const at::Tensor& cu_seqlens, const at::Tensor& kv_rows, int64_t layer);
void rope_kv_write_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                       const at::Tensor& cos_sin, const at::Tensor& kv, const at::Tensor& cu_seqlens,
                       const at::Tensor& kv_rows, int64_t layer);
at::Tensor packed_attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& cu_seqlens, const std::optional<at::Tensor>& kv,
                                const std::optional<at::Tensor>& kv_rows, const std::optional<at::Tensor>& cache_lens,
                                int64_t layer, bool attend_fresh);
std::tuple<at::Tensor, at::Tensor> confidence_cpu(const at::Tensor& logits, int64_t exclude);
std::tuple<at::Tensor, at::Tensor> sparse_probs_cpu(const at::Tensor& logits, double floor, int64_t max_k);

// Shape checks shared by every backend (CPU, CUDA, Meta): throw naming the argument.
void check_logits(const at::Tensor& logits);
// sparse_probs: max_k at most max(vocab, kMaxSparseSlots) (a map needs 1 / floor + 1 <= 101).
constexpr int64_t kMaxSparseSlots = 1024;
void check_sparse_probs(const at::Tensor& logits, double floor, int64_t max_k);
// Pointer-and-size arguments of the attention kernels (CPU and CUDA) for checked tensors;
// `out` is the [T, heads * head_dim] output.
cpu::AttentionArgs attention_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& cu_seqlens, const std::optional<at::Tensor>& kv,
                                  const std::optional<at::Tensor>& kv_rows,
                                  const std::optional<at::Tensor>& cache_lens, int64_t layer, bool attend_fresh,
                                  const at::Tensor& out);
void check_rms_norm(const at::Tensor& x, const at::Tensor& weight);
void check_add_rms_norm(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight);
void check_silu_mul(const at::Tensor& gate_up);
void check_linear(const at::Tensor& x, const at::Tensor& weight);
void check_rope(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos_sin);
void check_kv_write(const at::Tensor& kv, const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                    const at::Tensor& cu_seqlens, const at::Tensor& kv_rows, int64_t layer);
void check_rope_kv_write(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                         const at::Tensor& cos_sin, const at::Tensor& kv, const at::Tensor& cu_seqlens,
                         const at::Tensor& kv_rows, int64_t layer);
void check_packed_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& cu_seqlens, const std::optional<at::Tensor>& kv,
                            const std::optional<at::Tensor>& kv_rows, const std::optional<at::Tensor>& cache_lens,
                            int64_t layer);

}  // namespace blockbatch
