// Shape, dtype and device checks shared by the CPU, CUDA and Meta implementations.
#include <c10/util/Exception.h>

#include "ops/checks.h"

#include <algorithm>
#include <utility>

namespace blockbatch {

namespace {
void check_floating(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf, name,
              " must be float32, bfloat16 or float16, got ", t.scalar_type());
}
void check_index(const at::Tensor& t, const char* name, int64_t dim) {
  TORCH_CHECK(t.scalar_type() == at::kLong, name, " must be int64, got ", t.scalar_type());
  TORCH_CHECK(t.dim() == dim, name, " must have ", dim, " dimension(s), got shape ", t.sizes());
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}
void check_same_device(const at::Tensor& a, const at::Tensor& b, const char* na, const char* nb) {
  TORCH_CHECK(a.device() == b.device(), na, " is on ", a.device(), " but ", nb, " is on ", b.device());
}
// [T, heads, head_dim] with contiguous heads; any row stride.
void check_heads_view(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.dim() == 3, name, " must be [tokens, heads, head_dim], got shape ", t.sizes());
  TORCH_CHECK(t.stride(2) == 1 && t.stride(1) == t.size(2), name,
              " must have contiguous heads (stride(2) == 1, stride(1) == head_dim), got strides ", t.strides());
}
}  // namespace

void check_logits(const at::Tensor& logits) {
  check_floating(logits, "logits");
  TORCH_CHECK(logits.dim() == 2 && logits.size(1) > 0, "logits must be [rows, vocab] with vocab > 0, got shape ",
              logits.sizes());
  TORCH_CHECK(logits.is_contiguous(), "logits must be contiguous");
}

void check_sparse_probs(const at::Tensor& logits, double floor, int64_t max_k) {
  check_logits(logits);
  TORCH_CHECK(floor > 0 && floor < 1, "floor must be in (0, 1), got ", floor);
  // More slots than ids (or than a map ever needs) would only allocate padding: bounded.
  const int64_t limit = std::max<int64_t>(logits.size(1), kMaxSparseSlots);
  TORCH_CHECK(max_k > 0 && max_k <= limit, "max_k must be in [1, ", limit, "], got ", max_k);
}

cpu::AttentionArgs attention_args(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& cu_seqlens, const std::optional<at::Tensor>& kv,
                                  const std::optional<at::Tensor>& kv_rows, const std::optional<at::Tensor>& cache_lens,
                                  int64_t layer, bool attend_fresh, const at::Tensor& out,
                                  const std::optional<at::Tensor>& kv_pages, const std::optional<at::Tensor>& key_index,
                                  const std::optional<at::Tensor>& key_offsets) {
  cpu::AttentionArgs a{};
  a.q = q.const_data_ptr();
  a.k = k.const_data_ptr();
  a.v = v.const_data_ptr();
  a.out = out.data_ptr();
  a.q_stride = q.stride(0);
  a.kv_stride = k.stride(0);
  a.cu_seqlens = cu_seqlens.const_data_ptr<int64_t>();
  a.rows = cu_seqlens.size(0) - 1;
  a.layer = layer;
  a.attend_fresh = attend_fresh;
  a.heads = q.size(1);
  a.kv_heads = k.size(1);
  a.head_dim = q.size(2);
  if (kv.has_value()) {
    a.cache = kv->const_data_ptr();
    a.geometry = kv_geometry(*kv, kv_pages);
    a.kv_rows = kv_rows->const_data_ptr<int64_t>();
    a.cache_lens = cache_lens->const_data_ptr<int64_t>();
    if (key_offsets.has_value()) {
      a.key_offsets = key_offsets->const_data_ptr<int64_t>();
      a.key_index = key_index->const_data_ptr<int64_t>();
    }
  }
  return a;
}

