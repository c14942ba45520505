// One packed forward over the forwards many requests' decoders planned for the same step
// (decode/batch/scheduler.h), grouped by KV mode: tokens, positions, rows and logit rows
// concatenated, KV rows offset into the shared pool (decode/batch/kv_pool.h), each row attending
// its own canvas length; each request gets its own logits rows back.
//
// Padded packs and CUDA graphs (BLOCKBATCH_CUDA_BATCHING=graphs): every packed forward is padded to
// bucketed sizes (pack_bucket: tokens, rows and logit rows), the extra tokens in dummy rows of at
// most kDummyTokens tokens each, at positions from 0, on the pool's scratch row (which no request
// owns), with max_positions the pool's length. So the launch shapes depend only on (mode, buckets),
// and each bucket's forward is captured in a CUDA graph on its second use (on a side stream that
// waits for the default stream, and the default stream for it) and replayed from then on. A real
// row never reads a dummy row's tokens or the scratch row, so its logits are those of the unpadded
// pack (tested on the CPU, where pad_packs pads without graphs).
//
// Batch invariance: a request's logits rows are computed exactly as in its batch-1 run (every op
// of the forward is per row; the CPU GEMM pads fewer than 16 rows so that a row's product does not
// depend on its neighbours), so its tokens and counters do not depend on what else runs.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Stream.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <vector>

#include "decode/batch/kv_pool.h"
#include "model/network.h"

namespace blockbatch {

// The stream the scheduler queues on for `device`: none on the CPU, else the device's default
// stream (for a c10::OptionalStreamGuard, which also sets the thread's device).
std::optional<c10::Stream> default_stream_of(c10::Device device);

// The bucket a pack of n tokens / rows / logit rows is padded to, the first >= n of: 8, 12, 16,
// 24, 32, 48, 64 (powers of two and their midpoints), then quarter steps (80, 96, 112, 128, 160,
// ...), so a pack past 64 pads by at most a quarter.
int64_t pack_bucket(int64_t n);

// The memory a KV pool on `device` may at most take: the host's physical memory on the CPU, the
// GPU's total memory on CUDA (0: unknown, no limit).
int64_t device_memory_bytes(c10::Device device);
constexpr int64_t kDummyTokens = 16;  // a dummy row's most tokens (its attention stays small)

class PackedForward {
 public:
  // pad: pad every packed forward (above; the pool needs its scratch row); graphs (CUDA, implies
  // pad): capture and replay each bucket's forward.
  PackedForward(const Network& model, KvPool& pool, bool pad, bool graphs);
  ~PackedForward();

  // One request's forward: its batch (KV rows relative to its lease, kv = its view or undefined),
  // its lease's first pool row and its canvas length (the keys its rows attend).
  struct Entry {
    const ForwardBatch* batch;
    int64_t kv_first = 0, length = 0;
    at::Tensor logits;         // out: its logits rows
    std::exception_ptr error;  // out: its group's forward failed
  };
  // Runs one packed forward per (mode, KV or none) group, in the order of the entries.
  void run(std::vector<Entry>& entries);

  int64_t padded() const { return padded_; }  // packed forwards run padded
  int64_t graph_captures() const { return captures_; }
  int64_t graph_replays() const { return replays_; }

 private:
  at::Tensor run_packed(ForwardBatch& packed, int64_t n_logits);
  struct Graphs;  // CUDA state (pack.cpp, CUDA builds)

  const Network& model_;
  KvPool& pool_;
  const bool pad_;
  std::unique_ptr<Graphs> graphs_;
  std::atomic<int64_t> padded_{0}, captures_{0}, replays_{0};  // read by any thread
};

}  // namespace blockbatch
