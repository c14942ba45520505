#include "model/network.h"

#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <set>

namespace blockbatch {

KvMode parse_kv_mode(const std::string& mode) {
  if (mode == "full") return KvMode::kFull;
  if (mode == "dual") return KvMode::kDual;
  if (mode == "prefix") return KvMode::kPrefix;
  TORCH_CHECK(false, "mode must be 'full', 'dual' or 'prefix', got '", mode, "'");
}

std::optional<c10::Device> check_weights(const std::vector<std::pair<std::string, std::vector<int64_t>>>& expected,
                                         const std::unordered_map<std::string, at::Tensor>& weights,
                                         const char* family) {
  std::set<std::string> names;
  std::optional<c10::Device> device;
  for (const auto& [name, shape] : expected) {
    names.insert(name);
    auto it = weights.find(name);
    TORCH_CHECK(it != weights.end(), "weights: tensor '", name, "' is missing");
    const at::Tensor& t = it->second;
    TORCH_CHECK(t.sizes() == c10::IntArrayRef(shape), "weights: tensor '", name, "' has shape ", t.sizes(),
                ", expected ", c10::IntArrayRef(shape));
    TORCH_CHECK(t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf,
                "weights: tensor '", name, "' has dtype ", t.scalar_type(), "; expected float32, bfloat16 or float16");
    if (!device) device = t.device();
    TORCH_CHECK(t.device() == *device, "weights: tensor '", name, "' is on ", t.device(), " but others are on ",
                *device);
  }
  for (const auto& [name, t] : weights) {
    TORCH_CHECK(names.count(name), "weights: unexpected tensor '", name, "' (not part of a ", family,
                " model with this config)");
  }
  return device;
}

at::Tensor zero_kv(const Network& net, const at::TensorOptions& options, int64_t rows, int64_t length) {
  const ModelConfig& c = net.config();
  TORCH_CHECK(rows >= 0, "rows must be >= 0, got ", rows);
  TORCH_CHECK(length > 0 && length <= c.max_sequence_length, "length = ", length, " must be in [1, ",
              c.max_sequence_length, "] (max_sequence_length)");
  return at::zeros({rows, c.n_layers, 2, c.n_kv_heads, length, c.head_dim()}, options);
}

at::Tensor Network::head(const at::Tensor&) const {
  TORCH_CHECK(false, "this network has no separate LM head (row_keep rankings need one)");
}

ForwardBatch contiguous_indices(const ForwardBatch& batch) {
  ForwardBatch b = batch;
  for (at::Tensor* t : {&b.tokens, &b.positions, &b.cu_seqlens, &b.kv_rows, &b.prefix_lens, &b.logit_index, &b.kv_lens,
                        &b.kv_pages, &b.kv_write_pages, &b.key_offsets, &b.key_index}) {
    if (t->defined() && !t->is_contiguous()) *t = t->contiguous();
  }
  return b;
}

void check_forward_batch(const Network& net, const ForwardBatch& b) {
  const ModelConfig& config_ = net.config();
  auto device = [&] { return net.device(); };
  auto dtype = [&] { return net.dtype(); };
  auto index_vector = [&](const at::Tensor& t, const char* name) {
    TORCH_CHECK(t.defined(), name, " is required");
    TORCH_CHECK(t.scalar_type() == at::kLong, name, " must be int64, got ", t.scalar_type());
    TORCH_CHECK(t.dim() == 1, name, " must be 1-D, got shape ", t.sizes());
    TORCH_CHECK(t.device() == device(), name, " is on ", t.device(), " but the model is on ", device());
  };
  index_vector(b.tokens, "tokens");
  index_vector(b.positions, "positions");
  index_vector(b.cu_seqlens, "cu_seqlens");
  const int64_t T = b.tokens.size(0);
  TORCH_CHECK(b.positions.size(0) == T, "positions must have ", T, " entries (one per token), got ",
              b.positions.size(0));
  TORCH_CHECK(b.cu_seqlens.size(0) >= 2, "cu_seqlens must have at least 2 entries (one row), got ",
              b.cu_seqlens.size(0));
  const int64_t R = b.cu_seqlens.size(0) - 1;
  int64_t max_pos = config_.max_sequence_length;
  if (b.kv.defined()) {
    const auto& c = config_;
    TORCH_CHECK(b.kv.dim() == 6 && b.kv.size(1) == c.n_layers && b.kv.size(2) == 2 && b.kv.size(3) == c.n_kv_heads &&
                    b.kv.size(5) == c.head_dim(),
                b.kv_pages.defined() ? "kv must be a page store [pages, " : "kv must be [rows, ", c.n_layers, ", 2, ",
                c.n_kv_heads, b.kv_pages.defined() ? ", page_len, " : ", L, ", c.head_dim(), "], got shape ",
                b.kv.sizes());
    TORCH_CHECK(b.kv.scalar_type() == dtype(), "kv dtype ", b.kv.scalar_type(), " differs from the model dtype ",
                dtype());
    TORCH_CHECK(b.kv.device() == device(), "kv is on ", b.kv.device(), " but the model is on ", device());
    TORCH_CHECK(b.kv.is_contiguous(), "kv must be contiguous");
    if (b.kv_pages.defined()) {
      TORCH_CHECK(b.kv_pages.scalar_type() == at::kLong && b.kv_pages.dim() == 2,
                  "kv_pages must be an int64 [KV rows, pages per row] table, got ", b.kv_pages.scalar_type(), " ",
                  b.kv_pages.sizes());
      TORCH_CHECK(b.kv_pages.device() == device(), "kv_pages is on ", b.kv_pages.device(), " but the model is on ",
                  device());
    }
    if (b.kv_write_pages.defined()) {
      TORCH_CHECK(b.kv_pages.defined() && b.kv_write_pages.sizes() == b.kv_pages.sizes() &&
                      b.kv_write_pages.scalar_type() == at::kLong && b.kv_write_pages.device() == device(),
                  "kv_write_pages must be an int64 table shaped like kv_pages, on the model's device");
    }
    max_pos = std::min(max_pos, b.kv_length());
  } else {
    TORCH_CHECK(b.mode == KvMode::kFull, "modes 'dual' and 'prefix' need a kv buffer");
    TORCH_CHECK(!b.kv_pages.defined(), "kv_pages needs a kv page store");
  }
  if (b.kv_rows.defined()) {
    index_vector(b.kv_rows, "kv_rows");
    TORCH_CHECK(b.kv_rows.size(0) == R, "kv_rows must have ", R, " entries (one per row), got ", b.kv_rows.size(0));
  } else if (b.kv.defined()) {
    TORCH_CHECK(b.kv_row_count() >= R, "kv has ", b.kv_row_count(), " rows but the batch has ", R,
                " rows and no kv_rows mapping");
  }
  if (b.mode == KvMode::kPrefix) {
    TORCH_CHECK(b.prefix_lens.defined(), "prefix_lens is required in mode 'prefix'");
    index_vector(b.prefix_lens, "prefix_lens");
    TORCH_CHECK(b.prefix_lens.size(0) == R, "prefix_lens must have ", R, " entries (one per row), got ",
                b.prefix_lens.size(0));
  }
  if (b.logit_index.defined()) index_vector(b.logit_index, "logit_index");
  if (b.kv_lens.defined()) {
    index_vector(b.kv_lens, "kv_lens");
    TORCH_CHECK(b.kv.defined(), "kv_lens needs a kv buffer");
    TORCH_CHECK(b.kv_lens.size(0) == R, "kv_lens must have ", R, " entries (one per row), got ", b.kv_lens.size(0));
  }
  TORCH_CHECK(b.key_offsets.defined() == b.key_index.defined(),
              b.key_index.defined() ? "key_index needs key_offsets" : "key_offsets needs key_index");
  if (b.key_index.defined()) {
    TORCH_CHECK(b.mode != KvMode::kFull, "key_index needs mode 'dual' or 'prefix' (a key set of the KV rows)");
    index_vector(b.key_index, "key_index");
    index_vector(b.key_offsets, "key_offsets");
    TORCH_CHECK(b.key_offsets.size(0) == R + 1, "key_offsets must have ", R + 1, " entries (rows + 1), got ",
                b.key_offsets.size(0));
    TORCH_CHECK(b.key_layers == 1 || (b.key_layers == config_.n_layers && b.key_index.size(0) % b.key_layers == 0),
                "key_layers must be 1 or n_layers (", config_.n_layers,
                ") with key_index a whole number of lists, got ", b.key_layers, " over ", b.key_index.size(0),
                " entries");
  }
  if (b.row_keep) {
    TORCH_CHECK(b.row_keep_layer >= 0 && b.row_keep_layer + 1 < config_.n_layers,
                "row_keep_layer must be in [0, n_layers - 1) = [0, ", config_.n_layers - 1, ") with row_keep, got ",
                b.row_keep_layer);
    TORCH_CHECK(!b.query_capture.defined(), "row_keep and query_capture do not combine (the capture reads every row)");
  }
  if (b.query_capture.defined()) {
    const ModelConfig& c = config_;
    TORCH_CHECK(b.query_capture.dim() == 4 && b.query_capture.size(0) == c.n_layers &&
                    b.query_capture.size(1) <= b.tokens.size(0) && b.query_capture.size(2) == c.n_heads &&
                    b.query_capture.size(3) == c.head_dim() && b.query_capture.scalar_type() == at::kFloat &&
                    b.query_capture.is_contiguous() && b.query_capture.device() == device(),
                "query_capture must be a contiguous float32 [n_layers, n <= tokens, n_heads, head_dim] on the model's "
                "device");
  }
  if (device().is_cpu()) {  // value checks need host data (key lists: packed_attention checks them)
    auto in_range = [](const at::Tensor& tensor, const char* name, int64_t lo, int64_t hi) {
      const at::Tensor t = tensor.contiguous();  // read what the view holds, whatever its strides
      const int64_t* p = t.const_data_ptr<int64_t>();
      for (int64_t i = 0; i < t.numel(); ++i) {
        TORCH_CHECK(p[i] >= lo && p[i] < hi, name, "[", i, "] = ", p[i], " is outside [", lo, ", ", hi, ")");
      }
    };
    in_range(b.tokens, "tokens", 0, config_.vocab_size);
    in_range(b.positions, "positions", 0, max_pos);
    const at::Tensor cu_seqlens = b.cu_seqlens.contiguous();
    const int64_t* cu = cu_seqlens.const_data_ptr<int64_t>();
    TORCH_CHECK(cu[0] == 0 && cu[R] == T, "cu_seqlens must start at 0 and end at the token count ", T);
    for (int64_t r = 0; r < R; ++r) {
      TORCH_CHECK(cu[r + 1] >= cu[r], "cu_seqlens must be non-decreasing at row ", r);
    }
    if (b.kv_rows.defined()) in_range(b.kv_rows, "kv_rows", 0, b.kv.defined() ? b.kv_row_count() : 0);
    if (b.mode == KvMode::kPrefix) in_range(b.prefix_lens, "prefix_lens", 0, b.kv_length() + 1);
    if (b.logit_index.defined()) in_range(b.logit_index, "logit_index", 0, T);
    if (b.kv_lens.defined()) in_range(b.kv_lens, "kv_lens", 1, b.kv_length() + 1);
    if (b.kv_pages.defined()) in_range(b.kv_pages, "kv_pages", -1, b.kv.size(0));
    if (b.kv_write_pages.defined()) in_range(b.kv_write_pages, "kv_write_pages", -1, b.kv.size(0));
  }
}

}  // namespace blockbatch
