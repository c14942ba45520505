// One attention metadata per forward (ALGORITHMS.md section 3): what every layer's attention reads,
// built once from a ForwardBatch by attention_meta(), and the one attend() every body calls. The
// KV mode is data here (whether the fresh K/V are written, whether the KV source is read, whether
// the queries attend their own fresh K/V), not a branch in each body.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

#include "model/network.h"

namespace blockbatch {

struct AttnMeta {
  // Query rows: row r = tokens [cu_seqlens[r], cu_seqlens[r+1]) at `positions`.
  at::Tensor cu_seqlens, positions;
  // KV source: none (kv undefined: full mode without a buffer) | dense rows | page tables
  // (pages defined; kv is then the page store). kv_rows [R]: the KV row of each query row.
  at::Tensor kv, kv_rows;
  std::optional<at::Tensor> pages, write_pages;
  // The fresh K/V are written into their slots (full with a buffer, dual) before attention.
  bool write = false;
  // The queries attend their own fresh K/V after the cached keys (full, prefix); false: they
  // are already in their slots and read from there (dual).
  bool attend_fresh = true;
  // The KV source is read (dual, prefix): per row a key set of its KV row, either the contiguous
  // range [0, key_lens[r]) (dual: kv_lens or the row length; prefix: prefix_lens) or, with
  // key_offsets defined, the gathered positions key_index[key_offsets[r] .. key_offsets[r+1])
  // (ascending, inside [0, key_lens[r])).
  bool read_cache = false;
  at::Tensor key_lens;
  std::optional<at::Tensor> key_offsets, key_index;
  at::Tensor query_capture;  // optional: filled with the last tokens' rotated queries (ForwardBatch::query_capture)
  int64_t key_layers = 1;    // > 1: key_index holds one equal-length list set per layer (ForwardBatch::key_layers)
};

// The metadata of `batch` (checked, index tensors contiguous): built once per forward.
AttnMeta attention_meta(const ForwardBatch& batch);

// Writes the rotated fresh k and v [T, kv_heads, head_dim] into their slots at `layer` when the
// metadata says so (bodies that rotate and write in one pass call ops::rope_kv_write_ instead).
void write_kv(const at::Tensor& k, const at::Tensor& v, const AttnMeta& meta, int64_t layer);

// Attention of the rotated q [T, heads, head_dim] over each row's key set at `layer` (and its
// fresh k, v [T, kv_heads, head_dim] where the metadata says): [T, heads * head_dim].
at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttnMeta& meta, int64_t layer);

}  // namespace blockbatch
