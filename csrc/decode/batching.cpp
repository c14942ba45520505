#include "decode/batching.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <c10/core/StreamGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>

namespace blockbatch {

std::optional<c10::Stream> default_stream_of(c10::Device device) {
  if (device.is_cpu()) return std::nullopt;
  return c10::Stream(c10::Stream::DEFAULT, device);
}

SharedForward::SharedForward(const Network& model, int64_t pool_rows, int64_t max_length)
    : model_(model), pool_rows_(pool_rows), max_length_(max_length) {
  TORCH_CHECK_VALUE(pool_rows >= 0 && max_length > 0, "SharedForward: pool_rows >= 0 and max_length > 0");
  const c10::OptionalStreamGuard on(default_stream_of(model.device()));  // the pool zeroed where it is used
  if (pool_rows > 0) pool_ = model.new_kv(pool_rows, max_length);
}

SharedForward::~SharedForward() = default;

void SharedForward::join() const {
  std::lock_guard<std::mutex> lock(mutex_);
  ++decoding_;
}

void SharedForward::leave() const {
  std::unique_lock<std::mutex> lock(mutex_);
  --decoding_;
  auto it = owned_.find(std::this_thread::get_id());
  if (it != owned_.end()) {
    for (const void* p : it->second) allocations_.erase(p);
    owned_.erase(it);
  }
  cv_.notify_all();  // KV rows freed; the others may all have filed already
}

at::Tensor SharedForward::new_kv(int64_t rows, int64_t length) const {
  TORCH_CHECK_VALUE(rows >= 1 && length >= 1 && length <= max_length_, "new_kv: rows >= 1 and length in [1, ",
                    max_length_, "], got ", rows, " rows of ", length);
  TORCH_CHECK_VALUE(rows <= pool_rows_, "a request needs ", rows, " KV rows of ", max_length_,
                    " positions but the KV budget holds ", pool_rows_,
                    " (raise kv_budget_bytes, or decode it with fewer block sizes)");
  std::unique_lock<std::mutex> lock(mutex_);
  bool stepped_out = false;
  for (;;) {
    // First fit over the pool's rows, allocations in row order.
    std::vector<std::pair<int64_t, int64_t>> used;
    for (const auto& [p, a] : allocations_) used.emplace_back(a.first, a.first + a.rows);
    std::sort(used.begin(), used.end());
    int64_t at = 0;
    for (const auto& [lo, hi] : used) {
      if (lo - at >= rows) break;
      at = std::max(at, hi);
    }
    if (at + rows <= pool_rows_) {
      at::Tensor view = pool_.narrow(0, at, rows);
      view.zero_();  // as a fresh buffer: nothing of an earlier request is ever read
      allocations_[view.const_data_ptr()] = Allocation{at, rows, length};
      owned_[std::this_thread::get_id()].push_back(view.const_data_ptr());
      if (stepped_out) ++decoding_;
      return view;
    }
    if (!stepped_out) {  // wait off the barrier: the requests decoding go on and free rows
      stepped_out = true;
      --decoding_;
      cv_.notify_all();
    }
    cv_.wait(lock);
  }
}

at::Tensor SharedForward::forward(const ForwardBatch& batch) const {
  std::unique_lock<std::mutex> lock(mutex_);
  Filed f{&batch, {}, nullptr, false};
  filed_batches_.push_back(&f);
  cv_.notify_all();
  cv_.wait(lock, [&] { return f.done; });
  if (f.error) std::rethrow_exception(f.error);
  return f.logits;
}

bool SharedForward::ready_locked() const {
  return !stepping_ && decoding_ > 0 && static_cast<int64_t>(filed_batches_.size()) >= decoding_;
}

void SharedForward::serve() const {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return closed_ || ready_locked(); });
    if (ready_locked()) {
      run_step_locked(lock);
    } else if (closed_) {
      break;
    }
  }
}

bool SharedForward::step(double timeout_s, const std::function<bool()>& done) const {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto until = std::chrono::steady_clock::now() +
                     std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                         std::chrono::duration<double>(std::max(timeout_s, 0.0)));
  cv_.wait_until(lock, until, [&] { return closed_ || ready_locked() || (done && done()); });
  if (!ready_locked()) return false;
  run_step_locked(lock);
  return true;
}

