// measure_step_curve (decode/batch/step_curve.h).
#include "decode/batch/step_curve.h"

#include <ATen/ops/tensor.h>

#include <algorithm>
#include <chrono>
#include <vector>

namespace blockbatch {

StepCurve measure_step_curve(const Network& model, double limit_s) {
  StepCurve curve;
  const ModelConfig& c = model.config();
  const auto idx = at::TensorOptions().dtype(at::kLong).device(model.device());
  const auto t0 = std::chrono::steady_clock::now();
  auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  for (int64_t T = 16; T <= 4096; T *= 2) {
    const int64_t row = std::min<int64_t>({T, 128, c.max_sequence_length});
    std::vector<int64_t> tok(T), pos(T), cu{0};
    for (int64_t i = 0; i < T; ++i) {
      tok[i] = (i * 7 + 1) % c.vocab_size == c.mask_token_id ? 0 : (i * 7 + 1) % c.vocab_size;
      pos[i] = i % row;
      if ((i + 1) % row == 0 || i + 1 == T) cu.push_back(i + 1);
    }
    ForwardBatch b;
    b.tokens = at::tensor(tok, idx);
    b.positions = at::tensor(pos, idx);
    b.cu_seqlens = at::tensor(cu, idx);
    b.max_positions = row;
    std::vector<double> times;
    for (int rep = 0; rep < 4; ++rep) {
      const auto s = std::chrono::steady_clock::now();
      model.forward(b).sum().item<double>();  // the read waits for the device
      if (rep > 0) times.push_back(since(s));
    }
    std::sort(times.begin(), times.end());
    const double t = std::max(times[1], curve.seconds.empty() ? 0.0 : curve.seconds.back());  // non-decreasing
    curve.tokens.push_back(T);
    curve.seconds.push_back(t);
    if (t > limit_s / 8 || since(t0) > limit_s) break;
  }
  return curve;
}

}  // namespace blockbatch
