// When a decode must stop early: a caller's cancel flag (Ctrl-C in Python: blockbatch.options
// runs the op on a worker thread and sets the flag from the main thread), a per-request
// deadline, or a step that made no progress. Every decode loop checks it once per forward.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace blockbatch {

// What a decode shows of its progress: its canvases (each row [prompt | generation], rows
// concatenated, host memory) before every forward. The scheduler's streaming reads from them the
// prefix that can no longer change (decode/batch/scheduler.h).
using Progress = std::function<void(const int64_t* canvases, int64_t numel)>;

// `seconds` (>= 0) after `from`, or nullopt when that instant does not fit a steady_clock
// time_point (int64 nanoseconds: about 292 years of uptime): converting such a duration overflows
// (undefined behaviour; in practice a deadline in the past). A deadline that far out is none.
std::optional<std::chrono::steady_clock::time_point> deadline_after(std::chrono::steady_clock::time_point from,
                                                                    double seconds);

// Why a decode stopped early, for a caller to map to its own error kinds (Python: TimeoutError
// for kDeadline) without reading the message.
enum StopReason : int64_t { kNotStopped = 0, kCancelled = 1, kDeadline = 2, kNoProgress = 3 };

class Stop {
 public:
  // timeout_s <= 0, or so large that the deadline does not fit (deadline_after): no deadline.
  // cancel: a host int64 the caller may set to nonzero from another thread while the decode runs
  // (read atomically), or nullptr. progress: called by check() with the canvases, or nullptr (then
  // check() reads nothing back).
  // reason: where check() / no_progress() write the StopReason before they throw, or nullptr.
  Stop(double timeout_s, const int64_t* cancel, const Progress* progress = nullptr, int64_t* reason = nullptr);

  // Before every forward: reports the canvases (a device tensor [rows, L] or [L], or the host
  // rows) to `progress`, then throws c10::Error when the flag is set ("decode cancelled ...") or
  // the deadline has passed ("decode deadline exceeded ..."); `forwards` = forwards run so far.
  void check(int64_t forwards, const at::Tensor& canvases) const;
  void check(int64_t forwards, const std::vector<int64_t>& canvases) const;

  // Throws: a step over `what` committed nothing although its commit rule commits at least one
  // token per step; names the step, the positions and the likely cause (non-finite logits).
  [[noreturn]] void no_progress(int64_t step, const std::string& what) const;

 private:
  std::chrono::steady_clock::time_point start_;
  std::optional<std::chrono::steady_clock::time_point> deadline_;
  void check(int64_t forwards) const;

  double timeout_s_;
  const int64_t* cancel_;
  const Progress* progress_;
  int64_t* reason_;
};

}  // namespace blockbatch
