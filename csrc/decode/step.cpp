#include "decode/step.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/div.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/gather.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/log.h>
#include <ATen/ops/neg.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/softmax.h>

#include <algorithm>
#include <limits>

#include "ops/ops.h"

namespace blockbatch {

const char* step_kind_name(StepKind kind) {
  switch (kind) {
    case StepKind::kStep: return "step";
    case StepKind::kBlockStart: return "block_start";
    case StepKind::kWindow: return "window";
    case StepKind::kInit: return "init";
    case StepKind::kBlock: return "block";
    case StepKind::kRefresh: return "refresh";
    case StepKind::kCoordinate: return "coordinate";
  }
  return "?";
}

int64_t PackedQueries::key_tokens(KvMode mode, int64_t row_length) const {
  int64_t keys = 0;
  for (int64_t r = 0; r < rows(); ++r) {
    const int64_t queries = cu_seqlens[r + 1] - cu_seqlens[r];
    if (!key_offsets.empty()) {
      keys += key_offsets[r + 1] - key_offsets[r];
    } else if (mode == KvMode::kFull) {
      keys += queries;
    } else if (mode == KvMode::kPrefix) {
      keys += prefix_lens[r] + queries;
    } else {
      keys += kv_lens.empty() ? row_length : kv_lens[r];
    }
  }
  return keys;
}

std::vector<int64_t> PackedQueries::host_buffer(KvMode mode) const {
  std::vector<int64_t> host;
  host.reserve(gather.size() + positions.size() + 2 * kv_rows.size() + 1 + prefix_lens.size() + kv_lens.size() +
               key_offsets.size() + key_index.size() + logit_index.size());
  auto append = [&](const std::vector<int64_t>& v) { host.insert(host.end(), v.begin(), v.end()); };
  append(gather);
  append(positions);
  append(cu_seqlens);
  append(kv_rows);
  if (mode == KvMode::kPrefix) append(prefix_lens);
  append(kv_lens);
  append(key_offsets);
  append(key_index);
  append(logit_index);
  return host;
}

PageTables page_tables(const std::vector<int64_t>& pages, int64_t rows, int64_t per_row, int64_t used, int64_t shared) {
  PageTables t{std::vector<int64_t>(static_cast<size_t>(rows * per_row), -1), {}};
  size_t next = 0;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < used; ++i) {
      t.read[static_cast<size_t>(r * per_row + i)] =
          r > 0 && i < shared ? t.read[static_cast<size_t>(i)] : pages.at(next++);
    }
  }
  t.write = t.read;
  for (int64_t r = 1; r < rows; ++r) {
    for (int64_t i = 0; i < shared; ++i) t.write[static_cast<size_t>(r * per_row + i)] = -1;
  }
  return t;
}

at::Tensor KvRows::layer_rows(int64_t layer, int64_t length) const {
  if (!pages.defined()) return kv.select(1, layer).narrow(3, 0, length);
  // [rows * per_row, 2, kv_heads, page_len, head_dim] -> [rows, 2, kv_heads, per_row * page_len, head_dim]
  const int64_t rows = pages.size(0), per_row = pages.size(1), page_len = kv.size(4);
  const at::Tensor flat = pages.reshape({-1}).clamp_min(0);  // no page (-1): page 0, cut off by `length` below
  at::Tensor g = kv.select(1, layer).index_select(0, flat);
  g = g.view({rows, per_row, 2, kv.size(3), page_len, kv.size(5)}).permute({0, 2, 3, 1, 4, 5});
  return g.reshape({rows, 2, kv.size(3), per_row * page_len, kv.size(5)}).narrow(3, 0, length);
}