cpu::KvGeometry kv_geometry(const at::Tensor& kv, const std::optional<at::Tensor>& kv_pages) {
  TORCH_CHECK(kv.dim() == 6 && kv.size(2) == 2,
              kv_pages.has_value() ? "kv must be a page store [pages, layers, 2, kv_heads, page_len, head_dim]"
                                   : "kv must be [rows, layers, 2, kv_heads, L, head_dim]",
              ", got shape ", kv.sizes());
  if (!kv_pages.has_value()) return cpu::KvGeometry::dense(kv.size(1), kv.size(3), kv.size(4), kv.size(5), kv.size(0));
  check_index(*kv_pages, "kv_pages", 2);
  check_same_device(kv, *kv_pages, "kv", "kv_pages");
  TORCH_CHECK(kv.size(4) > 0, "kv_pages: the page store's pages must hold positions, got shape ", kv.sizes());
  cpu::KvGeometry g =
      cpu::KvGeometry::dense(kv.size(1), kv.size(3), kv_pages->size(1) * kv.size(4), kv.size(5), kv_pages->size(0));
  // (A meta table has no data: the geometry then serves the shape checks only.)
  g.pages = kv_pages->is_meta() ? nullptr : kv_pages->const_data_ptr<int64_t>();
  g.page_len = kv.size(4);
  g.store_pages = kv.size(0);
  return g;
}

void check_kv_pages_values(const cpu::KvGeometry& g) {
  if (g.pages == nullptr) return;
  const int64_t n = g.rows * g.pages_per_row();
  for (int64_t i = 0; i < n; ++i)
    TORCH_CHECK_INDEX(g.pages[i] >= -1 && g.pages[i] < g.store_pages, "kv_pages[", i / g.pages_per_row(), ", ",
                      i % g.pages_per_row(), "] = ", g.pages[i], " is outside [-1, ", g.store_pages,
                      ") (the store's pages; -1: none)");
}

void check_kv_pages_cover(const cpu::KvGeometry& g, const int64_t* kv_rows, const int64_t* lens, int64_t rows) {
  if (g.pages == nullptr) return;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t pos = 0; pos < lens[r]; pos += g.page_len)
      TORCH_CHECK_INDEX(g.page(kv_rows[r], pos) >= 0, "row ", r, " reads position ", pos, " of KV row ", kv_rows[r],
                        ", which has no page (kv_pages entry -1)");
}

void check_rms_norm(const at::Tensor& x, const at::Tensor& weight) {
  check_floating(x, "x");
  TORCH_CHECK(x.dim() == 2, "x must be [rows, dim], got shape ", x.sizes());
  TORCH_CHECK(x.stride(1) == 1, "x must have a contiguous last dimension");
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == x.size(1), "weight must be [", x.size(1), "], got ",
              weight.sizes());
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), "weight dtype ", weight.scalar_type(), " differs from x dtype ",
              x.scalar_type());
  TORCH_CHECK(weight.is_contiguous(), "weight must be contiguous");
  check_same_device(x, weight, "x", "weight");
}

void check_add_rms_norm(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight) {
  check_rms_norm(x, weight);
  TORCH_CHECK(x.is_contiguous(), "x must be contiguous (it is updated in place)");
  TORCH_CHECK(delta.sizes() == x.sizes(), "delta must be shaped like x ", x.sizes(), ", got ", delta.sizes());
  TORCH_CHECK(delta.scalar_type() == x.scalar_type(), "delta dtype ", delta.scalar_type(), " differs from x dtype ",
              x.scalar_type());
  TORCH_CHECK(delta.is_contiguous(), "delta must be contiguous");
  check_same_device(x, delta, "x", "delta");
}

void check_silu_mul(const at::Tensor& gate_up) {
  check_floating(gate_up, "gate_up");
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) % 2 == 0, "gate_up must be [rows, 2*m], got shape ",
              gate_up.sizes());
  TORCH_CHECK(gate_up.is_contiguous(), "gate_up must be contiguous");
}

