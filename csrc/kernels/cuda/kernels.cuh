// CUDA kernels of the native forward: raw pointers, sizes and a stream; no torch headers.
// Launchers return cudaError_t; csrc/ops/cuda/*.cpp turn errors into TORCH_CHECKs.
// These are the straightforward reference kernels (correct for any shape); the tuned
// attention/decode kernels of the CUDA backend build on the same interfaces.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/branches.h"     // View, AbsorbParams, CoordinateParams (plain structs)
#include "kernels/cpu/kernels.h"  // KvGeometry, AttentionArgs (plain structs)

namespace blockbatch::cuda {

// T is float, __nv_bfloat16 or __half (see the explicit instantiations in each .cu file).
template <typename T>
cudaError_t rms_norm(const T* x, int64_t x_stride, const T* w, T* out, int64_t rows, int64_t dim, float eps,
                     cudaStream_t stream);
// x += delta (x, delta [rows, dim] contiguous; rounded to T), then out = rms_norm(x).
template <typename T>
cudaError_t add_rms_norm(T* x, const T* delta, const T* w, T* out, int64_t rows, int64_t dim, float eps,
                         cudaStream_t stream);
template <typename T>
cudaError_t silu_mul(const T* gate_up, T* out, int64_t rows, int64_t m, cudaStream_t stream);
template <typename T>
cudaError_t rope_inplace(T* x, int64_t tokens, int64_t row_stride, int64_t heads, int64_t head_dim,
                         const int64_t* positions, const float* cos_sin, int64_t max_positions, cudaStream_t stream);
template <typename T>
cudaError_t kv_write(T* kv, const cpu::KvGeometry& g, int64_t layer, const T* k, const T* v, int64_t src_stride,
                     const int64_t* positions, const int64_t* cu_seqlens, const int64_t* kv_rows, int64_t rows,
                     int64_t tokens, cudaStream_t stream);
// rope_inplace on q [tokens, heads, head_dim] and k, then kv_write of the rotated k and v (k and v
// share kv_stride), in one kernel; bit-identical to the two calls. `vectorized`: 16 bytes per
// access where the head_dim, strides and pointers allow it (same bits), else element pairs.
template <typename T>
cudaError_t rope_kv_write(T* q, int64_t q_stride, int64_t heads, T* k, const T* v, int64_t kv_stride,
                          const int64_t* positions, const float* cos_sin, int64_t max_positions, T* kv,
                          const cpu::KvGeometry& g, int64_t layer, const int64_t* cu_seqlens, const int64_t* kv_rows,
                          int64_t rows, int64_t tokens, bool vectorized, cudaStream_t stream);
// a.cu_seqlens, a.kv_rows, a.cache_lens are device pointers; `tokens` = cu_seqlens[rows];
// max_keys bounds every row's key count (sizes the shared score buffer).
template <typename T>
cudaError_t packed_attention(const cpu::AttentionArgs& a, int64_t tokens, int64_t max_keys, cudaStream_t stream);
// Tensor-core attention (bf16 / fp16, head_dim 64 or 128, sm_80+; flash_attention.cu, flash_common.cuh) for the
// same arguments. `supported` says whether it applies (dtype, head_dim, 16-byte alignment of the
// pointers and strides, compute capability); otherwise packed_attention above is used.
bool flash_attention_supported(const cpu::AttentionArgs& a, int dtype_code, int sm_major);  // dtype_code 0 = fp32
// Key splits for a launch (1: none): enough to give the GPU two waves of blocks when the q-tiles
// x heads are few and rows hold >= 256 keys (max_keys bounds every row's key count).
int flash_attention_splits(const cpu::AttentionArgs& a, int64_t tokens, int64_t max_keys, int sm_count);
// splits > 1 needs `part`: fp32 workspace of splits * tokens * heads * (head_dim + 2) floats.
// variant: 1 the kernel staging K/V tiles through registers; 2 or 3 the kernels whose K/V tiles go
// through 2 or 3 cp.async stages (same results, bit for bit).
template <typename T>
cudaError_t flash_attention(const cpu::AttentionArgs& a, int64_t tokens, int splits, float* part, int variant,
                            cudaStream_t stream);
template <typename T>
cudaError_t confidence(const T* logits, int64_t rows, int64_t vocab, int64_t exclude, int64_t* argmax, double* conf,
                       cudaStream_t stream);

// The routed experts of a mixture-of-experts layer (moe.cu): for every token t and slot k whose
// expert e = chosen[t * slots + k] is in [0, experts), the SwiGLU expert e of x[t] (gate_up:
// [experts, 2m, d], gate rows first; down: [experts, d, m]), and out[t] = the weights[t, k]-weighted
// sum of them. x, out: [tokens, d]; chosen, weights: [tokens, slots]; hidden [tokens * slots, m] and
// expert_out [tokens * slots, d]: workspace. Everything on the device; no host sync.
template <typename T>
cudaError_t moe_experts(const T* x, const int64_t* chosen, const float* weights, const T* gate_up, const T* down,
                        T* hidden, T* expert_out, T* out, int64_t tokens, int64_t slots, int64_t experts, int64_t d,
                        int64_t m, cudaStream_t stream);

// Tokens with softmax probability > floor per row (ids padded with -1; order within a row is
// unspecified: the probability map is keyed by token).
template <typename T>
cudaError_t sparse_probs(const T* logits, int64_t rows, int64_t vocab, double floor, int64_t max_k, int64_t* ids,
                         double* probs, cudaStream_t stream);

// One commit-rule step over `window` (n <= 4096 positions) of the device canvas (`length` ids;
// window positions outside it are skipped); rule 0 threshold, 1 fixed (k[0] tokens, read on the
// device), 2 factor. counts[3] = committed, masks left, eos seen.
cudaError_t commit(int64_t* canvas, int64_t length, const int64_t* window, const int64_t* token, const double* conf,
                   const int64_t* k, int64_t n, int64_t mask_id, int64_t eos_id, int rule, double tau, double factor,
                   int64_t* counts, cudaStream_t stream);

// BlockBatch bookkeeping (branches.cu; every pointer in `v` and the arguments is on the device):
// absorb one block per span, coordinate in one block, and the sync's KV row copies.
template <typename T>
cudaError_t bb_absorb(const branches::View& v, const int64_t* spans, int64_t n_spans, const int64_t* token,
                      const double* conf, const int64_t* ids, const double* probs, const T* logits, int64_t vocab,
                      const branches::AbsorbParams& p, cudaStream_t stream);
cudaError_t bb_coordinate(const branches::View& v, int64_t* flags, int64_t* sync_src,
                          const branches::CoordinateParams& p, cudaStream_t stream);
// kv_copy_rows_: the pages of row src[r] into row r's for every r with src[r] in [0, rows), r
// itself excluded, pages both rows share skipped; page_bytes per page.
cudaError_t kv_copy_rows(void* kv, const int64_t* src, int64_t rows, int64_t page_bytes, const cpu::KvPages& pages,
                         cudaStream_t stream);

}  // namespace blockbatch::cuda
