// CPU implementations of BlockBatch's bookkeeping ops (bb_absorb_, bb_coordinate_: the shared
// algorithms of csrc/kernels/branches.h, run serially) and of kv_copy_rows_ (leader sync's KV row
// copy). Unlike the CUDA kernels, they check the values they index by first and throw.
#include <ATen/Dispatch.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>

#include "kernels/branches.h"
#include "ops/checks.h"
#include "ops/impl.h"

namespace blockbatch {

namespace br = branches;

void bb_absorb_cpu(const at::Tensor& canvas, const at::Tensor& state, const at::Tensor& eos_prob,
                   const at::Tensor& map_ids, const at::Tensor& map_probs, const at::Tensor& spans,
                   const at::Tensor& token, const at::Tensor& conf, const at::Tensor& ids, const at::Tensor& probs,
                   const at::Tensor& logits, int64_t prompt_len, int64_t mask_id, int64_t eos_id, double threshold,
                   bool stop_on_eos) {
  const BranchTensors d = check_branches(canvas, state, eos_prob, map_ids, map_probs, prompt_len);
  check_absorb(d, canvas, spans, token, conf, ids, probs, logits);
  const br::View v = branch_view(canvas, state, eos_prob, map_ids, map_probs, prompt_len, mask_id, eos_id);
  if (stop_on_eos) check_eos_id(eos_id, logits.size(1));
  const int64_t* sp = spans.const_data_ptr<int64_t>();
  const int64_t rows = logits.size(0);
  for (int64_t i = 0; i < spans.size(0); ++i) {  // what the GPU kernel checks and skips (br::span_ok)
    const int64_t* s = sp + i * br::kSpanFields;
    const int64_t b = s[br::kSpanRow];
    TORCH_CHECK_VALUE(b >= 0 && b < d.B, "spans[", i, "]: branch ", b, " is not in [0, ", d.B, ")");
    check_window(v, b);
    const int64_t* st = v.st(b);
    TORCH_CHECK_VALUE(!st[br::kDone], "spans[", i, "]: branch ", b, " is done (state[", b, ", done] = 1)");
    TORCH_CHECK_VALUE(br::span_ok(v, s, rows), "spans[", i, "] = (row ", b, ", logits row ", s[br::kSpanLogitRow],
                      ", position ", s[br::kSpanFirstPos], ", rows ", s[br::kSpanRows], ") does not cover branch ", b,
                      "'s window [", st[br::kStart], ", ", st[br::kEnd], ") inside the canvas [", prompt_len, ", ", d.L,
                      ") and the ", rows, " logits rows");
  }
  const br::AbsorbParams p{threshold, stop_on_eos, logits.size(0)};
  BLOCKBATCH_DISPATCH_FLOATING(logits.scalar_type(), "bb_absorb_", [&] {
    const scalar_t* l = logits.const_data_ptr<scalar_t>();
    const int64_t vocab = logits.size(1);
    auto logit = [&](int64_t row, int64_t j) { return static_cast<double>(static_cast<float>(l[row * vocab + j])); };
    for (int64_t i = 0; i < spans.size(0); ++i) {
      br::absorb_span(br::SerialExec{}, v, sp + i * br::kSpanFields, token.const_data_ptr<int64_t>(),
                      conf.const_data_ptr<double>(), ids.const_data_ptr<int64_t>(), probs.const_data_ptr<double>(),
                      logit, vocab, p);
    }
  });
}

void bb_coordinate_cpu(const at::Tensor& canvas, const at::Tensor& state, const at::Tensor& eos_prob,
                       const at::Tensor& flags, const at::Tensor& sync_src, const at::Tensor& map_ids,
                       const at::Tensor& map_probs, int64_t prompt_len, int64_t mask_id, double merge_gate, bool merge,
                       bool sync, int64_t sync_gap, int64_t refresh_tokens, bool periodic_refresh) {
  const BranchTensors d = check_branches(canvas, state, eos_prob, map_ids, map_probs, prompt_len);
  check_coordinate(d, canvas, flags, sync_src);
  const br::View v = branch_view(canvas, state, eos_prob, map_ids, map_probs, prompt_len, mask_id, -1);
  for (int64_t b = 0; b < d.B; ++b) check_window(v, b);  // what the GPU kernel checks (br::state_ok)
  br::coordinate(br::SerialExec{}, v, flags.data_ptr<int64_t>(), sync_src.data_ptr<int64_t>(),
                 br::CoordinateParams{merge_gate, merge, sync, sync_gap, refresh_tokens, periodic_refresh});
}

void kv_copy_rows_cpu(const at::Tensor& kv, const at::Tensor& src, const std::optional<at::Tensor>& kv_pages) {
  check_kv_copy_rows(kv, src, kv_pages);
  // Dense: a row is one page of the whole row; paged: row r's page i is kv_pages[r, i].
  const cpu::KvPages pages = kv_copy_pages(kv, kv_pages);
  const int64_t rows = src.size(0), store = pages.store;
  const int64_t bytes = kv.numel() / std::max<int64_t>(store, 1) * kv.element_size();
  const int64_t* s = src.const_data_ptr<int64_t>();
  auto raw = [&](int64_t row, int64_t i) { return pages.pages ? pages.pages[row * pages.per_row + i] : row; };
  auto* base = static_cast<char*>(kv.data_ptr());
  for (int64_t r = 0; r < rows; ++r) {  // all before any copy: a bad table changes nothing
    TORCH_CHECK_VALUE(s[r] >= -1 && s[r] < rows, "src[", r, "] = ", s[r], " must be -1 (keep) or a row in [0, ", rows,
                      ")");
    if (s[r] < 0 || s[r] == r) continue;
    for (int64_t i = 0; i < pages.per_row; ++i)
      TORCH_CHECK_INDEX(raw(r, i) >= -1 && raw(r, i) < store && raw(s[r], i) >= -1 && raw(s[r], i) < store,
                        "kv_pages of rows ", r, " and ", s[r], " must name pages in [-1, ", store, ")");
  }
  for (int64_t r = 0; r < rows; ++r) {
    if (s[r] < 0 || s[r] == r) continue;
    for (int64_t i = 0; i < pages.per_row; ++i) {
      const int64_t to = pages.at(r, i), from = pages.at(s[r], i);
      if (to < 0 || from < 0 || to == from) continue;  // no page, or one both rows share
      std::memcpy(base + to * bytes, base + from * bytes, static_cast<size_t>(bytes));
    }
  }
}

}  // namespace blockbatch
