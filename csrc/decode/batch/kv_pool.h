// The KV memory many requests share (decode/batch/scheduler.h): one pool
// [rows, layers, 2, kv_heads, max_length, head_dim] sized from a byte budget, handing out
// contiguous row ranges (first fit), each zeroed as it is handed out.
//
// The pool is allocated uninitialised and each range is zeroed when it is taken (the scratch row
// at once), so no forward reads a row that was not zeroed, and the memory the pool holds (the pages
// touched) grows with the rows used, not with the budget: a server sized for 500 requests does not
// hold their KV at start.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <optional>

#include "model/network.h"

namespace blockbatch {

class KvPool {
 public:
  // rows: the rows requests may take; scratch: one more, the scratch row of padded packs
  // (decode/batch/pack.h), which no request owns. A pool that cannot be allocated throws
  // c10::ValueError naming its size.
  KvPool(const Network& model, int64_t rows, int64_t max_length, bool scratch);

  struct Lease {
    int64_t first = 0, rows = 0;
    at::Tensor view;  // [rows, layers, 2, kv_heads, max_length, head_dim], zeroed
  };
  // `rows` contiguous rows (>= 1, <= rows()), or nullopt while they are not free.
  std::optional<Lease> take(int64_t rows);
  void give_back(const Lease& lease);

  int64_t rows() const { return rows_; }
  int64_t in_use() const { return in_use_.load(); }  // any thread
  int64_t max_length() const { return max_length_; }
  int64_t scratch_row() const { return rows_; }  // valid when built with scratch
  const at::Tensor& tensor() const { return pool_; }

 private:
  const int64_t rows_, max_length_;
  at::Tensor pool_;
  std::map<int64_t, int64_t> taken_;  // first row -> rows
  std::atomic<int64_t> in_use_{0};
};

}  // namespace blockbatch
