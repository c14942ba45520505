#include "decode/budget.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdlib>

namespace blockbatch {

double StepCurve::at(int64_t t) const {
  TORCH_CHECK(!tokens.empty(), "StepCurve::at on an empty curve");
  const size_t n = tokens.size();
  if (n == 1 || t <= tokens[0]) return seconds[0];
  size_t i = 1;
  while (i + 1 < n && tokens[i] < t) ++i;
  const double slope = (seconds[i] - seconds[i - 1]) / static_cast<double>(tokens[i] - tokens[i - 1]);
  return seconds[i - 1] + slope * static_cast<double>(t - tokens[i - 1]);
}

std::vector<int64_t> budget_branches(const std::vector<int64_t>& sizes, int64_t block_length, int64_t load,
                                     const StepCurve& curve, double slack) {
  std::vector<int64_t> set = sizes;
  std::sort(set.begin(), set.end());
  if (curve.empty() || set.size() <= 1) return set;
  int64_t anchor = set[0];
  for (int64_t b : set) {
    if (std::llabs(b - block_length) <= std::llabs(anchor - block_length)) anchor = b;
  }
  load = std::max<int64_t>(load, 1);
  int64_t full = 0;
  for (int64_t b : set) full += b;
  const double limit = (1.0 + slack) * curve.at(load * anchor);
  int64_t lo = load * anchor, hi = load * full;  // the largest total within the limit, by bisection
  if (curve.at(hi) <= limit) lo = hi;
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (curve.at(mid) <= limit ? lo : hi) = mid;
  }
  const int64_t per_request = std::max(anchor, lo / load);
  int64_t total = full;
  while (total > per_request && set.size() > 1) {
    auto drop = set.back() > anchor ? set.end() - 1 : (set.front() == anchor ? set.begin() + 1 : set.begin());
    total -= *drop;
    set.erase(drop);
  }
  return set;
}

}  // namespace blockbatch
