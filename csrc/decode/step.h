// The pieces every decode policy shares: packing a forward's queries into device index
// tensors with one host-to-device copy, and turning the logits into proposals.
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "model/model.h"

namespace blockbatch {

// Host-side description of one packed forward; `run` ships it to the model's device.
struct PackedQueries {
  std::vector<int64_t> tokens, positions, cu_seqlens{0}, kv_rows, prefix_lens, logit_index;

  void add_row(const int64_t* canvas, int64_t begin, int64_t end, int64_t kv_row) {
    for (int64_t p = begin; p < end; ++p) {
      tokens.push_back(canvas[p]);
      positions.push_back(p);
    }
    cu_seqlens.push_back(static_cast<int64_t>(tokens.size()));
    kv_rows.push_back(kv_row);
  }
  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
  int64_t rows() const { return static_cast<int64_t>(kv_rows.size()); }
  // Logits [n, vocab] (n = logit_index size, or all tokens).
  at::Tensor run(const Model& model, const at::Tensor& kv, KvMode mode) const;
};

// Proposals for logits rows (ALGORITHMS.md section 1): argmax (or Gumbel-max in float64 when
// temperature > 0, one rand([n, vocab]) draw per call) and softmax confidence in float64. The
// mask id is never proposed (a model may rank it first; committing it would never finish).
struct Proposals {
  std::vector<int64_t> token;
  std::vector<double> conf;
};
Proposals propose(const at::Tensor& logits, int64_t mask_id, double temperature, at::Generator& generator);

}  // namespace blockbatch