ForwardBatch PackedQueries::views(const at::Tensor& buffer, KvMode mode) const {
  const int64_t n_tok = size(), n_rows = rows();
  TORCH_CHECK(static_cast<int64_t>(cu_seqlens.size()) == n_rows + 1 && static_cast<int64_t>(gather.size()) == n_tok,
              "PackedQueries: one cu_seqlens entry per row plus one, one gather entry per position");
  TORCH_CHECK(kv_lens.empty() || static_cast<int64_t>(kv_lens.size()) == n_rows,
              "PackedQueries: kv_lens needs one entry per row");
  TORCH_CHECK(mode != KvMode::kPrefix || static_cast<int64_t>(prefix_lens.size()) == n_rows,
              "PackedQueries: prefix mode needs one prefix_lens entry per row");
  TORCH_CHECK(key_offsets.empty() || (static_cast<int64_t>(key_offsets.size()) == n_rows + 1 && mode != KvMode::kFull),
              "PackedQueries: key lists need mode dual or prefix and one list per row");
  int64_t at_ = 0;
  auto take = [&](size_t n) {
    at::Tensor t = buffer.narrow(0, at_, static_cast<int64_t>(n));
    at_ += static_cast<int64_t>(n);
    return t;
  };
  ForwardBatch b;
  b.tokens = take(gather.size());
  b.positions = take(positions.size());
  b.cu_seqlens = take(cu_seqlens.size());
  b.kv_rows = take(kv_rows.size());
  if (mode == KvMode::kPrefix) b.prefix_lens = take(prefix_lens.size());
  b.kv_lens = take(kv_lens.size());
  b.key_offsets = take(key_offsets.size());
  b.key_index = take(key_index.size());
  b.logit_index = take(logit_index.size());
  b.mode = mode;
  b.key_layers = key_layers;
  b.query_capture = query_capture;
  b.row_keep_layer = row_keep_layer;
  b.row_keep = row_keep;
  for (int64_t p : positions) b.max_positions = std::max(b.max_positions, p + 1);
  return b;
}

ForwardBatch PackedQueries::batch(const at::Tensor& buffer, const KvRows& kv, KvMode mode,
                                  const at::Tensor& canvas) const {
  TORCH_CHECK(canvas.defined(), "PackedQueries: the canvas to gather tokens from is required");
  ForwardBatch b = views(buffer, mode);
  b.tokens = canvas.reshape({-1}).index_select(0, b.tokens);
  if (!kv.defined()) b.kv_rows = at::Tensor();
  if (kv_lens.empty()) b.kv_lens = at::Tensor();
  if (key_offsets.empty()) b.key_offsets = b.key_index = at::Tensor();
  if (logit_index.empty()) b.logit_index = at::Tensor();
  if (mode == KvMode::kDual && !b.kv_lens.defined() && kv.lens.defined()) b.kv_lens = kv.lens.narrow(0, 0, rows());
  b.kv = kv.kv;
  b.kv_pages = kv.pages;
  b.kv_write_pages = kv.write_pages;
  return b;
}

Proposals sample_proposals(const at::Tensor& l64, int64_t mask_id, double temperature, at::Generator& generator) {
  // Fast-dLLM's Gumbel-max: argmax(exp(l) / (-log u)^T), u ~ U(0, 1) in float64.
  at::Tensor noise = at::rand(l64.sizes(), generator, at::TensorOptions().dtype(at::kDouble));
  at::Tensor score = at::div(l64.exp(), at::pow(at::neg(at::log(noise)), temperature));
  score.select(1, mask_id).fill_(-std::numeric_limits<double>::infinity());
  at::Tensor token = at::argmax(score, -1);
  at::Tensor conf = at::softmax(l64, -1).gather(-1, token.unsqueeze(-1)).squeeze(-1);
  return to_proposals(token, conf);
}

Proposals to_proposals(const at::Tensor& token, const at::Tensor& conf) {
  Proposals p;
  const int64_t n = token.numel();
  p.token.assign(token.const_data_ptr<int64_t>(), token.const_data_ptr<int64_t>() + n);
  p.conf.assign(conf.const_data_ptr<double>(), conf.const_data_ptr<double>() + n);
  return p;
}

at::Tensor pack_readout(const std::vector<at::Tensor>& tensors) {
  if (tensors.empty()) return at::empty({0}, at::kLong);  // a step that reads nothing back
  std::vector<at::Tensor> flat;
  for (const at::Tensor& t : tensors) {
    TORCH_CHECK(t.element_size() == 8, "readout: 8-byte elements expected, got ", t.scalar_type());
    flat.push_back(t.contiguous().view(at::kLong).reshape({-1}));
  }
  return at::cat(flat);
}

std::vector<at::Tensor> unpack_readout(const at::Tensor& host_flat, const std::vector<at::Tensor>& like) {
  std::vector<at::Tensor> out;
  int64_t at_ = 0;
  for (const at::Tensor& t : like) {
    out.push_back(host_flat.narrow(0, at_, t.numel()).view(t.scalar_type()).view(t.sizes()));
    at_ += t.numel();
  }
  return out;
}

std::vector<at::Tensor> read_back(const std::vector<at::Tensor>& tensors) {
  bool on_host = true;
  for (const at::Tensor& t : tensors) on_host = on_host && t.is_cpu();
  if (!on_host) return unpack_readout(pack_readout(tensors).cpu(), tensors);  // the one copy
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : tensors) out.push_back(t.contiguous());
  return out;
}

}  // namespace blockbatch
