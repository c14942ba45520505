// Argument checks of the tensor-level ops, shared by every backend (CPU, CUDA, Meta): each throws
// naming the argument (shapes, dtypes, devices; the CPU ops also check values, see impl.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

#include "kernels/branches.h"
#include "kernels/cpu/kernels.h"

namespace blockbatch {

// ---- The forward's kernel ops (ops/checks.cpp) ----
void check_logits(const at::Tensor& logits);
// sparse_probs: max_k at most max(vocab, kMaxSparseSlots) (a map needs 1 / floor + 1 <= 101).
constexpr int64_t kMaxSparseSlots = 1024;
void check_sparse_probs(const at::Tensor& logits, double floor, int64_t max_k);
// Pointer-and-size arguments of the attention kernels (CPU and CUDA) for checked tensors;
// `out` is the [T, heads * head_dim] output.
cpu::AttentionArgs attention_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& cu_seqlens, const std::optional<at::Tensor>& kv,
                                  const std::optional<at::Tensor>& kv_rows, const std::optional<at::Tensor>& cache_lens,
                                  int64_t layer, bool attend_fresh, const at::Tensor& out,
                                  const std::optional<at::Tensor>& kv_pages,
                                  const std::optional<at::Tensor>& key_index = std::nullopt,
                                  const std::optional<at::Tensor>& key_offsets = std::nullopt);
// The geometry of a KV buffer (dense: [rows, layers, 2, kv_heads, L, head_dim]) or, with kv_pages
// [rows, L / page_len] int64, of a page store [pages, layers, 2, kv_heads, page_len, head_dim]
// read through that table (kernels/cpu/kernels.h KvGeometry). Checks shapes, dtype and device.
cpu::KvGeometry kv_geometry(const at::Tensor& kv, const std::optional<at::Tensor>& kv_pages);
// CPU values: every page-table entry in [-1, pages); every position [0, lens[r]) of KV row
// kv_rows[r] on a page (a read of "no page" is refused; a write there is dropped).
void check_kv_pages_values(const cpu::KvGeometry& g);
void check_kv_pages_cover(const cpu::KvGeometry& g, const int64_t* kv_rows, const int64_t* lens, int64_t rows);
void check_rms_norm(const at::Tensor& x, const at::Tensor& weight);
void check_add_rms_norm(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight);
void check_silu_mul(const at::Tensor& gate_up);
void check_linear(const at::Tensor& x, const at::Tensor& weight);
// moe_experts: x [T, d]; chosen [T, K] int64; weights [T, K] float32; gate_up [E, 2m, d]; down [E, d, m].
void check_moe_experts(const at::Tensor& x, const at::Tensor& chosen, const at::Tensor& weights,
                       const at::Tensor& gate_up, const at::Tensor& down);
void check_rope(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos_sin);
void check_kv_write(const at::Tensor& kv, const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                    const at::Tensor& cu_seqlens, const at::Tensor& kv_rows, int64_t layer,
                    const std::optional<at::Tensor>& kv_pages);
void check_rope_kv_write(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                         const at::Tensor& cos_sin, const at::Tensor& kv, const at::Tensor& cu_seqlens,
                         const at::Tensor& kv_rows, int64_t layer, const std::optional<at::Tensor>& kv_pages);
void check_packed_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_seqlens,
                            const std::optional<at::Tensor>& kv, const std::optional<at::Tensor>& kv_rows,
                            const std::optional<at::Tensor>& cache_lens, int64_t layer,
                            const std::optional<at::Tensor>& kv_pages,
                            const std::optional<at::Tensor>& key_index = std::nullopt,
                            const std::optional<at::Tensor>& key_offsets = std::nullopt);
// CPU values of gathered key sets (packed_attention's key_offsets / key_index, checked shapes):
// offsets from 0, non-decreasing, ending at key_index's size; each row's positions ascending and
// inside [0, cache_lens[r]); on a page when paged.
void check_key_lists_values(const cpu::AttentionArgs& a, int64_t n_index);

// ---- The decode loop's bookkeeping ops: commit_, bb_absorb_, bb_coordinate_, kv_copy_rows_
// (ops/checks_bookkeeping.cpp) ----
// commit_ windows hold at most this many positions (the CUDA kernel keeps them in shared memory).
constexpr int64_t kMaxCommitWindow = 4096;
void check_commit(const at::Tensor& canvas, const at::Tensor& window, const at::Tensor& token, const at::Tensor& conf,
                  const at::Tensor& k, const std::string& rule);

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
void check_kv_copy_rows(const at::Tensor& kv, const at::Tensor& src, const std::optional<at::Tensor>& kv_pages);
// kv_copy_rows_'s rows as pages of kv (checked): kv_pages' rows, or kv's rows one page each (dense).
cpu::KvPages kv_copy_pages(const at::Tensor& kv, const std::optional<at::Tensor>& kv_pages);
// Values the bookkeeping kernels check on the device (and skip), checked on the host by the CPU ops.
void check_eos_id(int64_t eos_id, int64_t vocab);
void check_window(const branches::View& v, int64_t b);
branches::View branch_view(const at::Tensor& canvas, const at::Tensor& state, const at::Tensor& eos_prob,
                           const at::Tensor& map_ids, const at::Tensor& map_probs, int64_t prompt_len, int64_t mask_id,
                           int64_t eos_id);

}  // namespace blockbatch
