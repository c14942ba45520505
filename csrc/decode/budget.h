// branch_budget = "auto" (docs/ALGORITHMS.md 9.4): the step-time curve and the branches a
// BlockBatch request keeps at a load. The policy applies it (PolicyDescriptor::at_load,
// decode/policies/blockbatch.cpp): the scheduler when it admits a request, decode() alone at load 1.
#pragma once

#include <cstdint>
#include <vector>

namespace blockbatch {

// Seconds of one packed forward by query tokens: the step-time curve the load-adaptive branch
// budget reads (branch_budget = auto). Piecewise linear between the points; beyond the last, the
// last segment's slope.
struct StepCurve {
  std::vector<int64_t> tokens;  // ascending
  std::vector<double> seconds;  // non-decreasing
  bool empty() const { return tokens.empty(); }
  double at(int64_t tokens) const;
};

// The block sizes branch_budget = auto keeps for a request admitted while `load` requests decode
// (itself included): the branch nearest block_length is the anchor (a dual cache's query); the
// step may carry as many tokens as cost at most (1 + slack) times the step of `load` anchors, of
// which this request gets 1 / load (at least the anchor); the largest branches are dropped first
// and, once the anchor is the largest left, the smallest, down to the anchor alone.
std::vector<int64_t> budget_branches(const std::vector<int64_t>& sizes, int64_t block_length, int64_t load,
                                     const StepCurve& curve, double slack = 0.10);

}  // namespace blockbatch
