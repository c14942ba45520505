// C entry points of the emulated CUDA kernels, for tests/emu/test_cuda_emulated.py (ctypes): the
// launchers of csrc/kernels/cuda/kernels.cuh on host pointers, the storage type as a code
// (0 float32, 1 bfloat16, 2 float16). Each returns the launch's cudaError_t (0: success; else
// bbemu_last_error() says why).
#include <type_traits>

#include "kernels/cuda/kernels.cuh"

namespace bc = blockbatch::cuda;
namespace cpu = blockbatch::cpu;

namespace {
template <typename F>
int by_dtype(int dtype, F&& f) {
  switch (dtype) {
    case 0: return static_cast<int>(f(float{}));
    case 1: return static_cast<int>(f(__nv_bfloat16{}));
    case 2: return static_cast<int>(f(__half{}));
    default: return static_cast<int>(cudaErrorInvalidValue);
  }
}
template <typename T>
T* as(void* p) {
  return static_cast<T*>(p);
}
template <typename T>
const T* as(const void* p) {
  return static_cast<const T*>(p);
}
cudaStream_t kStream = nullptr;

// The page table the KV kernels read (bbemu_set_kv_pages; none: dense buffers).
struct {
  const int64_t* pages = nullptr;
  int64_t page_len = 0, store_pages = 0;
} g_pages;

// Dense: a buffer of kv_buffers rows of `length`; paged (a table set): kv_buffers table rows of
// `length` positions over the store's pages.
cpu::KvGeometry geometry_of(int64_t layers, int64_t kv_heads, int64_t length, int64_t head_dim, int64_t kv_buffers) {
  cpu::KvGeometry g = cpu::KvGeometry::dense(layers, kv_heads, length, head_dim, kv_buffers);
  if (g_pages.pages != nullptr) {
    g.pages = g_pages.pages;
    g.page_len = g_pages.page_len;
    g.store_pages = g_pages.store_pages;
  }
  return g;
}

// The gathered key sets the attention kernels read (bbemu_set_key_lists; none: contiguous ranges).
struct {
  const int64_t* offsets = nullptr;
  const int64_t* index = nullptr;
} g_keys;
}  // namespace

extern "C" {

// Every later attention call reads each row's cached keys through these lists (CSR: offsets
// [rows + 1] into index, positions of the KV row; offsets == nullptr: contiguous ranges again).
void bbemu_set_key_lists(const int64_t* offsets, const int64_t* index) {
  g_keys.offsets = offsets;
  g_keys.index = index;
}

// Every later KV kernel call reads and writes through this table [rows, length / page_len] of a
// store of store_pages pages (pages == nullptr: dense again).
void bbemu_set_kv_pages(const int64_t* pages, int64_t page_len, int64_t store_pages) {
  g_pages.pages = pages;
  g_pages.page_len = page_len;
  g_pages.store_pages = store_pages;
}

int bbemu_rope_kv_write(int dtype, void* q, int64_t q_stride, int64_t heads, void* k, const void* v, int64_t kv_stride,
                        const int64_t* positions, const float* cos_sin, int64_t max_positions, void* kv, int64_t layers,
                        int64_t kv_heads, int64_t length, int64_t head_dim, int64_t kv_buffers, int64_t layer,
                        const int64_t* cu_seqlens, const int64_t* kv_rows, int64_t rows, int64_t tokens,
                        int vectorized) {
  const cpu::KvGeometry g = geometry_of(layers, kv_heads, length, head_dim, kv_buffers);
  return by_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    return bc::rope_kv_write<T>(as<T>(q), q_stride, heads, as<T>(k), as<T>(v), kv_stride, positions, cos_sin,
                                max_positions, as<T>(kv), g, layer, cu_seqlens, kv_rows, rows, tokens, vectorized != 0,
                                kStream);
  });
}

