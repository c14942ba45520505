// The pieces every decode policy shares: packing a forward's queries into device index
// tensors with one host-to-device copy, and turning the logits into proposals.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <optional>
#include <tuple>
#include <functional>
#include <vector>

#include "model/network.h"

namespace blockbatch {

// What a step is, across policies: part of its shape key (steps of equal shapes but different
// device programs never share a graph).
enum class StepKind : int64_t { kStep, kBlockStart, kWindow, kInit, kBlock, kRefresh, kCoordinate };
// "step", "block_start", "window", "init", "block", "refresh", "coordinate".
const char* step_kind_name(StepKind kind);

// A step's shape: equal keys mean equal launch shapes (a CUDA graph per key).
struct StepKey {
  StepKind kind = StepKind::kStep;
  KvMode mode = KvMode::kFull;
  int64_t tokens = 0, rows = 0, logit_rows = 0;
  int64_t buffer = 0;     // index-buffer entries (the graph's static input)
  bool sampling = false;  // host-drawn proposals: the readout is the logits
  bool with_kv = false;
  auto tie() const { return std::make_tuple(kind, mode, tokens, rows, logit_rows, buffer, sampling, with_kv); }
  bool operator<(const StepKey& o) const { return tie() < o.tie(); }
};

// A request's KV rows: a dense buffer [rows, layers, 2, kv_heads, L, head_dim], or (pages defined)
// a page store [pages, layers, 2, kv_heads, page_len, head_dim] and the rows' page table
// [rows, L / page_len] (ForwardBatch::kv_pages; a scheduler's paged pool, decode/batch/kv_pool.h).
struct KvRows {
  at::Tensor kv, pages;
  at::Tensor write_pages;  // optional: where the forwards' K/V writes go (ForwardBatch::kv_write_pages)
  // optional, [rows] int64 all equal to the canvas length: the keys a dual-mode row attends when
  // the table's rows are longer than the canvas (whole pages) and no kv_lens is planned.
  at::Tensor lens;
  // Positions [0, cached) already hold their final K/V (a prefix-cache hit: decode/batch/prefix_cache.h).
  int64_t cached = 0;
  bool defined() const { return kv.defined(); }
  std::optional<at::Tensor> table() const { return pages.defined() ? std::optional<at::Tensor>(pages) : std::nullopt; }
  // The rows' K/V at `layer` as a dense [rows, 2, kv_heads, length, head_dim] (a copy when paged;
  // dense: a view, narrowed to `length`).
  at::Tensor layer_rows(int64_t layer, int64_t length) const;
};

// Positions per KV page where the engine picks (a request alone with share_prompt_kv; a CPU
// scheduler's pool, decode/batch/scheduler.h): chosen by docs/bench/paged.
constexpr int64_t kDefaultKvPageLen = 16;

// Page tables of `rows` rows of `per_row` entries, the first `used` of each on a page, over
// `pages` (taken in order): the first `shared` pages of every row are row 0's. read: what each
// row reads; write: where its writes go (the shared pages through row 0 only; -1 elsewhere).
struct PageTables {
  std::vector<int64_t> read, write;
};
PageTables page_tables(const std::vector<int64_t>& pages, int64_t rows, int64_t per_row, int64_t used, int64_t shared);

// Host-side description of one packed forward over canvas rows that live on the model's device:
// host_buffer() packs its indices for one host-to-device copy, batch() turns that copy into the
// forward's inputs. The one layout of a packed forward's indices: the decoders' steps and the
// scheduler's packed forwards (decode/batch/pack.cpp, its padding rows) both use it.
struct PackedQueries {
  std::vector<int64_t> gather, positions, cu_seqlens{0}, kv_rows, prefix_lens, logit_index;
  // Optional (empty: every row attends the whole KV row): the KV length of each row, the keys it
  // attends in dual mode. Block-causal families give each block its own row ending at the block's end.
  std::vector<int64_t> kv_lens;
  // Optional gathered key sets (dual / prefix; empty: the contiguous ranges), CSR: row r attends
  // the positions key_index[key_offsets[r] .. key_offsets[r+1]) of its KV row (ForwardBatch::key_index).
  std::vector<int64_t> key_offsets, key_index;
  // > 1: one key set per layer (ForwardBatch::key_layers), set by set_layer_keys.
  int64_t key_layers = 1;
  // Optional: filled by the forward with the last tokens' queries per layer (ForwardBatch::query_capture).
  at::Tensor query_capture;
  // Optional row pruning after a layer (ForwardBatch::row_keep_layer / row_keep; DUET's query sparsity).
  int64_t row_keep_layer = -1;
  std::function<at::Tensor(const at::Tensor&)> row_keep;