void check_linear(const at::Tensor& x, const at::Tensor& weight) {
  check_floating(x, "x");
  TORCH_CHECK(x.dim() == 2, "x must be [rows, in_features], got shape ", x.sizes());
  TORCH_CHECK(weight.dim() == 2 && weight.size(1) == x.size(1), "weight must be [out_features, ", x.size(1),
              "] (x has ", x.size(1), " features), got shape ", weight.sizes());
  TORCH_CHECK(weight.scalar_type() == x.scalar_type(), "weight dtype ", weight.scalar_type(), " differs from x dtype ",
              x.scalar_type());
  check_same_device(x, weight, "x", "weight");
}

void check_moe_experts(const at::Tensor& x, const at::Tensor& chosen, const at::Tensor& weights,
                       const at::Tensor& gate_up, const at::Tensor& down) {
  check_floating(x, "x");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "x must be a contiguous [tokens, d], got shape ", x.sizes());
  const int64_t T = x.size(0), d = x.size(1);
  check_index(chosen, "chosen", 2);
  TORCH_CHECK(chosen.size(0) == T, "chosen must be [tokens, slots] with tokens = ", T, " (x's rows), got shape ",
              chosen.sizes());
  TORCH_CHECK(weights.scalar_type() == at::kFloat, "weights must be float32, got ", weights.scalar_type());
  TORCH_CHECK(weights.sizes() == chosen.sizes() && weights.is_contiguous(),
              "weights must be a contiguous tensor shaped as chosen ", chosen.sizes(), ", got shape ", weights.sizes());
  TORCH_CHECK(gate_up.dim() == 3 && gate_up.size(2) == d && gate_up.size(1) % 2 == 0 && gate_up.is_contiguous(),
              "gate_up must be a contiguous [experts, 2 * m, ", d, "] (gate rows, then up), got shape ",
              gate_up.sizes());
  const int64_t E = gate_up.size(0), m = gate_up.size(1) / 2;
  TORCH_CHECK(down.dim() == 3 && down.size(0) == E && down.size(1) == d && down.size(2) == m && down.is_contiguous(),
              "down must be a contiguous [", E, ", ", d, ", ", m, "] (experts, d, m of gate_up), got shape ",
              down.sizes());
  for (const auto& [t, name] : {std::pair<const at::Tensor*, const char*>{&gate_up, "gate_up"}, {&down, "down"}}) {
    TORCH_CHECK(t->scalar_type() == x.scalar_type(), name, " dtype ", t->scalar_type(), " differs from x dtype ",
                x.scalar_type());
    check_same_device(x, *t, "x", name);
  }
  check_same_device(x, chosen, "x", "chosen");
  check_same_device(x, weights, "x", "weights");
}

void check_rope(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos_sin) {
  check_floating(x, "x");
  check_heads_view(x, "x");
  TORCH_CHECK(x.size(2) % 2 == 0, "x head_dim must be even, got ", x.size(2));
  check_index(positions, "positions", 1);
  TORCH_CHECK(positions.size(0) == x.size(0), "positions must have ", x.size(0), " entries, got ", positions.size(0));
  TORCH_CHECK(cos_sin.scalar_type() == at::kFloat && cos_sin.dim() == 2 && cos_sin.size(1) == x.size(2) &&
                  cos_sin.is_contiguous(),
              "cos_sin must be a contiguous float32 [max_positions, ", x.size(2), "] table, got ",
              cos_sin.scalar_type(), " ", cos_sin.sizes());
  check_same_device(x, positions, "x", "positions");
  check_same_device(x, cos_sin, "x", "cos_sin");
}