// packed_attention's arguments; `kernel`: 0 the reference kernel (attention.cu; max_keys bounds
// the rows' key counts), 1-3 flash_attention's variants (1 staged, 2 and 3 pipelined with 2 and 3
// cp.async stages; splits > 1 needs `part`: splits * tokens * heads * (head_dim + 2) floats;
// splits 0: flash_attention_splits).
int bbemu_attention(int dtype, int kernel, const void* q, const void* k, const void* v, void* out, int64_t q_stride,
                    int64_t kv_stride, const int64_t* cu_seqlens, int64_t rows, const void* cache, int64_t layers,
                    int64_t kv_heads, int64_t length, int64_t head_dim, int64_t kv_buffers, int64_t layer,
                    const int64_t* kv_rows, const int64_t* cache_lens, int attend_fresh, int64_t heads, int64_t tokens,
                    int64_t max_keys, int splits, float* part) {
  const cpu::KvGeometry geometry = geometry_of(layers, kv_heads, length, head_dim, kv_buffers);
  cpu::AttentionArgs a{q,     k,        v,        out,   q_stride, kv_stride,  cu_seqlens,
                       rows,  cache,    geometry, layer, kv_rows,  cache_lens, attend_fresh != 0,
                       heads, kv_heads, head_dim};
  a.key_offsets = g_keys.offsets;
  a.key_index = g_keys.index;
  if (kernel != 0 && !bc::flash_attention_supported(a, dtype, 9)) return static_cast<int>(cudaErrorInvalidValue);
  if (kernel != 0 && splits == 0) splits = bc::flash_attention_splits(a, tokens, max_keys, 132);
  return by_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    if constexpr (std::is_same_v<T, float>) {  // no float32 tensor-core kernel (supported() says so)
      return bc::packed_attention<T>(a, tokens, max_keys, kStream);
    } else {
      return kernel == 0 ? bc::packed_attention<T>(a, tokens, max_keys, kStream)
                         : bc::flash_attention<T>(a, tokens, splits, part, kernel, kStream);
    }
  });
}

// The automatic key-split count bbemu_attention uses (splits 0), on a 132-SM device.
int bbemu_attention_splits(int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t rows, int64_t tokens,
                           int64_t max_keys) {
  cpu::AttentionArgs a{};
  a.heads = heads, a.kv_heads = kv_heads, a.head_dim = head_dim, a.rows = rows;
  return bc::flash_attention_splits(a, tokens, max_keys, 132);
}

int bbemu_rms_norm(int dtype, void* x, int64_t x_stride, const void* delta, const void* w, void* out, int64_t rows,
                   int64_t dim, float eps) {
  return by_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    if (delta == nullptr) return bc::rms_norm<T>(as<T>(x), x_stride, as<T>(w), as<T>(out), rows, dim, eps, kStream);
    return bc::add_rms_norm<T>(as<T>(x), as<T>(delta), as<T>(w), as<T>(out), rows, dim, eps, kStream);
  });
}

int bbemu_silu_mul(int dtype, const void* gate_up, void* out, int64_t rows, int64_t m) {
  return by_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    return bc::silu_mul<T>(as<T>(gate_up), as<T>(out), rows, m, kStream);
  });
}

int bbemu_confidence(int dtype, const void* logits, int64_t rows, int64_t vocab, int64_t exclude, int64_t* argmax,
                     double* conf) {
  return by_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    return bc::confidence<T>(as<T>(logits), rows, vocab, exclude, argmax, conf, kStream);
  });
}

int bbemu_sparse_probs(int dtype, const void* logits, int64_t rows, int64_t vocab, double floor, int64_t max_k,
                       int64_t* ids, double* probs) {
  return by_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    return bc::sparse_probs<T>(as<T>(logits), rows, vocab, floor, max_k, ids, probs, kStream);
  });
}

int bbemu_rope_inplace(int dtype, void* x, int64_t tokens, int64_t row_stride, int64_t heads, int64_t head_dim,
                       const int64_t* positions, const float* cos_sin, int64_t max_positions) {
  return by_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    return bc::rope_inplace<T>(as<T>(x), tokens, row_stride, heads, head_dim, positions, cos_sin, max_positions,
                               kStream);
  });
}

