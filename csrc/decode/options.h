// Decoding options (docs/ALGORITHMS.md sections 2-4) and statistics, shared by every policy.
//
// The options themselves (struct, defaults, enums, ranges) are generated from the table in
// python/blockbatch/contract.py into options_table.h; this header adds the statistics.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "decode/options_table.h"
#include "model/config.h"

namespace blockbatch {

CommitRule parse_commit_rule(const std::string& name);  // "threshold" | "fixed" | "factor"
const char* commit_rule_name(CommitRule rule);          // parse_commit_rule's inverse

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
  int64_t nfe_prefill = 0;  // block on SDAR: the authors' prefill forward (1 if the prompt holds a complete block)
  int64_t nfe_store = 0;    // block on SDAR: the authors' store forwards (one per decoded block)
  int64_t nfe_paper = 0;    // the paper's accounting: the winner's participation count
  int64_t winner = 0;       // index of the returned branch (sorted block sizes)
  int64_t winner_block_size = 0;
  bool early_exit = false;
  double wall_ms = 0;
  int64_t graph_captures = 0;  // CUDA graphs recorded / replayed (0 on CPU or with cuda_graphs off)
  int64_t graph_replays = 0;
  int64_t edits = 0;                    // block with edit_threshold: committed tokens replaced (LLaDA2.1)
  int64_t folded_rows = 0;              // blockbatch fold_rows: refresh rows not fed (a twin of an identical canvas)
  int64_t folded_tokens = 0;            // their query tokens (steps counts the fed ones)
  int64_t prefix_cache_hit_tokens = 0;  // prompt positions whose K/V came from the scheduler's prefix cache
  int64_t kv_pages_copied = 0;          // blockbatch, paged rows: KV pages copied on write (a row copy moves none)
  int64_t nfe_pruned = 0;               // window: pruned forwards (active positions over a key window)
  int64_t pruned_key_tokens = 0;        // window: keys those forwards attended, summed
  int64_t blocks_in_flight = 0;         // wavefront: active blocks summed over the forwards
  int64_t max_blocks_in_flight = 0;     // wavefront: the most blocks one forward ran
  int64_t redrafted_tokens = 0;         // wavefront: edits of tokens drafted while an older block was in flight
  int64_t prefix_keys_selected = 0;     // block, DUET: selected prefix keys, summed over layers and sparse steps
  int64_t query_rows_dropped = 0;       // block, DUET: block rows dropped after the selection layer
  // Per forward: tokens committed, packed query tokens, keys attended, and the blocks in flight (wavefront's
  // active blocks; 0 where the policy keeps no block window: every other policy).
  std::vector<std::array<int64_t, 4>> steps;
  std::vector<BranchStats> branches;
};

// The positions a request's canvas (and KV row) spans: prompt + gen_length, rounded up to a whole
// block for the block-causal policies (blocks aligned at position 0; the authors decode the tail block whole).
int64_t canvas_length(const DecodeOptions& o, int64_t prompt_length);

// Names of the scalar counters, in the order decode returns them, and their values (generated from
// the STATS table of python/blockbatch/contract.py into decode/stats_table.cpp).
const std::vector<std::string>& decode_stat_names();
std::vector<double> decode_stat_values(const DecodeStats& s);

}  // namespace blockbatch
