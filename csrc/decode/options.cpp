#include "decode/options.h"

#include "kernels/branches.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <set>

namespace blockbatch {

Policy parse_policy(const std::string& name) {
  if (name == "vanilla") return Policy::kVanilla;
  if (name == "prefix") return Policy::kPrefix;
  if (name == "dual") return Policy::kDual;
  if (name == "blockbatch") return Policy::kBlockBatch;
  TORCH_CHECK_VALUE(false, "policy must be one of 'vanilla', 'prefix', 'dual', 'blockbatch', got '", name, "'");
}

CommitRule parse_commit_rule(const std::string& name) {
  if (name == "threshold") return CommitRule::kThreshold;
  if (name == "fixed") return CommitRule::kFixed;
  if (name == "factor") return CommitRule::kFactor;
  TORCH_CHECK_VALUE(false, "commit must be one of 'threshold', 'fixed', 'factor', got '", name, "'");
}

const char* commit_rule_name(CommitRule rule) {
  switch (rule) {
    case CommitRule::kThreshold: return "threshold";
    case CommitRule::kFixed: return "fixed";
    case CommitRule::kFactor: return "factor";
  }
  return "";
}

RefreshMode parse_refresh_mode(const std::string& name) {
  if (name == "periodic") return RefreshMode::kPeriodic;
  if (name == "divergence") return RefreshMode::kDivergence;
  TORCH_CHECK_VALUE(false, "refresh_mode must be 'periodic' or 'divergence', got '", name, "'");
}

void DecodeOptions::validate(const ModelConfig& c, int64_t prompt_length) const {
  TORCH_CHECK_VALUE(prompt_length > 0, "prompt_ids must not be empty");
  TORCH_CHECK_VALUE(gen_length > 0, "gen_length must be > 0, got ", gen_length);
  // Written without the sum: gen_length near 2^63 must not overflow the comparison.
  if (prompt_length > c.max_sequence_length || gen_length > c.max_sequence_length - prompt_length) {
    const bool fits = gen_length <= std::numeric_limits<int64_t>::max() - prompt_length;
    TORCH_CHECK_VALUE(false, "prompt length ", prompt_length, " + gen_length ", gen_length,
                      fits ? " = " + std::to_string(prompt_length + gen_length) : std::string(),
                      " exceeds max_sequence_length = ", c.max_sequence_length);
  }
  TORCH_CHECK_VALUE(steps >= 0, "steps must be >= 0, got ", steps);
  TORCH_CHECK_VALUE(steps <= gen_length, "steps must be <= gen_length = ", gen_length,
                    " (a step commits at least one token), got ", steps);
  TORCH_CHECK_VALUE(temperature >= 0 && std::isfinite(temperature), "temperature must be >= 0 and finite, got ",
                    temperature);
  TORCH_CHECK_VALUE(threshold > 0 && threshold <= 1, "threshold must be in (0, 1], got ", threshold);
  TORCH_CHECK_VALUE(seed >= 0, "seed must be >= 0, got ", seed);
  TORCH_CHECK_VALUE(timeout_s >= 0 && std::isfinite(timeout_s), "timeout_s must be >= 0 and finite (0: no deadline), "
                    "got ", timeout_s);
  if (policy != Policy::kBlockBatch) {
    TORCH_CHECK_VALUE(block_length > 0 && block_length <= gen_length, "block_length must be in [1, gen_length = ",
                      gen_length, "], got ", block_length);
    TORCH_CHECK_VALUE(gen_length % block_length == 0, "block_length = ", block_length,
                      " must divide gen_length = ", gen_length);
    if (commit == CommitRule::kFixed) {
      const int64_t blocks = gen_length / block_length;
      TORCH_CHECK_VALUE(steps > 0 && steps % blocks == 0, "steps must be a positive multiple of the number of blocks (",
                        blocks, " = gen_length / block_length) for the fixed schedule, got ", steps);
    }
    if (commit == CommitRule::kFactor) {
      TORCH_CHECK_VALUE(factor > 0 && std::isfinite(factor), "factor must be > 0 and finite, got ", factor);
    }
    return;
  }
  TORCH_CHECK_VALUE(commit == CommitRule::kThreshold, "policy 'blockbatch' commits by threshold; commit must be "
                    "'threshold'");
  TORCH_CHECK_VALUE(!block_sizes.empty(), "block_sizes must not be empty");
  TORCH_CHECK_VALUE(static_cast<int64_t>(block_sizes.size()) <= branches::kMaxBranches, "block_sizes may hold at most ",
                    branches::kMaxBranches, " branches, got ", block_sizes.size());
  std::set<int64_t> seen;
  for (int64_t b : block_sizes) {
    TORCH_CHECK_VALUE(b > 0, "block_sizes entries must be > 0, got ", b);
    TORCH_CHECK_VALUE(gen_length % b == 0, "block size ", b, " in block_sizes must divide gen_length = ", gen_length);
    TORCH_CHECK_VALUE(seen.insert(b).second, "block_sizes must not repeat a size, got ", b, " twice");
  }
  TORCH_CHECK_VALUE(merge_gate > 0 && merge_gate <= 1, "merge_gate must be in (0, 1], got ", merge_gate);
  TORCH_CHECK_VALUE(sync_gap >= 0 && sync_gap <= kMaxGapTokens, "sync_gap must be in [0, ", kMaxGapTokens, "], got ",
                    sync_gap);
  TORCH_CHECK_VALUE(refresh_tokens >= 0 && refresh_tokens <= kMaxGapTokens, "refresh_tokens must be in [0, ",
                    kMaxGapTokens, "] (0 disables the refresh), got ", refresh_tokens);
  TORCH_CHECK_VALUE(prob_floor >= kMinProbFloor && prob_floor < 1, "prob_floor must be in [", kMinProbFloor,
                    ", 1), got ", prob_floor);
}

const std::vector<std::string>& decode_stat_names() {
  static const std::vector<std::string> names = {
      "nfe", "nfe_full", "nfe_block", "nfe_init", "nfe_refresh", "nfe_paper",
      "winner", "winner_block_size", "early_exit", "wall_ms", "steps", "graph_captures", "graph_replays"};
  return names;
}

std::vector<double> decode_stat_values(const DecodeStats& s) {
  return {static_cast<double>(s.nfe),        static_cast<double>(s.nfe_full),
          static_cast<double>(s.nfe_block),  static_cast<double>(s.nfe_init),
          static_cast<double>(s.nfe_refresh), static_cast<double>(s.nfe_paper),
          static_cast<double>(s.winner),     static_cast<double>(s.winner_block_size),
          s.early_exit ? 1.0 : 0.0,          s.wall_ms,
          static_cast<double>(s.steps.size()), static_cast<double>(s.graph_captures),
          static_cast<double>(s.graph_replays)};
}

}  // namespace blockbatch
