#include "decode/stop.h"

#include <c10/util/Exception.h>

namespace blockbatch {

std::optional<std::chrono::steady_clock::time_point> deadline_after(std::chrono::steady_clock::time_point from,
                                                                    double seconds) {
  using clock = std::chrono::steady_clock;
  // The room left before the clock's largest time_point, less a second: the double -> ticks
  // conversion near 2^63 ns rounds by up to a microsecond, and that must not carry it over.
  const double room = std::chrono::duration<double>(clock::time_point::max() - from).count() - 1.0;
  if (!(seconds >= 0) || !(seconds < room)) return std::nullopt;  // also NaN and inf
  return from + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double>(seconds));
}

Stop::Stop(double timeout_s, const int64_t* cancel, const Progress* progress, int64_t* reason)
    : start_(std::chrono::steady_clock::now()), timeout_s_(timeout_s), cancel_(cancel), progress_(progress),
      reason_(reason) {
  if (timeout_s > 0) deadline_ = deadline_after(start_, timeout_s);
}

void Stop::check(int64_t forwards, const at::Tensor& canvases) const {
  if (progress_ != nullptr && *progress_) {
    const at::Tensor host = canvases.cpu().contiguous();
    (*progress_)(host.const_data_ptr<int64_t>(), host.numel());
  }
  check(forwards);
}

void Stop::check(int64_t forwards, const std::vector<int64_t>& canvases) const {
  if (progress_ != nullptr && *progress_) (*progress_)(canvases.data(), static_cast<int64_t>(canvases.size()));
  check(forwards);
}

void Stop::check(int64_t forwards) const {
  const bool cancelled = cancel_ != nullptr && __atomic_load_n(cancel_, __ATOMIC_RELAXED) != 0;
  if (cancelled && reason_ != nullptr) *reason_ = kCancelled;
  TORCH_CHECK(!cancelled, "blockbatch: decode cancelled after ", forwards, " forwards");
  if (deadline_) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= *deadline_ && reason_ != nullptr) *reason_ = kDeadline;
    TORCH_CHECK(now < *deadline_, "blockbatch: decode deadline exceeded: timeout_s = ", timeout_s_, " passed after ",
                forwards, " forwards (", std::chrono::duration<double>(now - start_).count(),
                " s); raise timeout_s or lower gen_length");
  }
}

void Stop::no_progress(int64_t step, const std::string& what) const {
  if (reason_ != nullptr) *reason_ = kNoProgress;
  TORCH_CHECK(false, "blockbatch: decode step ", step, " (", what,
              ") committed no token although its commit rule commits at least one per step. The logits are "
              "most likely not finite (NaN or inf: float16 overflows easily); try dtype float32 or bfloat16");
}

}  // namespace blockbatch
