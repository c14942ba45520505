// CPU kernels of the native forward and the decode step: raw pointers and sizes, no tensors.
//
// Every kernel is templated on the storage type T (float, c10::BFloat16, c10::Half) and
// computes in float32 (double where noted). They are the oracle for the CUDA kernels and are
// bound to tensor ops in csrc/ops/cpu/forward_ops.cpp.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define BLOCKBATCH_HOST_DEVICE __host__ __device__
#else
#define BLOCKBATCH_HOST_DEVICE
#endif

namespace blockbatch::cpu {

// out[r, :] = (x[r, :] * rsqrt(mean(x[r, :]^2) + eps)) rounded to T, times w.   x row stride
// `x_stride`, out contiguous [rows, dim].
template <typename T>
void rms_norm(const T* x, int64_t x_stride, const T* w, T* out, int64_t rows, int64_t dim, float eps);

// out[r, i] = silu(gu[r, i]) * gu[r, m + i]; gu is [rows, 2m] (gate | up), out [rows, m].
template <typename T>
void silu_mul(const T* gate_up, T* out, int64_t rows, int64_t m);

// In-place rotate-half RoPE on x[t, h, :] (row stride `row_stride`, heads contiguous by
// head_dim) at positions[t]. cos_sin is [max_pos, head_dim] float: cos in the first half,
// sin in the second half (one value per frequency).
template <typename T>
void rope_inplace(T* x, int64_t tokens, int64_t row_stride, int64_t heads, int64_t head_dim, const int64_t* positions,
                  const float* cos_sin);

// A page table: row r's page i is pages[r * per_row + i], or r itself when pages is null (dense:
// one page a row, per_row 1). Entries outside [0, store) are no page (-1).
struct KvPages {
  const int64_t* pages;
  int64_t per_row, store;
  BLOCKBATCH_HOST_DEVICE int64_t at(int64_t row, int64_t i) const {
    const int64_t p = pages ? pages[row * per_row + i] : row;
    return p >= 0 && p < store ? p : -1;
  }
};

// Geometry of the KV a forward reads and writes: `rows` KV rows of `length` positions, each
// [layers, 2, kv_heads, length, head_dim]; shared with the CUDA kernels.
//   dense (pages == nullptr): one buffer [rows, layers, 2, kv_heads, length, head_dim]; a row is
//     one page of page_len == length positions.
//   paged: a page store [store_pages, layers, 2, kv_heads, page_len, head_dim] and a page table
//     pages [rows, length / page_len] (int64): position p of row r is slot p % page_len of page
//     pages[r, p / page_len]; an entry -1 is no page (a write there is dropped, a read refused by
//     the CPU ops' checks). Rows sharing a page share its K/V (ALGORITHMS.md section 12).
struct KvGeometry {
  int64_t layers, kv_heads, length, head_dim;
  int64_t rows;                    // KV rows (dense: buffers; paged: page-table rows)
  const int64_t* pages = nullptr;  // page table [rows, length / page_len] (device memory on CUDA)
  int64_t page_len = 0;            // positions per page (dense: length)
  int64_t store_pages = 0;         // pages in the store (dense: rows)