void SharedForward::wake() const {
  std::lock_guard<std::mutex> lock(mutex_);
  cv_.notify_all();
}

int64_t SharedForward::rows_in_use() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int64_t n = 0;
  for (const auto& [p, a] : allocations_) n += a.rows;
  return n;
}

void SharedForward::close() const {
  std::lock_guard<std::mutex> lock(mutex_);
  closed_ = true;
  cv_.notify_all();
}

void SharedForward::run_step_locked(std::unique_lock<std::mutex>& lock) const {
  stepping_ = true;
  std::vector<Filed*> step;
  step.swap(filed_batches_);
  std::map<const void*, Allocation> allocations = allocations_;
  lock.unlock();
  const c10::OptionalStreamGuard on(default_stream_of(model_.device()));
  // Groups: one packed forward per (mode, KV buffer or none), in the order requests filed.
  std::vector<std::vector<Filed*>> groups;
  for (Filed* f : step) {
    auto same = [&](const std::vector<Filed*>& g) {
      return g.front()->batch->mode == f->batch->mode && g.front()->batch->kv.defined() == f->batch->kv.defined();
    };
    auto it = std::find_if(groups.begin(), groups.end(), same);
    if (it == groups.end()) groups.push_back({f});
    else it->push_back(f);
  }
  for (const auto& group : groups) {
    try {
      ForwardBatch packed;
      const ForwardBatch& first = *group.front()->batch;
      packed.mode = first.mode;
      const bool with_kv = first.kv.defined();
      std::vector<at::Tensor> tokens, positions, cu{first.cu_seqlens.narrow(0, 0, 1)}, rows, lens, prefix, logit;
      std::vector<int64_t> counts;
      int64_t tok_off = 0;
      bool bounded = true;
      for (Filed* f : group) {
        const ForwardBatch& b = *f->batch;
        const int64_t T = b.tokens.size(0), R = b.cu_seqlens.size(0) - 1;
        const auto idx = b.tokens.options();
        tokens.push_back(b.tokens);
        positions.push_back(b.positions);
        cu.push_back(b.cu_seqlens.narrow(0, 1, R) + tok_off);
        int64_t bound = b.max_positions;
        if (with_kv) {
          auto a = allocations.find(b.kv.const_data_ptr());
          TORCH_CHECK(a != allocations.end(), "SharedForward: a forward's KV buffer is not one new_kv handed out");
          rows.push_back((b.kv_rows.defined() ? b.kv_rows : at::arange(R, idx)) + a->second.first);
          lens.push_back(b.kv_lens.defined() ? b.kv_lens : at::full({R}, a->second.length, idx));
          if (bound <= 0) bound = a->second.length;
        }
        if (b.mode == KvMode::kPrefix) prefix.push_back(b.prefix_lens);
        const at::Tensor li = b.logit_index.defined() ? b.logit_index : at::arange(T, idx);
        logit.push_back(li + tok_off);
        counts.push_back(li.size(0));
        bounded = bounded && bound > 0;
        packed.max_positions = std::max(packed.max_positions, bound);
        tok_off += T;
      }
      if (!bounded) packed.max_positions = 0;  // some request gave no bound: the model finds it
      packed.tokens = at::cat(tokens);
      packed.positions = at::cat(positions);
      packed.cu_seqlens = at::cat(cu);
      packed.logit_index = at::cat(logit);
      if (with_kv) {
        packed.kv = pool_;
        packed.kv_rows = at::cat(rows);
        packed.kv_lens = at::cat(lens);
      }
      if (packed.mode == KvMode::kPrefix) packed.prefix_lens = at::cat(prefix);
      const at::Tensor logits = model_.forward(packed);
      int64_t off = 0;
      for (size_t i = 0; i < group.size(); ++i) {
        group[i]->logits = logits.narrow(0, off, counts[i]);
        off += counts[i];
      }
    } catch (...) {
      for (Filed* f : group) f->error = std::current_exception();
    }
  }
  lock.lock();
  steps_ += 1;
  filed_ += static_cast<int64_t>(step.size());
  for (Filed* f : step) f->done = true;
  stepping_ = false;
  cv_.notify_all();
}

}  // namespace blockbatch
