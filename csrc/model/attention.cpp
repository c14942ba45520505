#include "model/attention.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>

#include "ops/ops.h"

namespace blockbatch {

AttnMeta attention_meta(const ForwardBatch& b) {
  AttnMeta m;
  const int64_t R = b.cu_seqlens.size(0) - 1;
  const auto index_opts = b.tokens.options();
  m.cu_seqlens = b.cu_seqlens;
  m.positions = b.positions;
  if (b.kv.defined()) {
    m.kv = b.kv;
    m.kv_rows = b.kv_rows.defined() ? b.kv_rows : at::arange(R, index_opts);
    m.pages = b.pages();
    m.write_pages = b.write_pages();
  }
  m.write = b.kv.defined() && b.mode != KvMode::kPrefix;
  m.attend_fresh = b.mode != KvMode::kDual;  // dual: the fresh K/V are already in their slots
  m.read_cache = b.mode != KvMode::kFull;
  if (b.mode == KvMode::kDual) {
    m.key_lens = b.kv_lens.defined() ? b.kv_lens : at::full({R}, b.kv_length(), index_opts);
  } else if (b.mode == KvMode::kPrefix) {
    m.key_lens = b.prefix_lens;
  }
  m.query_capture = b.query_capture;
  if (b.key_offsets.defined()) {
    m.key_offsets = b.key_offsets;
    m.key_index = b.key_index;
    m.key_layers = b.key_layers;
  }
  return m;
}

void write_kv(const at::Tensor& k, const at::Tensor& v, const AttnMeta& m, int64_t layer) {
  if (m.write) ops::kv_write_(m.kv, k, v, m.positions, m.cu_seqlens, m.kv_rows, layer, m.write_pages);
}

at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttnMeta& m, int64_t layer) {
  if (!m.read_cache)
    return ops::packed_attention(q, k, v, m.cu_seqlens, std::nullopt, std::nullopt, std::nullopt, layer,
                                 m.attend_fresh);
  std::optional<at::Tensor> keys = m.key_index;
  if (keys && m.key_layers > 1) {  // this layer's lists
    const int64_t n = keys->size(0) / m.key_layers;
    keys = keys->narrow(0, layer * n, n);
  }
  return ops::packed_attention(q, k, v, m.cu_seqlens, m.kv, m.kv_rows, m.key_lens, layer, m.attend_fresh, m.pages, keys,
                               m.key_offsets);
}

}  // namespace blockbatch
