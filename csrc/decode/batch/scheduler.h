// The step-wise scheduler: many requests, each added at any time with its own options, decoding
// together until each finishes or is cancelled. Every live request is a decoder (decode/decoder.h);
// a step asks each for its plan, packs the plans' forwards into one per KV mode
// (decode/batch/pack.h) over one KV pool (decode/batch/kv_pool.h), and hands each decoder its
// logits rows; all on the thread that calls step(), no thread per request. The HTTP server and
// Engine.stream drive it from one background thread: add() and cancel() from anywhere, step() on
// the driver thread, events() to collect what happened (a request's newly stable tokens, its
// result, its error). Requests are admitted in order, as KV rows free up, up to max_batch at once.
//
// Stable tokens: a diffusion decode commits positions out of order, so a request streams only the
// generation prefix that can no longer change: every position up to the first that is still a
// mask in some branch's canvas, or on which the branches disagree (commits and merges only fill
// masks; a leader sync copies a row that agrees on that prefix), reported before every forward.
// The finished event then carries the whole result, of which every streamed prefix is a prefix.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "decode/batch/kv_pool.h"
#include "decode/batch/pack.h"
#include "decode/batch/pool_sizing.h"
#include "decode/batch/step_curve.h"
#include "decode/budget.h"
#include "decode/decode.h"