void check_kv_write(const at::Tensor& kv, const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                    const at::Tensor& cu_seqlens, const at::Tensor& kv_rows, int64_t layer,
                    const std::optional<at::Tensor>& kv_pages) {
  check_floating(kv, "kv");
  kv_geometry(kv, kv_pages);
  TORCH_CHECK(kv.is_contiguous(), "kv must be contiguous");
  TORCH_CHECK(layer >= 0 && layer < kv.size(1), "layer = ", layer, " is outside [0, ", kv.size(1), ")");
  for (const auto& [t, name] : {std::pair{&k, "k"}, std::pair{&v, "v"}}) {
    check_heads_view(*t, name);
    TORCH_CHECK(t->scalar_type() == kv.scalar_type(), name, " dtype ", t->scalar_type(), " differs from kv dtype ",
                kv.scalar_type());
    TORCH_CHECK(t->size(1) == kv.size(3) && t->size(2) == kv.size(5), name, " must be [tokens, ", kv.size(3), ", ",
                kv.size(5), "], got ", t->sizes());
    check_same_device(kv, *t, "kv", name);
  }
  TORCH_CHECK(k.sizes() == v.sizes() && k.strides() == v.strides(), "k and v must have the same shape and strides");
  check_index(positions, "positions", 1);
  TORCH_CHECK(positions.size(0) == k.size(0), "positions must have ", k.size(0), " entries, got ", positions.size(0));
  check_index(cu_seqlens, "cu_seqlens", 1);
  TORCH_CHECK(cu_seqlens.size(0) >= 1, "cu_seqlens must have at least one entry");
  check_index(kv_rows, "kv_rows", 1);
  check_same_device(kv, positions, "kv", "positions");
  check_same_device(kv, cu_seqlens, "kv", "cu_seqlens");
  check_same_device(kv, kv_rows, "kv", "kv_rows");
  TORCH_CHECK(kv_rows.size(0) == cu_seqlens.size(0) - 1, "kv_rows must have ", cu_seqlens.size(0) - 1,
              " entries (one per row), got ", kv_rows.size(0));
}

void check_rope_kv_write(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                         const at::Tensor& cos_sin, const at::Tensor& kv, const at::Tensor& cu_seqlens,
                         const at::Tensor& kv_rows, int64_t layer, const std::optional<at::Tensor>& kv_pages) {
  check_rope(q, positions, cos_sin);
  check_rope(k, positions, cos_sin);
  check_kv_write(kv, k, v, positions, cu_seqlens, kv_rows, layer, kv_pages);
  // (head_dim: both match the cos_sin table's width, checked above)
  TORCH_CHECK(q.scalar_type() == k.scalar_type(), "q dtype ", q.scalar_type(), " differs from k dtype ",
              k.scalar_type());
}

