// When a decode must stop early: a caller's cancel flag (Ctrl-C in Python: blockbatch.options
// runs the op on a worker thread and sets the flag from the main thread), a per-request
// deadline, or a step that made no progress. Every decode loop checks it once per forward.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace blockbatch {

class Stop {
 public:
  // timeout_s <= 0: no deadline. cancel: a host int64 the caller may set to nonzero from another
  // thread while the decode runs (read atomically), or nullptr.
  Stop(double timeout_s, const int64_t* cancel);

  // Throws c10::Error when the flag is set ("decode cancelled ...") or the deadline has passed
  // ("decode deadline exceeded ..."); `forwards` = forwards run so far (for the message).
  void check(int64_t forwards) const;

  // Throws: a step over `what` committed nothing although its commit rule commits at least one
  // token per step; names the step, the positions and the likely cause (non-finite logits).
  [[noreturn]] static void no_progress(int64_t step, const std::string& what);

 private:
  std::chrono::steady_clock::time_point start_, deadline_;
  double timeout_s_;
  const int64_t* cancel_;
};

}  // namespace blockbatch
