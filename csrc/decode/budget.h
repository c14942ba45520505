// branch_budget = "auto" (docs/ALGORITHMS.md 9.4): the step-time curve and the branches a
// BlockBatch request keeps at a load. The one place the rule lives: the scheduler applies it when
// it admits a request, decode() alone at load 1.
#pragma once

#include <cstdint>
#include <vector>

#include "decode/options.h"

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

// A blockbatch request left with one branch decodes as a dual cache of that block size (with
// blockbatch's threshold and EOS exit): one branch has nothing to merge or sync with, and the
// dual cache's loop does the same forwards without the branch bookkeeping (ALGORITHMS.md 9.4).
// Other options are returned as they are.
DecodeOptions single_branch_as_dual(DecodeOptions o);

// The options `resolved` (decode_options_for) decodes with when admitted at `load`: for a
// BlockBatch request with branch_budget = auto, budget_branches' sizes (an empty curve keeps them
// all), one size left as single_branch_as_dual; any other request as it is.
DecodeOptions budgeted(const DecodeOptions& resolved, int64_t load, const StepCurve& curve);

}  // namespace blockbatch