namespace blockbatch {

class Decoder;  // decode/decoder.h

struct RequestEvent {
  enum Kind : int64_t { kTokens = 0, kFinished = 1, kFailed = 2, kCancelled = 3 };
  static const char* kind_name(Kind kind);  // "tokens", "finished", "failed", "cancelled"
  int64_t id = 0;
  Kind kind = kTokens;
  int64_t offset = 0;           // kTokens: generation positions streamed before these
  std::vector<int64_t> tokens;  // kTokens: the newly stable generation tokens; kFinished: [prompt | generation]
  DecodeStats stats;            // kFinished
  at::Tensor logprobs;          // kFinished: DecodeResult::logprobs; kTokens: the rows of `tokens` (logprobs on)
  std::string error;            // kFailed / kCancelled: the message
  ErrorKind error_kind = ErrorKind::kDecodeFailed;  // kFailed / kCancelled: why (timeout, cancelled, a refusal's kind)
  std::string error_param;                          // kFailed: the argument a refusal names ("" for other errors)
  int64_t reason = 0;            // kFailed / kCancelled: the StopReason (decode/stop.h), 0 for other errors
  std::exception_ptr exception;  // kFailed / kCancelled: the error itself
};

// Pool sizing (kv_row_bytes, resolve_kv_page_len, scheduler_pool_rows, ...): decode/batch/pool_sizing.h;
// the step curve (measure_step_curve): decode/batch/step_curve.h.

// Many requests at once (the Scheduler below): up to max_batch decode together, their forwards
// packed into one per step; each request's result equals its decode() alone. kv_budget_bytes:
// the shared KV pool's size (0: room for the max_batch largest requests). Throws the first failed
// request's error, naming the request; every request is checked before any runs. curve: the
// step-time curve for branch_budget = auto requests (empty: measured, in at most a second).
struct BatchStats {
  int64_t steps = 0;      // packed forwards run
  int64_t forwards = 0;   // request forwards they carried
  int64_t pool_rows = 0;  // KV rows in the pool, of row_bytes each
  int64_t row_bytes = 0;
  int64_t padded = 0, graph_captures = 0, graph_replays = 0;  // padded packed forwards; of them replayed
};
std::vector<DecodeResult> decode_batch(const Network& model, const std::vector<std::vector<int64_t>>& prompts,
                                       const std::vector<DecodeOptions>& options, int64_t max_batch,
                                       int64_t kv_budget_bytes = 0, const int64_t* cancel = nullptr,
                                       int64_t* reason = nullptr, BatchStats* stats = nullptr,
                                       const StepCurve& curve = {}, bool pad_packs = false, bool prefix_cache = false);

class Scheduler {
 public:
  // max_batch: requests decoding at once; max_length: the longest prompt +
  // gen_length it accepts (the KV pool's row length); kv_budget_bytes: the pool (0: max_batch
  // requests with the family's default BlockBatch branches). curve: the step-time curve for
  // branch_budget = auto requests (empty: measured now when calibrate_s > 0, else such requests
  // run their full branch set). CPU models; CUDA models unless BLOCKBATCH_CUDA_BATCHING=0 (default
  // graphs: padded steps replayed from CUDA graphs, decode/step_runner.h; 1: eager packed steps).
  // pad_packs: pad every packed forward as the graphs do, also on the CPU (a check that padding
  // changes no result). Padding takes one KV row of the budget (the scratch row).
  // kv_page_len: the pool's layout (resolve_kv_page_len; -1 automatic). prefix_cache: block-causal
  // requests (policy block) read their prompts' complete blocks from the K/V of earlier requests
  // with the same blocks, and leave theirs (a paged pool; decode/batch/prefix_cache.h).
  Scheduler(const Network& model, int64_t max_batch, int64_t max_length, int64_t kv_budget_bytes, StepCurve curve = {},
            double calibrate_s = 0.0, bool pad_packs = false, int64_t kv_page_len = -1, bool prefix_cache = false);
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Checks the request now (options, prompt, length, KV rows: c10::ValueError naming what is
  // wrong; a request that fits the pool but not now waits in the queue) and queues it; returns
  // its id. stream: report its stable tokens as they grow (kTokens events).
  int64_t add(const std::vector<int64_t>& prompt, const DecodeOptions& options, bool stream);
  // The same for a request admitted already (blockbatch::admit(model, prompt, options) on this
  // scheduler's model): decode_batch admits every request before any runs.
  int64_t add(const std::vector<int64_t>& prompt, const Admitted& admitted, bool stream);
  // Cancels a queued request at once and a running one before its next forward; false when the
  // id is unknown or already finished. Its kCancelled event follows.
  bool cancel(int64_t id);
  // Runs packed forwards on the calling thread until some event is waiting or timeout_s passes;
  // returns the number run. One thread at a time.
  int64_t step(double timeout_s);
  // The events since the last call, in the order they happened.
  std::vector<RequestEvent> events();
  // Cancels every request and runs the steps that let them stop. Idempotent.
  void close();

  struct Counters {
    int64_t queued, running, steps, forwards, pool_rows, rows_in_use, row_bytes, max_length, max_batch;
    int64_t padded, graph_captures, graph_replays;
    // The pool in pages (dense: rows, page_len = max_length, paged = 0): all, taken, their length.
    int64_t kv_pages, kv_pages_in_use, kv_page_len, kv_paged;
    // The prefix cache: blocks and pages it holds, blocks evicted, prompt positions read from it.
    int64_t prefix_cache_blocks, prefix_cache_pages, prefix_cache_evictions, prefix_cache_hit_tokens;
  };
  Counters counters() const;
  const StepCurve& step_curve() const { return curve_; }

 private:
  struct Request {
    int64_t id;
    std::vector<int64_t> prompt;
    DecodeOptions options;  // resolved and validated (admit); budgeted when it starts
    bool stream;
    int64_t length;      // prompt + gen_length (policy 'block': rounded up to a whole block; canvas_length)
    int64_t cancel = 0;  // Stop's flag
    int64_t reason = 0;  // Stop's StopReason
    int64_t stable = 0;  // generation tokens reported so far
  };
  struct Live;                   // a request decoding: its decoder, stop, KV lease (scheduler.cpp)
  bool admit();                  // the driver: queued requests into live_ while they fit
  void run_step();               // the driver: one step of every live decoder
  bool finish_if_done(Live& l);  // finished: its event out, its rows free; true when it left
  void retire(Live& l, RequestEvent ev);
  void report(Request& r, const Decoder* d, const int64_t* canvases, int64_t numel);
  void push(RequestEvent ev);

  const Network& model_;
  const int64_t max_batch_, max_length_;
  const bool prefix_cache_;
  const int64_t page_len_, row_bytes_;
  StepCurve curve_;
  std::unique_ptr<KvPool> pool_;
  std::unique_ptr<PackedForward> packed_;
  std::vector<std::unique_ptr<Live>> live_;  // the driver's; running_ mirrors it for cancel()
  mutable std::mutex mutex_;
  std::condition_variable queue_cv_;
  std::deque<std::shared_ptr<Request>> queue_;
  std::map<int64_t, std::shared_ptr<Request>> running_;
  std::vector<RequestEvent> events_;
  std::atomic<int64_t> pending_{0}, steps_{0}, forwards_{0};
  std::mutex stepping_;
  int64_t next_id_ = 0;
  bool closed_ = false;
};

}  // namespace blockbatch