  // A row whose tokens are gathered on the device from the canvas tensor (see batch): position p
  // takes the flattened canvas' element canvas_offset + p (canvas_offset = row * L for a [B, L] one).
  void add_positions(int64_t begin, int64_t end, int64_t kv_row, int64_t canvas_offset = 0) {
    for (int64_t p = begin; p < end; ++p) {
      positions.push_back(p);
      gather.push_back(canvas_offset + p);
    }
    cu_seqlens.push_back(static_cast<int64_t>(positions.size()));
    kv_rows.push_back(kv_row);
  }
  int64_t size() const { return static_cast<int64_t>(positions.size()); }
  int64_t rows() const { return static_cast<int64_t>(kv_rows.size()); }
  // Keys the forward's rows attend, summed over its rows: a row's gathered key list, else its kv_lens
  // entry (dual), its prefix and itself (prefix), itself (full), or `row_length` keys (dual over the
  // whole KV row). The per-step key count of the stats (key_tokens_per_step).
  int64_t key_tokens(KvMode mode, int64_t row_length) const;
  // Appends a row's gathered key set (positions of its KV row, ascending); call once per row,
  // in row order, for every row or for none.
  void add_keys(const std::vector<int64_t>& positions_of_row) {
    if (key_offsets.empty()) key_offsets.push_back(0);
    key_index.insert(key_index.end(), positions_of_row.begin(), positions_of_row.end());
    key_offsets.push_back(static_cast<int64_t>(key_index.size()));
  }
  // One row's key set per layer (a single-row step; every list of one length, positions ascending):
  // layer l attends by_layer[l] (DUET's prefix selection plus the block's own keys).
  void set_layer_keys(const std::vector<std::vector<int64_t>>& by_layer) {
    TORCH_CHECK(rows() == 1 && !by_layer.empty(), "set_layer_keys: one row and at least one layer");
    key_offsets = {0, static_cast<int64_t>(by_layer.front().size())};
    key_index.clear();
    for (const auto& keys : by_layer) {
      TORCH_CHECK(keys.size() == by_layer.front().size(), "set_layer_keys: every layer's list has one length");
      key_index.insert(key_index.end(), keys.begin(), keys.end());
    }
    key_layers = static_cast<int64_t>(by_layer.size());
  }
  // All index vectors in one int64 buffer, in this order: gather | positions | cu_seqlens |
  // kv_rows | prefix_lens (prefix mode) | kv_lens (when set) | key_offsets | key_index (when set) |
  // logit_index: one host-to-device copy per forward. Callers may append their own entries after it.
  std::vector<int64_t> host_buffer(KvMode mode) const;
  // The index vectors as views into `buffer` (host_buffer's layout): `tokens` holds the gather
  // entries as they are; every vector of the layout is a view (empty ones too); no KV.
  ForwardBatch views(const at::Tensor& buffer, KvMode mode) const;
  // The forward's inputs as views into `buffer` (host_buffer's layout, on the model's device);
  // the tokens are gathered from `canvas` (any shape, read flattened).
  ForwardBatch batch(const at::Tensor& buffer, const KvRows& kv, KvMode mode, const at::Tensor& canvas) const;
};

// Proposals for logits rows (ALGORITHMS.md section 1): argmax (or Gumbel-max in float64 when
// temperature > 0, one rand([n, vocab]) draw per call) and softmax confidence in float64. The
// mask id is never proposed (a model may rank it first; committing it would never finish).
struct Proposals {
  std::vector<int64_t> token;
  std::vector<double> conf;
};
// Proposals from host copies of a step's readout: greedy = the confidence kernel's (argmax, its
// probability); sampling = Gumbel-max over the float64 logits with the seeded host generator.
Proposals to_proposals(const at::Tensor& token, const at::Tensor& conf);  // host int64 / float64 [n]
Proposals sample_proposals(const at::Tensor& logits64, int64_t mask_id, double temperature, at::Generator& generator);

// Host copies of device tensors with 8-byte elements (int64 / float64) in ONE device-to-host copy:
// concatenated as int64 bit patterns on the device (pack), split again on the host (unpack).
// CPU tensors are returned as they are, made contiguous.
std::vector<at::Tensor> read_back(const std::vector<at::Tensor>& tensors);
at::Tensor pack_readout(const std::vector<at::Tensor>& tensors);
std::vector<at::Tensor> unpack_readout(const at::Tensor& host_flat, const std::vector<at::Tensor>& like);

}  // namespace blockbatch
