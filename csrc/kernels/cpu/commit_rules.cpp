#include "kernels/cpu/commit_rules.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace blockbatch {

namespace {
// Candidate indices by descending confidence; ties keep ascending index (stable).
std::vector<int64_t> ranked(const double* conf, int64_t n) {
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isfinite(conf[i])) idx.push_back(i);
  }
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return conf[a] > conf[b]; });
  return idx;
}
}  // namespace

std::vector<char> select_threshold(const double* conf, int64_t n, double tau) {
  std::vector<char> chosen(n, 0);
  int64_t best = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(conf[i])) continue;
    if (conf[i] >= tau) chosen[i] = 1;
    if (best < 0 || conf[i] > conf[best]) best = i;
  }
  if (best >= 0) chosen[best] = 1;
  return chosen;
}

std::vector<char> select_fixed(const double* conf, int64_t n, int64_t k) {
  std::vector<char> chosen(n, 0);
  const auto order = ranked(conf, n);
  for (int64_t r = 0; r < std::min<int64_t>(k, order.size()); ++r) chosen[order[r]] = 1;
  return chosen;
}

std::vector<char> select_factor(const double* conf, int64_t n, double f) {
  std::vector<char> chosen(n, 0);
  const auto order = ranked(conf, n);
  const int64_t m = static_cast<int64_t>(order.size());
  int64_t take = m;
  for (int64_t r = 2; r <= m; ++r) {
    if (!(conf[order[r - 1]] >= 1.0 - f / static_cast<double>(r + 1))) {
      take = r == m ? m : r - 1;
      break;
    }
  }
  for (int64_t r = 0; r < take; ++r) chosen[order[r]] = 1;
  return chosen;
}

std::vector<int64_t> fixed_schedule(int64_t masks, int64_t steps) {
  std::vector<int64_t> out(steps, masks / steps);
  for (int64_t i = 0; i < masks % steps; ++i) out[i] += 1;
  return out;
}

}  // namespace blockbatch
