#include "decode/policies/shared_prompt.h"

#include <ATen/ops/from_blob.h>
#include <ATen/ops/full.h>
#include <c10/util/Exception.h>

namespace blockbatch {

SharedPromptKv::SharedPromptKv(const Network& model, KvRows& kv, int64_t rows, int64_t prompt_len, int64_t length)
    : kv_(kv), rows_(rows), page_len_(kv.defined() ? (kv.pages.defined() ? kv.kv.size(4) : 0) : kDefaultKvPageLen),
      shared_(page_len_ > 0 ? prompt_len / page_len_ : 0), tail_(page_len_ > 0 ? prompt_len % page_len_ : 0) {
  TORCH_CHECK_VALUE(page_len_ > 0, "share_prompt_kv needs paged KV rows (a scheduler with kv_page_len > 0)");
  if (!kv.defined()) {  // alone: the request's own page store
    const int64_t per_row = (length + page_len_ - 1) / page_len_;
    const int64_t pages = shared_ + rows * (per_row - shared_);
    std::vector<int64_t> order(static_cast<size_t>(pages));
    for (int64_t i = 0; i < pages; ++i) order[static_cast<size_t>(i)] = i;
    const PageTables t = page_tables(order, rows, per_row, per_row, shared_);
    const auto idx = at::TensorOptions().dtype(at::kLong).device(model.device());
    kv.kv = model.new_kv(pages, page_len_);
    kv.pages = at::from_blob(const_cast<int64_t*>(t.read.data()), {rows, per_row}, at::kLong).to(idx, false, true);
    kv.write_pages =
        at::from_blob(const_cast<int64_t*>(t.write.data()), {rows, per_row}, at::kLong).to(idx, false, true);
    kv.lens = at::full({rows}, length, idx);  // whole pages past the canvas: a dual row attends `length` keys
  }
  TORCH_CHECK(kv.write_pages.defined(), "share_prompt_kv: the KV rows have no write table");
  // The page ids, read once: the shared ones (row 0's) and each row's partial prompt page.
  const at::Tensor table = kv.pages.cpu();
  const int64_t* t = table.const_data_ptr<int64_t>();
  const int64_t per_row = table.size(1);
  for (int64_t i = 0; i < shared_; ++i) shared_pages_.push_back(t[i]);
  if (tail_ > 0) {
    for (int64_t r = 0; r < rows; ++r) tail_pages_.push_back(t[r * per_row + shared_]);
  }
}

void SharedPromptKv::before_full(int64_t owner) {
  if (owner == owner_ || shared_ == 0) return;
  std::vector<int64_t> entries(static_cast<size_t>(rows_ * shared_), -1);
  for (int64_t i = 0; i < shared_; ++i) entries[static_cast<size_t>(owner * shared_ + i)] = shared_pages_[i];
  kv_.write_pages.narrow(1, 0, shared_)
      .copy_(at::from_blob(entries.data(), {rows_, shared_}, at::kLong).to(kv_.pages.device(), false, true));
  owner_ = owner;
}

void SharedPromptKv::after_full(int64_t owner) {
  if (tail_ == 0) return;
  const at::Tensor from = kv_.kv.narrow(0, tail_pages_[owner], 1).narrow(4, 0, tail_);
  for (int64_t r = 0; r < rows_; ++r) {
    if (r != owner) kv_.kv.narrow(0, tail_pages_[r], 1).narrow(4, 0, tail_).copy_(from);
  }
}

}  // namespace blockbatch
