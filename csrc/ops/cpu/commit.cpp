// commit_ on CPU: one commit-rule step over a block window of a canvas that lives on the
// model's device (ALGORITHMS.md 2), so a decode step needs no host round trip to commit.
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <limits>
#include <vector>

#include "kernels/cpu/commit_rules.h"
#include "ops/checks.h"
#include "ops/impl.h"

namespace blockbatch {

at::Tensor commit_cpu(const at::Tensor& canvas, const at::Tensor& window, const at::Tensor& token,
                      const at::Tensor& conf, const at::Tensor& k, int64_t mask_id, int64_t eos_id,
                      const std::string& rule, double threshold, double factor) {
  check_commit(canvas, window, token, conf, k, rule);
  const int64_t n = window.size(0), L = canvas.size(0);
  int64_t* x = canvas.data_ptr<int64_t>();
  const int64_t* w = window.const_data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK_VALUE(w[i] >= 0 && w[i] < L, "window[", i, "] = ", w[i], " is outside the canvas [0, ", L, ")");
  }
  std::vector<double> c(n);
  int64_t candidates = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool cand = x[w[i]] == mask_id;
    c[i] = cand ? conf.const_data_ptr<double>()[i] : -std::numeric_limits<double>::infinity();
    candidates += cand;
  }
  std::vector<char> chosen;
  // rule is one of the three (check_commit).
  if (rule == "threshold") {
    chosen = select_threshold(c.data(), n, threshold);
  } else if (rule == "factor") {
    chosen = select_factor(c.data(), n, factor);
  } else {
    chosen = select_fixed(c.data(), n, k.const_data_ptr<int64_t>()[0]);
  }
  int64_t committed = 0, eos = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (chosen[i]) {
      x[w[i]] = token.const_data_ptr<int64_t>()[i];
      ++committed;
    }
    eos |= x[w[i]] == eos_id;
  }
  at::Tensor counts = at::empty({3}, canvas.options());
  counts.data_ptr<int64_t>()[0] = committed;
  counts.data_ptr<int64_t>()[1] = candidates - committed;
  counts.data_ptr<int64_t>()[2] = eos;
  return counts;
}

}  // namespace blockbatch