int bbemu_kv_write(int dtype, void* kv, int64_t layers, int64_t kv_heads, int64_t length, int64_t head_dim,
                   int64_t kv_buffers, int64_t layer, const void* k, const void* v, int64_t src_stride,
                   const int64_t* positions, const int64_t* cu_seqlens, const int64_t* kv_rows, int64_t rows,
                   int64_t tokens) {
  const cpu::KvGeometry g = geometry_of(layers, kv_heads, length, head_dim, kv_buffers);
  return by_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    return bc::kv_write<T>(as<T>(kv), g, layer, as<T>(k), as<T>(v), src_stride, positions, cu_seqlens, kv_rows, rows,
                           tokens, kStream);
  });
}

int bbemu_commit(int64_t* canvas, int64_t length, const int64_t* window, const int64_t* token, const double* conf,
                 const int64_t* k, int64_t n, int64_t mask_id, int64_t eos_id, int rule, double tau, double factor,
                 int64_t* counts) {
  return bc::commit(canvas, length, window, token, conf, k, n, mask_id, eos_id, rule, tau, factor, counts, kStream);
}

// The branch tensors of bb_absorb_ / bb_coordinate_ as a View (canvas [B, L], state [B, fields],
// eos_prob [B], map_ids / map_probs [B, L - lp, K]).
int bbemu_bb_absorb(int dtype, int64_t* canvas, int64_t* state, double* eos_prob, int64_t* map_ids, double* map_probs,
                    int64_t B, int64_t L, int64_t lp, int64_t K, int64_t mask_id, int64_t eos_id, const int64_t* spans,
                    int64_t n_spans, const int64_t* token, const double* conf, const int64_t* ids, const double* probs,
                    const void* logits, int64_t rows, int64_t vocab, double threshold, int stop_on_eos) {
  const blockbatch::branches::View v{canvas, state, eos_prob, map_ids, map_probs, B, L, lp, K, mask_id, eos_id};
  return by_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    return bc::bb_absorb<T>(v, spans, n_spans, token, conf, ids, probs, as<T>(logits), vocab,
                            blockbatch::branches::AbsorbParams{threshold, stop_on_eos != 0, rows}, kStream);
  });
}

int bbemu_bb_coordinate(int64_t* canvas, int64_t* state, double* eos_prob, int64_t* map_ids, double* map_probs,
                        int64_t B, int64_t L, int64_t lp, int64_t K, int64_t mask_id, int64_t* flags, int64_t* sync_src,
                        double merge_gate, int merge, int sync, int64_t sync_gap, int64_t refresh_tokens,
                        int periodic_refresh) {
  const blockbatch::branches::View v{canvas, state, eos_prob, map_ids, map_probs, B, L, lp, K, mask_id, -1};
  return bc::bb_coordinate(v, flags, sync_src,
                           blockbatch::branches::CoordinateParams{merge_gate, merge != 0, sync != 0, sync_gap,
                                                                  refresh_tokens, periodic_refresh != 0},
                           kStream);
}

// rows: KV rows (dense: buffers; paged: table rows, of length / page_len pages); page_bytes: a
// row's bytes (dense) or a page's.
int bbemu_kv_copy_rows(void* kv, const int64_t* src, int64_t rows, int64_t page_bytes, int64_t per_row) {
  const cpu::KvPages pages{g_pages.pages, g_pages.pages ? per_row : 1, g_pages.pages ? g_pages.store_pages : rows};
  return bc::kv_copy_rows(kv, src, rows, page_bytes, pages, kStream);
}

int bbemu_moe_experts(int dtype, const void* x, const int64_t* chosen, const float* weights, const void* gate_up,
                      const void* down, void* hidden, void* expert_out, void* out, int64_t tokens, int64_t slots,
                      int64_t experts, int64_t d, int64_t m) {
  return by_dtype(dtype, [&](auto t) {
    using T = decltype(t);
    return bc::moe_experts<T>(as<T>(x), chosen, weights, as<T>(gate_up), as<T>(down), as<T>(hidden), as<T>(expert_out),
                              as<T>(out), tokens, slots, experts, d, m, kStream);
  });
}

}  // extern "C"
