// A BlockBatch request's KV rows, one per branch, and the copies between them (init, leader sync,
// a folded twin; docs/ALGORITHMS.md sections 12.3, 12.4):
//   dense rows: a copy moves the whole row (kv_copy_rows_);
//   paged rows: a copy is the source row's page-table entries (copy on write): the rows then name
//     the same pages, and before each forward every page a row writes that another row still
//     names is replaced by a page of the request's own (its contents copied first unless the
//     forward rewrites the whole row). The request never holds more pages than it was given: a
//     page no row names any more is the next one a write takes.
// With share_prompt_kv (paged only) the complete pages of the prompt positions that only a full
// forward writes, [0, prompt - logit_shift) (shared_prompt_pages), are the same pages in every row
// (held once): a full forward (init, refresh) writes them through one row, the owner (the first row
// it feeds), and after it the owner's prompt slots past them are copied into every other row's own
// page. So after each init and refresh, positions [0, prompt) of every row hold the owner's K/V,
// whatever the page length, and a block step writes only its own row: Dream's (logit shift 1) feeds
// its window from position start - 1, so its first window writes the last prompt position, which
// therefore never lies on a shared page (the reference: python/blockbatch/reference/blockbatch.py).
// Every copy is exact: a row reads the K/V it would read after a dense copy.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <vector>

#include "decode/options.h"
#include "decode/step.h"
#include "model/network.h"

namespace blockbatch {

// Pages every KV row of a request shares in a pool of pages of `page_len` positions: with
// share_prompt_kv (policy blockbatch, paged), the complete pages of the prompt positions no block
// step writes, [0, prompt_len - logit_shift); otherwise 0. The scheduler's pool and BranchRows
// both take it from here.
int64_t shared_prompt_pages(const Network& model, const DecodeOptions& resolved, int64_t prompt_len, int64_t page_len);

class BranchRows {
 public:
  // kv: the request's rows as a scheduler's pool gave them (dense, or paged: shared_prompt_pages(...)
  // pages shared), or undefined: made here (dense; share_prompt_kv: pages of kDefaultKvPageLen
  // positions, the request's own store). share_prompt_kv refuses dense rows by name.
  BranchRows(const Network& model, KvRows& kv, int64_t rows, int64_t prompt_len, int64_t length,
             const DecodeOptions& o);

  bool paged() const { return page_len_ > 0; }
  const KvRows& kv() const { return kv_; }

  // Row b takes row src[b]'s K/V (src: int64 [rows], -1 keeps), on the device and fit for a CUDA
  // graph: dense rows are copied; paged rows take the source's page-table entries (what they
  // read; where they write follows at the next before_forward). Paged: the host must hear of the
  // same copy (copied) before the next forward.
  void copy_on_device(const at::Tensor& src);
  // The host side of a copy_on_device (paged: the host's tables follow; dense: nothing). In order.
  void copied(const std::vector<int64_t>& src);
  // A copy the host decides: both.
  void copy(const std::vector<int64_t>& src);

  // Before a forward over `q` (its rows' positions are the writes): paged, every page written that
  // another row names is made the row's own (copied unless `whole`: the forward writes every
  // position of its rows' canvases), and the tables go to the device when they changed. With
  // share_prompt_kv, a full forward (init, refresh) writes the shared prompt pages through `owner`
  // (the first row it feeds), whose prompt slots after_full copies.
  void before_forward(const PackedQueries& q, bool whole, int64_t owner = -1);
  // share_prompt_kv, after a full forward: the owner's prompt slots past the shared pages into every
  // other row's.
  void after_full();

  // Pages copied on write so far (paged; a dense copy moves whole rows: 0).
  int64_t pages_copied() const { return pages_copied_; }

 private:
  int64_t at(int64_t row, int64_t i) const { return row * per_row_ + i; }
  void drop(int64_t page);
  void push();

  KvRows& kv_;
  const int64_t rows_, page_len_, per_row_, shared_, plen_;  // plen_: the prompt length (0: no sharing)
  std::vector<int64_t> read_, write_;                        // paged: the host's copy of the tables [rows, per_row]
  std::vector<int64_t> pinned_;                              // share_prompt_kv: the shared prompt pages (never copied)
  std::map<int64_t, int64_t> names_;                         // paged: how many table entries name each page not pinned
  std::vector<int64_t> spare_;                               // paged: pages no row names (the next writes take them)
  int64_t owner_ = 0, pages_copied_ = 0;
  bool dirty_ = false;
};

}  // namespace blockbatch
