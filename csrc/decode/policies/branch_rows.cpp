#include "decode/policies/branch_rows.h"

#include <ATen/ops/from_blob.h>
#include <ATen/ops/full.h>
#include <ATen/ops/index_copy.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/where.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "model/families.h"
#include "ops/ops.h"

namespace blockbatch {

int64_t shared_prompt_pages(const Network& model, const DecodeOptions& o, int64_t prompt_len, int64_t page_len) {
  if (o.policy != Policy::kBlockBatch || !o.share_prompt_kv || page_len <= 0) return 0;
  // A block step feeds its window [start, end) from start - logit_shift, and start >= prompt_len.
  const int64_t fixed = prompt_len - family_spec(model.config().family).logit_shift;
  return fixed > 0 ? fixed / page_len : 0;
}

namespace {
at::Tensor to_device(std::vector<int64_t>& v, at::IntArrayRef shape, const at::Device& device) {
  return at::from_blob(v.data(), shape, at::kLong).to(device, false, /*copy=*/true);
}
int64_t page_len_of(const KvRows& kv, bool share_prompt) {
  if (!kv.defined()) return share_prompt ? kDefaultKvPageLen : 0;
  return kv.pages.defined() ? kv.kv.size(4) : 0;
}
}  // namespace

BranchRows::BranchRows(const Network& model, KvRows& kv, int64_t rows, int64_t prompt_len, int64_t length,
                       const DecodeOptions& o)
    : kv_(kv), rows_(rows), page_len_(page_len_of(kv, o.share_prompt_kv)),
      per_row_(page_len_ > 0 ? (kv.pages.defined() ? kv.pages.size(1) : (length + page_len_ - 1) / page_len_) : 0),
      shared_(shared_prompt_pages(model, o, prompt_len, page_len_)),
      plen_(o.share_prompt_kv && page_len_ > 0 ? prompt_len : 0) {
  const bool share_prompt = o.share_prompt_kv;
  TORCH_CHECK_VALUE(!share_prompt || page_len_ > 0,
                    "share_prompt_kv needs paged KV rows (a scheduler with kv_page_len > 0)");
  if (!paged()) {
    if (!kv.defined()) kv = KvRows{model.new_kv(rows, length), {}};
    return;
  }
  if (!kv.defined()) {  // share_prompt alone: the request's own page store
    const int64_t pages = shared_ + rows * (per_row_ - shared_);
    std::vector<int64_t> order(static_cast<size_t>(pages));
    for (int64_t i = 0; i < pages; ++i) order[static_cast<size_t>(i)] = i;
    PageTables t = page_tables(order, rows, per_row_, per_row_, shared_);
    kv.kv = model.new_kv(pages, page_len_);
    kv.pages = to_device(t.read, {rows, per_row_}, model.device());
    kv.write_pages = to_device(t.write, {rows, per_row_}, model.device());
    kv.lens = at::full({rows}, length, at::TensorOptions().dtype(at::kLong).device(model.device()));
  }
  // The tables, read once; from here on the host keeps them and the device follows.
  const at::Tensor r = kv.pages.cpu().contiguous();
  read_.assign(r.const_data_ptr<int64_t>(), r.const_data_ptr<int64_t>() + r.numel());
  if (kv.write_pages.defined()) {
    const at::Tensor w = kv.write_pages.cpu().contiguous();
    write_.assign(w.const_data_ptr<int64_t>(), w.const_data_ptr<int64_t>() + w.numel());
  } else {
    write_ = read_;
  }
  pinned_.assign(read_.begin(), read_.begin() + shared_);
  for (int64_t b = 0; b < rows_; ++b) {
    for (int64_t i = shared_; i < per_row_; ++i) {
      if (read_[at(b, i)] >= 0) names_[read_[at(b, i)]] += 1;
    }
  }
}

void BranchRows::copy_on_device(const at::Tensor& src) {
  if (!paged()) return ops::kv_copy_rows_(kv_.kv, src, std::nullopt);
  const at::Tensor& t = kv_.pages;
  t.copy_(at::where(src.ge(0).unsqueeze(1), t.index_select(0, src.clamp_min(0)), t));
}

void BranchRows::drop(int64_t page) {
  auto it = names_.find(page);
  if (--it->second > 0) return;
  names_.erase(it);
  spare_.push_back(page);
}

void BranchRows::copied(const std::vector<int64_t>& src) {
  if (!paged()) return;
  const std::vector<int64_t> before = read_;  // every row copies what the rows held before the copy
  for (int64_t b = 0; b < rows_; ++b) {
    const int64_t s = src[static_cast<size_t>(b)];
    if (s < 0 || s == b) continue;
    for (int64_t i = shared_; i < per_row_; ++i) {
      const int64_t old = read_[at(b, i)], now = before[at(s, i)];
      if (old == now) continue;
      if (now >= 0) names_[now] += 1;
      if (old >= 0) drop(old);
      read_[at(b, i)] = write_[at(b, i)] = now;
      dirty_ = true;
    }
  }
}

void BranchRows::copy(const std::vector<int64_t>& src) {
  if (std::none_of(src.begin(), src.end(), [](int64_t s) { return s >= 0; })) return;
  if (!paged()) {
    std::vector<int64_t> s = src;
    return ops::kv_copy_rows_(kv_.kv, to_device(s, {rows_}, kv_.kv.device()), std::nullopt);
  }
  copied(src);
  push();
}

void BranchRows::before_forward(const PackedQueries& q, bool whole, int64_t owner) {
  if (!paged()) return;
  if (owner >= 0 && owner != owner_) {  // the prompt: written through the owner (the shared pages), copied from it
    for (int64_t b = 0; b < rows_; ++b) {
      for (int64_t i = 0; i < shared_; ++i) write_[at(b, i)] = b == owner ? pinned_[i] : -1;
    }
    owner_ = owner;
    dirty_ = shared_ > 0 || dirty_;
  }
  std::vector<int64_t> from, to;  // pages copied before the forward writes into the copies
  for (int64_t k = 0; k < q.rows(); ++k) {
    const int64_t b = q.kv_rows[k], begin = q.cu_seqlens[k], end = q.cu_seqlens[k + 1];
    if (begin == end) continue;
    const auto [lo, hi] = std::minmax_element(q.positions.begin() + begin, q.positions.begin() + end);
    for (int64_t i = std::max(*lo / page_len_, shared_); i <= *hi / page_len_; ++i) {
      const int64_t page = read_[at(b, i)];
      if (page < 0 || names_[page] == 1) continue;  // its own
      TORCH_CHECK(!spare_.empty(), "BranchRows: internal error: no spare page for a copy on write");
      const int64_t fresh = spare_.back();
      spare_.pop_back();
      names_[page] -= 1;
      names_[fresh] = 1;
      read_[at(b, i)] = write_[at(b, i)] = fresh;
      if (!whole) from.push_back(page), to.push_back(fresh);
      dirty_ = true;
    }
  }
  if (!from.empty()) {
    const at::Device d = kv_.kv.device();
    const int64_t n = static_cast<int64_t>(from.size());
    kv_.kv.index_copy_(0, to_device(to, {n}, d), kv_.kv.index_select(0, to_device(from, {n}, d)));
    pages_copied_ += n;
  }
  if (dirty_) push();
}

void BranchRows::push() {
  kv_.pages.copy_(at::from_blob(read_.data(), {rows_, per_row_}, at::kLong), /*non_blocking=*/false);
  if (kv_.write_pages.defined())
    kv_.write_pages.copy_(at::from_blob(write_.data(), {rows_, per_row_}, at::kLong), /*non_blocking=*/false);
  dirty_ = false;
}

void BranchRows::after_full() {
  // The prompt positions past the shared pages, [shared_ * page_len_, plen_), page by page.
  for (int64_t i = shared_; i * page_len_ < plen_; ++i) {
    const int64_t slots = std::min(page_len_, plen_ - i * page_len_), own = read_[at(owner_, i)];
    const at::Tensor from = kv_.kv.narrow(0, own, 1).narrow(4, 0, slots);
    std::vector<int64_t> done{own};  // a page several rows name takes the slots once
    for (int64_t b = 0; b < rows_; ++b) {
      const int64_t page = read_[at(b, i)];
      if (std::find(done.begin(), done.end(), page) != done.end()) continue;
      kv_.kv.narrow(0, page, 1).narrow(4, 0, slots).copy_(from);
      done.push_back(page);
    }
  }
}

}  // namespace blockbatch
