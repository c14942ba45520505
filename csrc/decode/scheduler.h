// The step-wise scheduler: many requests, each added at any time with its own options, decoding
// together (decode/batching.h: one packed forward per KV mode per step over one KV pool) until
// each finishes or is cancelled. The HTTP server and Engine.stream drive it from one background
// thread: add() and cancel() from anywhere, step() on the driver thread, events() to collect what
// happened (a request's newly stable tokens, its result, its error).
//
// Stable tokens: a diffusion decode commits positions out of order, so a request streams only the
// generation prefix that can no longer change: every position up to the first that is still a
// mask in some branch's canvas, or on which the branches disagree (commits and merges only fill
// masks; a leader sync copies a row that agrees on that prefix), reported before every forward.
// The finished event then carries the whole result, of which every streamed prefix is a prefix.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "decode/batching.h"
#include "decode/decode.h"

namespace blockbatch {

struct RequestEvent {
  enum Kind : int64_t { kTokens = 0, kFinished = 1, kFailed = 2, kCancelled = 3 };
  int64_t id = 0;
  Kind kind = kTokens;
  int64_t offset = 0;           // kTokens: generation positions streamed before these
  std::vector<int64_t> tokens;  // kTokens: the newly stable generation tokens; kFinished: [prompt | generation]
  DecodeStats stats;            // kFinished
  std::string error;            // kFailed / kCancelled: the message
  std::exception_ptr exception;  // kFailed / kCancelled: the error itself
};

// KV rows one request holds (options resolved): one per branch, none for vanilla.
int64_t kv_rows_needed(const DecodeOptions& resolved);
// Bytes of one KV row of `length` positions on `config`'s model in `dtype`.
int64_t kv_row_bytes(const ModelConfig& config, c10::ScalarType dtype, int64_t length);

class Scheduler {
 public:
  // max_batch: requests decoding at once (worker threads); max_length: the longest prompt +
  // gen_length it accepts (the KV pool's row length); kv_budget_bytes: the pool (0: max_batch
  // requests with the family's default BlockBatch branches). CPU models only.
  Scheduler(const Network& model, int64_t max_batch, int64_t max_length, int64_t kv_budget_bytes);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Checks the request now (options, prompt, length, KV rows: c10::ValueError naming what is
  // wrong; a request that fits the pool but not now waits in the queue) and queues it; returns
  // its id. stream: report its stable tokens as they grow (kTokens events).
  int64_t add(const std::vector<int64_t>& prompt, const DecodeOptions& options, bool stream);
  // Cancels a queued request at once and a running one before its next forward; false when the
  // id is unknown or already finished. Its kCancelled event follows.
  bool cancel(int64_t id);
  // Runs packed forwards on the calling thread until some event is waiting or timeout_s passes;
  // returns the number run. One thread at a time.
  int64_t step(double timeout_s);
  // The events since the last call, in the order they happened.
  std::vector<RequestEvent> events();
  // Cancels every request, runs the steps that let them stop, joins the workers. Idempotent.
  void close();

  struct Counters {
    int64_t queued, running, steps, forwards, pool_rows, rows_in_use, row_bytes, max_length, max_batch;
  };
  Counters counters() const;

 private:
  struct Request {
    int64_t id;
    std::vector<int64_t> prompt;
    DecodeOptions options;
    bool stream;
    int64_t length;           // prompt + gen_length
    int64_t cancel = 0;       // Stop's flag
    int64_t stable = 0;       // generation tokens reported so far
  };
  void work();
  void report(Request& r, const int64_t* canvases, int64_t numel);
  void push(RequestEvent ev);

  const Network& model_;
  const int64_t max_batch_, max_length_, row_bytes_;
  std::unique_ptr<SharedForward> shared_;
  mutable std::mutex mutex_;
  std::condition_variable queue_cv_;
  std::deque<std::shared_ptr<Request>> queue_;
  std::map<int64_t, std::shared_ptr<Request>> running_;
  std::vector<RequestEvent> events_;
  std::atomic<int64_t> pending_{0};
  std::mutex stepping_;
  int64_t next_id_ = 0;
  bool closed_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace blockbatch
