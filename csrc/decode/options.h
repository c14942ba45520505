// Decoding options and statistics (ALGORITHMS.md sections 2-4), shared by every policy.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "model/config.h"

namespace blockbatch {

enum class Policy { kVanilla, kPrefix, kDual, kBlockBatch };
enum class CommitRule { kThreshold, kFixed, kFactor };
enum class RefreshMode { kPeriodic, kDivergence };

struct DecodeOptions {
  Policy policy = Policy::kDual;
  int64_t gen_length = 128;
  int64_t block_length = 32;      // single-branch policies
  int64_t steps = 0;              // fixed schedule: total steps over the generation
  CommitRule commit = CommitRule::kThreshold;
  double threshold = 0.9;
  double factor = 1.0;
  double temperature = 0.0;       // > 0: Gumbel-max in float64 (seeded)
  int64_t seed = 0;
  bool stop_on_eos = false;
  // BlockBatch (section 4)
  std::vector<int64_t> block_sizes = {4, 8, 16, 32, 64, 128};
  double merge_gate = 0.5;
  int64_t sync_gap = 8;
  int64_t refresh_tokens = 32;    // 0 disables the refresh
  RefreshMode refresh_mode = RefreshMode::kPeriodic;
  double prob_floor = 0.1;
  bool merge = true;              // ablation switches (tests show each mechanism matters)
  bool sync = true;
  bool cuda_graphs = true;        // CUDA: replay recorded steps (StepRunner); no effect on CPU
  double timeout_s = 0.0;         // > 0: the decode fails with a clear error once this many seconds pass

  // Throws c10::Error naming the argument and its allowed range.
  void validate(const ModelConfig& config, int64_t prompt_length) const;
};

Policy parse_policy(const std::string& name);
CommitRule parse_commit_rule(const std::string& name);
const char* commit_rule_name(CommitRule rule);  // parse_commit_rule's inverse
RefreshMode parse_refresh_mode(const std::string& name);

// Bounds of the options (DecodeOptions::validate; python/blockbatch/options.py uses the same).
constexpr double kMinProbFloor = 0.01;      // the probability maps hold at most 1 / floor + 1 entries
constexpr int64_t kMaxGapTokens = int64_t(1) << 30;  // sync_gap, refresh_tokens

struct BranchStats {
  int64_t block_size = 0;
  int64_t committed = 0;  // tokens committed by its own forwards
  int64_t merged = 0;     // tokens written by confidence-gated merging
  int64_t copied = 0;     // tokens received by leader sync
  int64_t forwards = 0;   // forwards it took part in (the paper's per-branch NFE)
};

struct DecodeStats {
  int64_t nfe = 0;        // forwards executed (a batched forward is one)
  int64_t nfe_full = 0;   // full-canvas forwards (single-branch block starts, vanilla steps)
  int64_t nfe_block = 0;  // cached block forwards
  int64_t nfe_init = 0;   // BlockBatch init forward
  int64_t nfe_refresh = 0;
  int64_t nfe_paper = 0;  // the paper's accounting: the winner's participation count
  int64_t winner = 0;     // index of the returned branch (sorted block sizes)
  int64_t winner_block_size = 0;
  bool early_exit = false;
  double wall_ms = 0;
  int64_t graph_captures = 0;  // CUDA graphs recorded / replayed (0 on CPU or with cuda_graphs off)
  int64_t graph_replays = 0;
  std::vector<std::array<int64_t, 2>> steps;  // per forward: tokens committed, packed query tokens
  std::vector<BranchStats> branches;
};

// Names of the scalar counters, in the order decode returns them.
const std::vector<std::string>& decode_stat_names();
std::vector<double> decode_stat_values(const DecodeStats& s);

}  // namespace blockbatch
