#include "decode/batch/kv_pool.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/full.h>
#include <ATen/ops/index_fill.h>
#include <c10/core/StreamGuard.h>
#include <c10/util/Exception.h>

#include <vector>

#include "decode/batch/pack.h"         // default_stream_of
#include "decode/batch/pool_sizing.h"  // ceil_div

namespace blockbatch {

KvPool::KvPool(const Network& model, int64_t capacity, int64_t max_length, int64_t page_len, int64_t table_rows,
               bool scratch)
    : capacity_(capacity), max_length_(max_length), page_len_(page_len),
      per_row_(page_len > 0 ? ceil_div(max_length, page_len) : 1), table_rows_(page_len > 0 ? table_rows : capacity) {
  TORCH_CHECK_VALUE(capacity >= 0 && max_length > 0 && page_len >= 0 && table_rows >= 0,
                    "KvPool: capacity, table_rows, page_len >= 0 and max_length > 0");
  const c10::OptionalStreamGuard on(default_stream_of(model.device()));  // the pool where it is used
  const int64_t slot = paged() ? page_len_ : max_length_;                // positions per page (dense: row)
  const int64_t all = capacity + (scratch ? per_row_ : 0);
  if (all == 0) return;
  // Uninitialised: take() zeroes what it hands out, so the pages of rows never used are never
  // touched (an mmap'd CPU allocation then takes no memory for them).
  const at::Tensor like = model.new_kv(0, slot);  // the layout (and the length's check)
  std::vector<int64_t> shape = like.sizes().vec();
  shape[0] = all;
  double bytes = static_cast<double>(c10::elementSize(like.scalar_type()));
  for (int64_t d : shape) bytes *= static_cast<double>(d);
  try {
    store_ = at::empty(shape, like.options());
  } catch (const c10::Error& e) {  // OutOfMemoryError (CUDA), the CPU allocator's enforce
    TORCH_CHECK_VALUE(false, "the KV pool of ", all, paged() ? " pages of " : " rows of ", slot, " positions (",
                      bytes / static_cast<double>(int64_t{1} << 30), " GiB) cannot be allocated on ", model.device(),
                      ": lower kv_budget_bytes, max_batch or max_length (", e.what_without_backtrace(), ")");
  }
  if (scratch) store_.narrow(0, capacity, per_row_).zero_();  // every padded pack writes it
  if (!paged()) return;
  table_ = at::full({table_rows_ + (scratch ? 1 : 0), per_row_}, -1, like.options().dtype(at::kLong));
  if (scratch) {
    std::vector<int64_t> own(static_cast<size_t>(per_row_));
    for (int64_t i = 0; i < per_row_; ++i) own[static_cast<size_t>(i)] = capacity + i;
    table_.narrow(0, table_rows_, 1).copy_(at::from_blob(own.data(), {1, per_row_}, at::kLong));
  }
  write_table_ = table_.clone();
  free_pages_.reserve(static_cast<size_t>(capacity));
  for (int64_t p = capacity - 1; p >= 0; --p) free_pages_.push_back(p);  // the lowest on top
}

int64_t KvPool::pages_for(int64_t rows, int64_t length, int64_t shared) const {
  return paged() ? shared + rows * (ceil_div(length, page_len_) - shared) : rows;
}

bool KvPool::fits(int64_t rows, int64_t length, int64_t shared) const {
  return rows <= table_rows_ && length <= max_length_ && pages_for(rows, length, shared) <= capacity_;
}

std::optional<int64_t> KvPool::first_fit(int64_t rows, int64_t limit) const {
  int64_t at = 0;  // the ranges in row order
  for (const auto& [first, n] : taken_) {
    if (first - at >= rows) break;
    at = first + n;
  }
  if (at + rows > limit) return std::nullopt;
  return at;
}

void KvPool::cache_counters() {
  cache_blocks_ = cache_.blocks();
  cache_pages_ = cache_.pages();
  cache_evicted_ = cache_.evicted();
}

std::optional<KvPool::Lease> KvPool::take(int64_t rows, int64_t length, int64_t shared, const Prefix* prefix) {
  TORCH_CHECK_VALUE(shared >= 0 && (shared == 0 || (paged() && shared <= length / page_len_)),
                    "KvPool: shared pages must be whole pages of the canvas, in a paged pool");
  TORCH_CHECK_VALUE(rows >= 1 && fits(rows, length, shared), "a request needs ", rows, " KV rows of ", length,
                    " positions (", pages_for(rows, length, shared), paged() ? " pages" : " rows",
                    ") but the KV pool holds ", capacity_, paged() ? " pages" : " rows",
                    " (raise kv_budget_bytes, or decode it with fewer block sizes)");
  const std::optional<int64_t> at = first_fit(rows, table_rows_);
  if (!at) return std::nullopt;
  Lease lease{*at, rows, {}, {}};
  if (!paged()) {
    lease.kv.kv = store_.narrow(0, *at, rows);
    lease.kv.kv.zero_();  // as a fresh buffer: nothing of an earlier request is ever read
  } else {
    const int64_t per = ceil_div(length, page_len_);
    const bool cached = prefix != nullptr && prefix->block > 0 && rows == 1 && shared == 0;
    TORCH_CHECK(!cached || (prefix->block % page_len_ == 0 && prefix->blocks * prefix->block <= length),
                "KvPool: a prefix-cache request's blocks must be whole pages of its canvas");
    if (cached) lease.hit = cache_.match(prefix->block, *prefix->prompt, prefix->blocks);  // pinned
    std::vector<int64_t> hit_pages;
    for (const PrefixCache::Node* n : lease.hit) hit_pages.insert(hit_pages.end(), n->pages.begin(), n->pages.end());
    const int64_t need = pages_for(rows, length, shared) - static_cast<int64_t>(hit_pages.size());
    while (static_cast<int64_t>(free_pages_.size()) < need) {  // the least recently used cached blocks go
      const std::vector<int64_t> freed = cache_.evict();
      if (freed.empty()) break;
      free_pages_.insert(free_pages_.end(), freed.begin(), freed.end());
    }
    cache_counters();
    if (static_cast<int64_t>(free_pages_.size()) < need) {
      cache_.unpin(lease.hit);
      return std::nullopt;
    }
    for (int64_t i = 0; i < need; ++i) {
      lease.pages.push_back(free_pages_.back());
      free_pages_.pop_back();
    }
    // Each row reads and writes its own pages; the shared ones are row 0's, written through it; a
    // prefix-cache hit's pages come first and are never written.
    std::vector<int64_t> order = hit_pages;
    order.insert(order.end(), lease.pages.begin(), lease.pages.end());
    PageTables t = page_tables(order, rows, per_row_, per, shared);
    for (size_t i = 0; i < hit_pages.size(); ++i) t.write[i] = -1;
    if (cached) {
      lease.prefix = *prefix;
      lease.kv.cached = static_cast<int64_t>(lease.hit.size()) * prefix->block;
      hit_tokens_ += lease.kv.cached;
    }
    at::Tensor table = table_.narrow(0, *at, rows);
    table.copy_(at::from_blob(t.read.data(), {rows, per_row_}, at::kLong));
    at::Tensor writes = write_table_.narrow(0, *at, rows);
    writes.copy_(at::from_blob(t.write.data(), {rows, per_row_}, at::kLong));
    const at::Tensor pages = at::from_blob(lease.pages.data(), {need}, at::kLong).to(store_.device(), false, true);
    store_.index_fill_(0, pages, 0);  // as fresh pages: nothing of an earlier request is ever read
    lease.kv.kv = store_;
    lease.kv.pages = table;
    lease.kv.write_pages = writes;
  }
  taken_[*at] = rows;
  in_use_ += paged() ? static_cast<int64_t>(lease.pages.size()) : rows;
  rows_ += rows;
  return lease;
}

void KvPool::publish(Lease& lease) {
  if (lease.published || lease.prefix.block == 0) return;
  lease.published = true;
  // Its blocks past the hit: the first pages it took, in position order (take()'s table).
  const int64_t per_block = lease.prefix.block / page_len_;
  const int64_t fresh = (lease.prefix.blocks - static_cast<int64_t>(lease.hit.size())) * per_block;
  const std::vector<int64_t> blocks(lease.pages.begin(), lease.pages.begin() + fresh);
  PrefixCache::Inserted in =
      cache_.insert(lease.prefix.block, *lease.prefix.prompt, lease.prefix.blocks, per_block, lease.hit, blocks);
  lease.hit.insert(lease.hit.end(), in.nodes.begin(), in.nodes.end());
  std::vector<int64_t> own;  // the pages still its own (its other blocks; a block cached first by another)
  for (size_t i = 0; i < lease.pages.size(); ++i) {
    if (static_cast<int64_t>(i) >= fresh || !in.kept[i]) own.push_back(lease.pages[i]);
  }
  in_use_ -= static_cast<int64_t>(lease.pages.size() - own.size());
  lease.pages = std::move(own);
  cache_counters();
}

void KvPool::give_back(const Lease& lease) {
  if (!taken_.erase(lease.first)) return;
  rows_ -= lease.rows;
  if (!paged()) {
    in_use_ -= lease.rows;
    return;
  }
  table_.narrow(0, lease.first, lease.rows).fill_(-1);  // no row names a page it gave back
  write_table_.narrow(0, lease.first, lease.rows).fill_(-1);
  cache_.unpin(lease.hit);
  cache_counters();
  for (auto it = lease.pages.rbegin(); it != lease.pages.rend(); ++it) free_pages_.push_back(*it);
  in_use_ -= static_cast<int64_t>(lease.pages.size());
}

}  // namespace blockbatch
