// The model interface the decode loop sees: a Network runs one packed forward over variable-length
// query rows with per-row KV buffers and returns the logits (writing the rows' new K/V into the
// batch's buffer where the mode says so). Nothing here is specific to one model family: the one
// body every family is assembled into (model/transformer.h) implements it.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "model/config.h"

namespace blockbatch {

// How the queries of a forward use the KV buffer (ALGORITHMS.md section 3).
enum class KvMode {
  kFull,    // queries attend to themselves; their K/V are written when a buffer is given
  kDual,    // queries' K/V overwrite their slots, then attention over all L keys of the row
  kPrefix,  // attention over the row's cached [0, s) plus the queries; nothing written
};
KvMode parse_kv_mode(const std::string& mode);

// One packed forward: R rows, T tokens in total, row r = tokens [cu_seqlens[r], cu_seqlens[r+1]).
struct ForwardBatch {
  at::Tensor tokens;          // [T] int64
  at::Tensor positions;       // [T] int64, absolute canvas positions
  at::Tensor cu_seqlens;      // [R + 1] int64
  at::Tensor kv;              // [rows, layers, 2, kv_heads, L, head_dim] or undefined (full mode only)
  at::Tensor kv_rows;         // [R] int64: KV row of each query row (default: r)
  at::Tensor prefix_lens;     // [R] int64, prefix mode: cached slots [0, s) attended
  at::Tensor logit_index;     // [n] int64 into [0, T): rows of the logits returned (default: all)
  int64_t max_positions = 0;  // > 0: every position is below this (saves a device read of positions)
  // [R] int64, optional: the KV length of each row (dual: the keys it attends; default kv.size(4)).
  // Rows of several requests in one KV pool have the pool's length but each its own canvas length.
  at::Tensor kv_lens;
  // [KV rows, L / page_len] int64, optional: kv is then a page store [pages, layers, 2, kv_heads,
  // page_len, head_dim] and KV row r's position p lives in page kv_pages[r, p / page_len] (-1: none;
  // ops/checks.h kv_geometry). Rows may share pages; the logits are those of the dense buffer
  // holding the same K/V.
  at::Tensor kv_pages;
  // [KV rows, L / page_len] int64, optional (with kv_pages): the pages the forward's K/V writes go
  // to, where they differ from kv_pages (-1: not written). Rows sharing a page write it through one
  // row only (share_prompt_kv: the prompt's pages, written by one branch).
  at::Tensor kv_write_pages;
  // Gathered key sets, optional (dual and prefix modes): row r attends the positions
  // key_index[key_offsets[r] .. key_offsets[r+1]) of its KV row (int64, ascending, inside the
  // row's range: kv_lens[r] or the KV length in dual mode, prefix_lens[r] in prefix mode) instead
  // of the whole range; key_offsets [R + 1] from 0. A list of the whole range gives the same
  // logits bit for bit (model/attention.h).
  at::Tensor key_offsets, key_index;
  // > 1: one key set per layer (DUET's per-layer prefix selection, ALGORITHMS.md 18.1): key_index holds
  // key_layers equal-length lists back to back, layer l's the l-th; key_offsets are every layer's.
  int64_t key_layers = 1;
  // Optional float32 [layers, n, heads, head_dim]: filled with the queries (after QK-norm and RoPE) of
  // the forward's last n tokens at every layer (DUET's selection reads a block's queries).
  at::Tensor query_capture;
  // Optional row pruning between layers (DUET's query sparsity, ALGORITHMS.md 18.2): after layer
  // row_keep_layer (< n_layers - 1) the forward calls row_keep with that layer's residual stream [T, d]
  // (dtype()); a defined result (int64 token indices into [0, T), ascending, on the model's device) keeps
  // only those tokens for the deeper layers. There only the kept tokens' K/V are written (a dropped
  // token's slots keep what they held, which the kept ones attend in dual mode), and the logits of a
  // dropped token are zeros (uniform). Undefined result: every token goes on. Not with query_capture.
  int64_t row_keep_layer = -1;
  std::function<at::Tensor(const at::Tensor&)> row_keep;
  KvMode mode = KvMode::kFull;

  // KV rows and positions per row: of the page table when paged, else of the buffer.
  int64_t kv_row_count() const { return kv_pages.defined() ? kv_pages.size(0) : kv.size(0); }
  int64_t kv_length() const { return kv_pages.defined() ? kv_pages.size(1) * kv.size(4) : kv.size(4); }
  std::optional<at::Tensor> pages() const {
    return kv_pages.defined() ? std::optional<at::Tensor>(kv_pages) : std::nullopt;
  }
  std::optional<at::Tensor> write_pages() const {
    return kv_write_pages.defined() ? std::optional<at::Tensor>(kv_write_pages) : pages();
  }
};

class Network {
 public:
  virtual ~Network() = default;

  virtual const ModelConfig& config() const = 0;
  // The dtype of the logits and of the KV buffers; the device every tensor of a forward is on.
  virtual c10::ScalarType dtype() const = 0;
  virtual c10::Device device() const = 0;

  // Logits [n, vocab_size] in dtype() (n = logit_index size, or T); writes the queries' K/V into
  // batch.kv in modes full (when a buffer is given) and dual.
  virtual at::Tensor forward(const ForwardBatch& batch) const = 0;
  // Validates a batch (shapes, dtypes, devices, ranges); throws naming the argument.
  virtual void check(const ForwardBatch& batch) const = 0;
  // A zeroed KV buffer [rows, layers, 2, kv_heads, length, head_dim] in dtype() on device().
  virtual at::Tensor new_kv(int64_t rows, int64_t length) const = 0;
  // The LM head alone (no final norm) over hidden states [n, d]: logits [n, vocab_size] in dtype().
  // DUET ranks a block's rows by it at a shallow layer (the authors apply it un-normalised).
  virtual at::Tensor head(const at::Tensor& hidden) const;
  // Whether a forward may be recorded into a CUDA graph (false: it reads device values on the host).
  virtual bool capturable() const { return true; }

 protected:
  Network() = default;
  Network(const Network&) = default;
  Network& operator=(const Network&) = default;
};

// Every `expected` tensor present in `weights` with its shape and a float dtype, all on one device,
// and nothing else there (else "unexpected tensor ... (not part of a <family> model ...)"); returns
// that device (none: `expected` is empty). Throws naming the tensor.
std::optional<c10::Device> check_weights(const std::vector<std::pair<std::string, std::vector<int64_t>>>& expected,
                                         const std::unordered_map<std::string, at::Tensor>& weights,
                                         const char* family);

// The checks every Network's check() makes (shapes, dtypes, devices, ranges); throws naming the argument.
void check_forward_batch(const Network& net, const ForwardBatch& batch);

// `batch` with every index tensor made contiguous (the checks and kernels read raw pointers).
ForwardBatch contiguous_indices(const ForwardBatch& batch);

// A zeroed KV buffer of `net` (Network::new_kv): checks rows and length against the config.
at::Tensor zero_kv(const Network& net, const at::TensorOptions& options, int64_t rows, int64_t length);

}  // namespace blockbatch
