// The KV memory many requests share (decode/batch/scheduler.h), sized from a byte budget, in one of
// two layouts:
//   dense (page_len 0): rows [rows, layers, 2, kv_heads, max_length, head_dim]; a request takes a
//     contiguous range of rows (first fit), each of the pool's full length;
//   paged (page_len > 0): a page store [pages, layers, 2, kv_heads, page_len, head_dim] and a page
//     table [table rows, length / page_len] on the device; a request takes a contiguous range of
//     table rows and, per row, the pages its canvas needs (ceil(canvas length / page_len), any free
//     ones); the entries past its canvas are -1 (no page). The budget counts pages, so a short
//     request holds short rows (ALGORITHMS.md section 12).
//
// The memory is allocated uninitialised and what a request takes is zeroed when it is taken (the
// scratch row at once), so no forward reads K/V of an earlier request, and the memory the pool
// touches grows with the rows used, not with the budget.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

#include "decode/batch/prefix_cache.h"
#include "decode/step.h"  // KvRows
#include "model/network.h"

namespace blockbatch {

class KvPool {
 public:
  // Dense: `capacity` rows of max_length positions. Paged: `capacity` pages of page_len positions
  // and `table_rows` page-table rows of ceil(max_length / page_len) pages. scratch: one more row
  // (with its own pages), the scratch row of padded packs (decode/batch/pack.h), which no request
  // owns. A pool that cannot be allocated throws c10::ValueError naming its size.
  KvPool(const Network& model, int64_t capacity, int64_t max_length, int64_t page_len, int64_t table_rows,
         bool scratch);

  // A request that may read and feed the prefix cache: one KV row, the prompt's first `blocks`
  // complete blocks of `block` positions (a multiple of the page length).
  struct Prefix {
    int64_t block = 0, blocks = 0;
    const std::vector<int64_t>* prompt = nullptr;
  };
  struct Lease {
    int64_t first = 0, rows = 0;          // rows [first, first + rows) of the pool (dense) or of its table
    std::vector<int64_t> pages;           // paged: the pages it holds (not the cached ones it reads)
    KvRows kv;                            // dense: its rows' view; paged: the store and its table rows' view
    Prefix prefix;                        // prefix cache: what it read and may feed (block 0: none)
    std::vector<PrefixCache::Node*> hit;  // the cached blocks it reads (pinned), then those it published
    bool published = false;
  };
  // `rows` KV rows for a canvas of `length` positions (rows >= 1, fits()), zeroed, or nullopt while
  // they are not free. shared (paged): the first `shared` pages of every row are the same pages
  // (share_prompt_kv: the prompt's complete pages); the lease's write table names them in its first
  // row only until its holder says otherwise.
  // prefix (paged, one row): its first cached complete prompt blocks are read from the cache
  // (kv.cached positions; never written), the rest taken as usual; least recently used cached
  // blocks are evicted while pages are short.
  std::optional<Lease> take(int64_t rows, int64_t length, int64_t shared = 0, const Prefix* prefix = nullptr);
  void give_back(const Lease& lease);
  // After the request's first forward (a Prefix lease): its complete prompt blocks hold their final
  // K/V, so they join the prefix cache (their pages now the cache's, pinned while it runs) and any
  // request taken later may read them. Once per lease.
  void publish(Lease& lease);
  // Whether `rows` rows of `length` positions (`shared` pages common) fit the pool when nothing
  // else holds any.
  bool fits(int64_t rows, int64_t length, int64_t shared = 0) const;
  // Pages (dense: rows) `rows` rows of `length` positions hold, `shared` of each row's common.
  int64_t pages_for(int64_t rows, int64_t length, int64_t shared = 0) const;

  bool paged() const { return page_len_ > 0; }
  int64_t page_len() const { return paged() ? page_len_ : max_length_; }
  int64_t per_row() const { return per_row_; }          // pages a row of max_length positions takes (dense: 1)
  int64_t capacity() const { return capacity_; }        // pages (dense: rows)
  int64_t in_use() const { return in_use_.load(); }     // pages (dense: rows) taken; any thread
  int64_t rows_in_use() const { return rows_.load(); }  // KV rows taken; any thread
  int64_t max_length() const { return max_length_; }
  // The KV row padded packs write (the dense pool's last row, or the table's).
  int64_t scratch_row() const { return paged() ? table_rows_ : capacity_; }
  const at::Tensor& tensor() const { return store_; }             // the rows (dense) or the page store
  const at::Tensor& table() const { return table_; }              // paged: [table rows (+ scratch), pages per row]
  const at::Tensor& write_table() const { return write_table_; }  // paged: where each row's writes go
  // The prefix cache: blocks and pages held, blocks evicted, positions requests read from it.
  int64_t cached_blocks() const { return cache_blocks_.load(); }  // any thread
  int64_t cached_pages() const { return cache_pages_.load(); }
  int64_t evicted_blocks() const { return cache_evicted_.load(); }
  int64_t hit_tokens() const { return hit_tokens_.load(); }

 private:
  std::optional<int64_t> first_fit(int64_t rows, int64_t limit) const;

  const int64_t capacity_, max_length_, page_len_, per_row_, table_rows_;
  at::Tensor store_, table_, write_table_;
  std::map<int64_t, int64_t> taken_;  // first row -> rows (dense: pool rows; paged: table rows)
  std::vector<int64_t> free_pages_;   // paged: a stack, lowest page on top
  std::atomic<int64_t> in_use_{0}, rows_{0};
  PrefixCache cache_;
  std::atomic<int64_t> cache_blocks_{0}, cache_pages_{0}, cache_evicted_{0}, hit_tokens_{0};
  void cache_counters();
};

}  // namespace blockbatch