  static KvGeometry dense(int64_t layers, int64_t kv_heads, int64_t length, int64_t head_dim, int64_t rows) {
    return {layers, kv_heads, length, head_dim, rows, nullptr, length, rows};
  }
  BLOCKBATCH_HOST_DEVICE int64_t pages_per_row() const { return length / page_len; }
  // The page holding position `pos` of `row` (dense: the row itself); -1: none.
  BLOCKBATCH_HOST_DEVICE int64_t page(int64_t row, int64_t pos) const {
    return pages == nullptr ? row : KvPages{pages, pages_per_row(), store_pages}.at(row, pos / page_len);
  }
  // A slot inside the buffer: GPU kernels skip writes (and reads) of slots outside it, since
  // checking device index tensors on the host would cost a sync (the CPU ops check them).
  BLOCKBATCH_HOST_DEVICE bool slot_ok(int64_t row, int64_t pos) const {
    return row >= 0 && row < rows && pos >= 0 && pos < length && page(row, pos) >= 0;
  }
  // Keys a row may read from its cache: 0 for a row outside the buffer, at most `length`.
  BLOCKBATCH_HOST_DEVICE int64_t cache_keys(int64_t row, int64_t n) const {
    return row < 0 || row >= rows || n < 0 ? 0 : (n < length ? n : length);
  }
  // Elements between one page's start and the next's (dense: a row's).
  BLOCKBATCH_HOST_DEVICE int64_t page_stride() const { return layers * 2 * kv_heads * page_len * head_dim; }
  // The element offset of slot (layer, kind 0 = K | 1 = V, head, pos) of `row`; positions of one
  // page are head_dim apart, the next page anywhere (key_run says how many follow contiguously).
  BLOCKBATCH_HOST_DEVICE int64_t offset(int64_t row, int64_t layer, int64_t kind, int64_t head, int64_t pos) const {
    const int64_t in_page = pages == nullptr ? pos : pos % page_len;
    return (((page(row, pos) * layers + layer) * 2 + kind) * kv_heads + head) * page_len * head_dim +
           in_page * head_dim;
  }
  // A row's (layer, kind, head) slots as a base and per-slot offsets: slot j is at
  // row_base(...) + slot_from_base(row, j). Dense: the row's slot 0 and j * head_dim; paged: the
  // same offset on page 0 and slot j's page's start plus its place in the page (-1: no page).
  BLOCKBATCH_HOST_DEVICE int64_t row_base(int64_t row, int64_t layer, int64_t kind, int64_t head) const {
    return pages == nullptr ? offset(row, layer, kind, head, 0)
                            : ((layer * 2 + kind) * kv_heads + head) * page_len * head_dim;
  }
  BLOCKBATCH_HOST_DEVICE int64_t slot_from_base(int64_t row, int64_t j) const {
    if (pages == nullptr) return j * head_dim;
    const int64_t p = page(row, j);
    return p < 0 ? -1 : p * page_stride() + (j % page_len) * head_dim;
  }
  // How many positions from `pos` on lie contiguously in pos's page (dense: to the row's end).
  BLOCKBATCH_HOST_DEVICE int64_t key_run(int64_t pos) const { return page_len - (pos % page_len); }
};

// Writes fresh k/v [t, kv_heads, head_dim] (row stride `src_stride`) into the KV slots of
// their positions: kv[kv_rows[r], layer, 0|1, h, positions[t], :] for t in row r's range
// [cu_seqlens[r], cu_seqlens[r+1]).
template <typename T>
void kv_write(T* kv, const KvGeometry& g, int64_t layer, const T* k, const T* v, int64_t src_stride,
              const int64_t* positions, const int64_t* cu_seqlens, const int64_t* kv_rows, int64_t rows);

// Packed variable-length bidirectional attention with GQA.
// Row r's queries are tokens [cu_seqlens[r], cu_seqlens[r+1]). Its keys are, in order:
// its cached keys at `layer` (when cache != nullptr): the first cache_lens[r] slots of KV row
// kv_rows[r], or (gathered key sets, key_offsets != nullptr) the slots key_index[key_offsets[r] ..
// key_offsets[r+1]) of that row, ascending; then, when attend_fresh, the row's own fresh k/v.
// A list equal to [0, cache_lens[r]) gives the contiguous row's output bit for bit (the same keys
// in the same order). Query head h reads kv head h / (heads/kv_heads).
struct AttentionArgs {
  const void* q;  // [T, heads, head_dim], row stride q_stride
  const void* k;  // [T, kv_heads, head_dim], row stride kv_stride
  const void* v;
  void* out;  // [T, heads * head_dim] contiguous
  int64_t q_stride, kv_stride;
  const int64_t* cu_seqlens;
  int64_t rows;
  const void* cache;  // KV buffer or nullptr
  KvGeometry geometry;
  int64_t layer;
  const int64_t* kv_rows;
  const int64_t* cache_lens;
  bool attend_fresh;
  int64_t heads, kv_heads, head_dim;
  // Gathered key sets (CSR, optional, with cache): [rows + 1] offsets into key_index (positions
  // of the KV row). The CPU op checks the values; the GPU kernels clamp a row's count to the row
  // length and read a position outside the row as a key without a page (zeros).
  const int64_t* key_offsets = nullptr;
  const int64_t* key_index = nullptr;

  // Row r's list (nullptr: the contiguous range) and its cached key count before clamping.
  BLOCKBATCH_HOST_DEVICE const int64_t* row_keys(int64_t r) const {
    return key_offsets != nullptr ? key_index + key_offsets[r] : nullptr;
  }
  BLOCKBATCH_HOST_DEVICE int64_t row_cache_len(int64_t r) const {
    return key_offsets != nullptr ? key_offsets[r + 1] - key_offsets[r] : cache_lens[r];
  }
};
template <typename T>
void packed_attention(const AttentionArgs& a);

// The instruction set the attention kernel runs with (chosen once, at first use).
enum class CpuCapability { kGeneric, kAvx2, kAvx512 };
CpuCapability cpu_capability();

// Per row of logits [rows, vocab]: argmax over the ids != `exclude` (the mask id: a proposal is
// never the mask itself; -1 excludes nothing), lowest id on ties, and its softmax probability
// over the whole vocabulary, exp(l_x0 - l_max) / sum_j exp(l_j - l_max), summed in double. One
// pass for the max, one for the sum; no probability matrix.
template <typename T>
void confidence(const T* logits, int64_t rows, int64_t vocab, int64_t exclude, int64_t* argmax, double* conf);

// Sparse probabilities per row of logits [rows, vocab]: the tokens whose softmax probability
// (float64) exceeds `floor`, at most max_k of them (ids[r, k] = -1 pads). Used for BlockBatch's
// per-position probability map.
template <typename T>
void sparse_probs(const T* logits, int64_t rows, int64_t vocab, double floor, int64_t max_k, int64_t* ids,
                  double* probs);

}  // namespace blockbatch::cpu