void check_packed_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_seqlens,
                            const std::optional<at::Tensor>& kv, const std::optional<at::Tensor>& kv_rows,
                            const std::optional<at::Tensor>& cache_lens, int64_t layer,
                            const std::optional<at::Tensor>& kv_pages, const std::optional<at::Tensor>& key_index,
                            const std::optional<at::Tensor>& key_offsets) {
  check_floating(q, "q");
  check_heads_view(q, "q");
  check_heads_view(k, "k");
  check_heads_view(v, "v");
  TORCH_CHECK(k.sizes() == v.sizes() && k.strides() == v.strides(), "k and v must have the same shape and strides");
  TORCH_CHECK(k.size(0) == q.size(0) && k.size(2) == q.size(2), "k must be [", q.size(0), ", kv_heads, ", q.size(2),
              "], got ", k.sizes());
  TORCH_CHECK(k.size(1) > 0 && q.size(1) % k.size(1) == 0, "kv_heads = ", k.size(1),
              " must divide heads = ", q.size(1));
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(),
              "q, k and v must share a dtype");
  check_same_device(q, k, "q", "k");
  check_same_device(q, v, "q", "v");
  check_index(cu_seqlens, "cu_seqlens", 1);
  TORCH_CHECK(cu_seqlens.size(0) >= 1, "cu_seqlens must have at least one entry");
  check_same_device(q, cu_seqlens, "q", "cu_seqlens");
  const int64_t rows = cu_seqlens.size(0) - 1;
  if (kv.has_value()) {
    kv_geometry(*kv, kv_pages);
    TORCH_CHECK(kv->size(3) == k.size(1) && kv->size(5) == q.size(2), "kv must be [rows, layers, 2, ", k.size(1),
                ", L, ", q.size(2), "] (paged: [pages, layers, 2, ", k.size(1), ", page_len, ", q.size(2),
                "]), got shape ", kv->sizes());
    TORCH_CHECK(kv->is_contiguous(), "kv must be contiguous");
    TORCH_CHECK(kv->scalar_type() == q.scalar_type(), "kv dtype ", kv->scalar_type(), " differs from q dtype ",
                q.scalar_type());
    check_same_device(q, *kv, "q", "kv");
    TORCH_CHECK(layer >= 0 && layer < kv->size(1), "layer = ", layer, " is outside [0, ", kv->size(1), ")");
    TORCH_CHECK(kv_rows.has_value() && cache_lens.has_value(), "kv_rows and cache_lens are required with kv");
    check_index(*kv_rows, "kv_rows", 1);
    check_index(*cache_lens, "cache_lens", 1);
    TORCH_CHECK(kv_rows->size(0) == rows && cache_lens->size(0) == rows, "kv_rows and cache_lens must have ", rows,
                " entries (one per row)");
    check_same_device(q, *kv_rows, "q", "kv_rows");
    check_same_device(q, *cache_lens, "q", "cache_lens");
  } else {
    TORCH_CHECK(!kv_pages.has_value(), "kv_pages is given without kv");
  }
  // Gathered key sets: a CSR list per row of positions of its KV row (in place of [0, cache_lens[r])).
  TORCH_CHECK(key_index.has_value() == key_offsets.has_value(),
              key_index.has_value() ? "key_index needs key_offsets" : "key_offsets needs key_index",
              " (a gathered key set per row: key_offsets [rows + 1] into key_index)");
  if (key_index.has_value()) {
    TORCH_CHECK(kv.has_value(), "key_index needs kv (its entries are positions of the rows' KV rows)");
    check_index(*key_index, "key_index", 1);
    check_index(*key_offsets, "key_offsets", 1);
    TORCH_CHECK(key_offsets->size(0) == rows + 1, "key_offsets must have ", rows + 1, " entries (rows + 1), got ",
                key_offsets->size(0));
    check_same_device(q, *key_index, "q", "key_index");
    check_same_device(q, *key_offsets, "q", "key_offsets");
  }
}

void check_key_lists_values(const cpu::AttentionArgs& a, int64_t n_index) {
  if (a.key_offsets == nullptr) return;
  const int64_t* off = a.key_offsets;
  TORCH_CHECK_INDEX(off[0] == 0, "key_offsets[0] = ", off[0], " must be 0");
  for (int64_t r = 0; r < a.rows; ++r)
    TORCH_CHECK_INDEX(off[r + 1] >= off[r], "key_offsets must be non-decreasing: key_offsets[", r + 1,
                      "] = ", off[r + 1], " < key_offsets[", r, "] = ", off[r]);
  TORCH_CHECK_INDEX(off[a.rows] == n_index, "key_offsets[", a.rows, "] = ", off[a.rows],
                    " must equal key_index's size ", n_index);
  for (int64_t r = 0; r < a.rows; ++r) {
    for (int64_t i = off[r]; i < off[r + 1]; ++i) {
      const int64_t p = a.key_index[i];
      TORCH_CHECK_INDEX(p >= 0 && p < a.cache_lens[r], "key_index[", i, "] = ", p, " (row ", r,
                        ") is outside the row's length [0, ", a.cache_lens[r], ") (cache_lens[", r, "])");
      TORCH_CHECK_INDEX(i == off[r] || p > a.key_index[i - 1], "key_index[", i, "] = ", p, " (row ", r,
                        ") must be above key_index[", i - 1, "] = ", a.key_index[i - 1],
                        " (a row's keys ascending, each once)");
      TORCH_CHECK_INDEX(a.geometry.pages == nullptr || a.geometry.page(a.kv_rows[r], p) >= 0, "key_index[", i,
                        "] = ", p, " (row ", r, ") reads KV row ", a.kv_rows[r], ", which has no page there");
    }
  }
}

}  // namespace blockbatch
