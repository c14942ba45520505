// Commit rules (ALGORITHMS.md section 2) on host confidences: used by commit_'s CPU implementation
// (ops/cpu/commit.cpp) and the decode loop's host path (decode/policies/single_branch.cpp).
// conf[i] is the proposal's softmax probability for candidate i, -inf for non-candidates.
#pragma once

#include <cstdint>
#include <vector>

namespace blockbatch {

// Every candidate with conf >= tau, plus the single most confident one (lowest index on ties).
std::vector<char> select_threshold(const double* conf, int64_t n, double tau);
// The k most confident candidates (ties: lower index first).
std::vector<char> select_fixed(const double* conf, int64_t n, int64_t k);
// Fast-dLLM's factor rule: rank r (1-based) needs conf >= 1 - f / (r + 1); rank 1 always;
// ranks before the first failing one, or all when none or only the last one fails.
std::vector<char> select_factor(const double* conf, int64_t n, double f);
// LLaDA's fixed schedule: step i of `steps` commits masks / steps (+1 for the first masks % steps).
std::vector<int64_t> fixed_schedule(int64_t masks, int64_t steps);

}  // namespace blockbatch
