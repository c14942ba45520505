// share_prompt_kv (docs/ALGORITHMS.md section 12): every BlockBatch branch reads one copy of the
// prompt's K/V. The prompt's complete pages are the same pages in every row (held once); a full
// forward (init, refresh) writes them through one row, the owner (the first row it feeds), and
// after it the owner's prompt slots of the last, partial prompt page are copied into every other
// row's. So after each init and refresh, positions [0, prompt) of every row hold the owner's K/V,
// whatever the page length (the reference: python/blockbatch/reference/blockbatch.py).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "decode/step.h"
#include "model/network.h"

namespace blockbatch {

class SharedPromptKv {
 public:
  // kv: the request's rows as a scheduler's paged pool gave them (shared_prompt_pages(...) pages
  // shared, a write table), or undefined: made here, in pages of kDefaultKvPageLen positions.
  // Dense rows are refused (the scheduler checks before).
  SharedPromptKv(const Network& model, KvRows& kv, int64_t rows, int64_t prompt_len, int64_t length);
  // Before a full forward: the shared pages written through `owner` only.
  void before_full(int64_t owner);
  // After it: the owner's prompt slots of the partial prompt page into every other row's.
  void after_full(int64_t owner);

 private:
  KvRows& kv_;
  const int64_t rows_, page_len_, shared_, tail_;   // tail_: prompt slots on the partial page
  std::vector<int64_t> shared_pages_, tail_pages_;  // the shared pages; each row's partial page
  int64_t owner_ = 0;                               // the row the write table writes them through
};

}  // namespace blockbatch
