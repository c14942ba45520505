// Many requests at once: every request runs its own policy loop (decode(), on a worker thread of
// its own), and their forwards meet in ONE packed forward per step.
//
// SharedForward is the Network the requests' loops see. Its forward() does not run the model: it
// files the request's ForwardBatch and waits. When every request that is decoding has filed one
// (or finished), the serving thread (serve() or step()) packs the filed batches, grouped by KV
// mode, into one packed forward per group (tokens, positions, rows and logit rows concatenated; KV rows offset into the
// shared pool; each row attends its own canvas length), runs it, and hands each request its own
// logits rows. Requests join (a worker takes the next prompt) and leave (a request finishes, its
// KV rows are freed at once) between steps; nothing waits for a request that is not decoding.
//
// KV memory is one pool [rows, layers, 2, kv_heads, L_max, head_dim] sized from a byte budget:
// new_kv hands out contiguous row ranges (zeroed); a request whose rows are not free waits outside
// the step barrier (the others go on) until a finished request frees them; one that can never fit
// is refused with an error naming the budget. The pool is allocated uninitialised and each row
// range is zeroed when it is handed out (the scratch row at once), so no forward reads a row that
// was not zeroed, and the memory the pool holds (the pages touched) grows with the rows used,
// not with the budget: a server sized for 500 requests does not hold their KV at start.
//
// On CUDA every thread of a scheduler (the requests' workers, the stepping thread) queues its work
// on the device's default stream (default_stream_of): the stream then runs the kernels in the order
// of the threads' hand-offs under the mutex (a request's inputs before the packed forward that
// reads them, that forward before the request reads its logits), with no event between streams.
// A request's own CUDA graphs are off there: its step waits on the others inside the forward.
//
// Padded packs and CUDA graphs of the packed step (BLOCKBATCH_CUDA_BATCHING=graphs): every packed
// forward is padded to bucketed sizes (pack_bucket: tokens, rows and logit rows), the extra tokens
// in dummy rows of at most kDummyTokens tokens each, at positions from 0, on a scratch KV row (the
// pool's last, taken from the budget) that no request owns, with max_positions the pool's length.
// So the launch shapes depend only on (mode, buckets), and each bucket's forward is captured in a
// CUDA graph on its second use (on a side stream that waits for the default stream, and the
// default stream for it) and replayed from then on. A real row never reads a dummy row's tokens or
// the scratch row, so its logits are those of the unpadded pack (tested on the CPU, where
// decode_batch's pad_packs pads without graphs).
//
// Batch invariance: a request's logits rows are computed exactly as in its batch-1 run (every op
// of the forward is per row; the CPU GEMM pads fewer than 16 rows so that a row's product does not
// depend on its neighbours), so its tokens and counters do not depend on what else runs.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "model/network.h"

namespace blockbatch {

// The stream a scheduler's thread queues on for `device`: none on the CPU, else the device's default
// stream (for a c10::OptionalStreamGuard, which also sets the thread's device).
std::optional<c10::Stream> default_stream_of(c10::Device device);

// The bucket a pack of n tokens / rows / logit rows is padded to: 8, 12, 16, 24, 32, 48, 64, ...
// (the powers of two and the midpoints between them), the first >= n.
int64_t pack_bucket(int64_t n);

// The memory a KV pool on `device` may at most take: the host's physical memory on the CPU, the
// GPU's total memory on CUDA (0: unknown, no limit).
int64_t device_memory_bytes(c10::Device device);
constexpr int64_t kDummyTokens = 16;  // a dummy row's most tokens (its attention stays small)

class SharedForward : public Network {
 public:
  // pool_rows: KV rows in the pool (one more when padding: the scratch row); max_length: the
  // pool's row length (the longest canvas; at most the model's max_sequence_length). A pool that
  // cannot be allocated throws c10::ValueError naming its size. pad: pad every packed forward (see above); graphs
  // (CUDA, implies pad): capture and replay each bucket's forward.
  SharedForward(const Network& model, int64_t pool_rows, int64_t max_length, bool pad = false,
                bool graphs = false);
  ~SharedForward() override;

  const ModelConfig& config() const override { return model_.config(); }
  c10::ScalarType dtype() const override { return model_.dtype(); }
  c10::Device device() const override { return model_.device(); }
  void check(const ForwardBatch& batch) const override { model_.check(batch); }

  // Files the batch and waits for the step that runs it (see above).
  at::Tensor forward(const ForwardBatch& batch) const override;
  // `rows` contiguous pool rows of `length` (<= max_length) usable positions, zeroed: a view
  // [rows, layers, 2, kv_heads, max_length, head_dim]; waits (off the barrier) while they are taken.
  at::Tensor new_kv(int64_t rows, int64_t length) const override;

  // A request starts / ends decoding on this thread (the barrier counts the requests decoding).
  // leave() frees the request's KV rows.
  void join() const;
  void leave() const;
  // The serving thread runs the packed forwards (with its intra-op threads); the requests'
  // threads only file and wait. serve(): every step until close(). step(): at most one, waiting
  // up to timeout_s for the requests decoding to file, or until wake() and `done()` holds;
  // returns whether it ran one.
  void serve() const;
  bool step(double timeout_s, const std::function<bool()>& done = nullptr) const;
  void wake() const;
  void close() const;
  // KV rows handed out now (of pool_rows()).
  int64_t rows_in_use() const;
  int64_t pool_rows() const { return pool_rows_; }

  int64_t steps() const { return steps_; }            // packed forwards run
  int64_t forwards_filed() const { return filed_; }   // request forwards they carried
  int64_t padded() const { return padded_; }          // packed forwards run padded
  int64_t graph_captures() const { return captures_; }
  int64_t graph_replays() const { return replays_; }  // of padded(): the replay hit rate

 private:
  struct Filed {
    const ForwardBatch* batch;
    at::Tensor logits;
    std::exception_ptr error;
    bool done = false;
  };
  struct Allocation {
    int64_t first, rows, length;
  };
  void run_step_locked(std::unique_lock<std::mutex>& lock) const;
  bool ready_locked() const;
  // The packed forward of one group: padded (and replayed from a graph) where configured; the
  // logits of the real logit rows.
  at::Tensor run_packed(ForwardBatch& packed, int64_t n_logits) const;
  struct Graphs;  // CUDA state (batching.cpp, CUDA builds)

  const Network& model_;
  const int64_t pool_rows_, max_length_;
  const bool pad_;
  at::Tensor pool_;  // pool_rows_ rows, + the scratch row when padding
  std::unique_ptr<Graphs> graphs_;
  mutable std::mutex mutex_;
  mutable std::condition_variable cv_;
  mutable int64_t decoding_ = 0;  // requests inside decode() and not waiting for KV rows
  mutable std::vector<Filed*> filed_batches_;
  mutable bool stepping_ = false;
  mutable bool closed_ = false;
  mutable std::map<const void*, Allocation> allocations_;  // by the view's data pointer
  mutable std::map<std::thread::id, std::vector<const void*>> owned_;
  mutable int64_t steps_ = 0, filed_ = 0;
  mutable int64_t padded_ = 0, captures_ = 0, replays_ = 0;  // only the stepping thread writes them
};

}  // namespace blockbatch
