// BlockBatch's pieces shared by its files (decode/policies/blockbatch*.cpp): its per-family rules
// (the rows of blockbatch.cpp's table), a branch's span of a step, and the branch executors the
// skeleton (blockbatch.cpp) runs: blockbatch_device.cpp (Readout::kDevice) and blockbatch_host.cpp
// (Readout::kHostTopk), one combination of the rules each.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "decode/policies/branch_rows.h"
#include "decode/policies/policy.h"
#include "kernels/branches.h"

namespace blockbatch::bbatch {

namespace br = branches;

enum class MapRule {
  kReplace,              // LLaDA: a block step's map replaces the window's entries (probabilities > floor)
  kAccumulateSinceSeed,  // Dream: entries accumulate (> floor) until the next seed clears them (5.4)
};
enum class ExitRule {
  kEosProbabilityTie,     // LLaDA: the highest EOS probability within the tie tolerance, after block steps (4.6)
  kDecodedProgressBlock,  // Dream: the largest (decoded, progress, block), checked after every phase (5.4)
};
enum class RefreshClock {
  kBlocks,          // LLaDA: completed blocks since the branch's last refresh
  kFrontierTokens,  // Dream: tokens of frontier progress since the last seed
};
enum class NfeCount {
  kWinnerParticipation,  // LLaDA: the paper's NFE is the winner's forwards
  kEveryForward,         // Dream: every forward executed (the authors' harness counts model calls)
};

// BlockBatch's rules for one family (docs/ALGORITHMS.md sections 4 and 5.4).
struct BlockBatchRules {
  const char* family;
  SeedRule full_forward;
  MapRule map;
  bool gate_inclusive;  // a merge writes a token rated >= merge_threshold (else >)
  ExitRule exit;
  RefreshClock refresh_clock;
  NfeCount nfe;
  Readout readout;  // which executor keeps the branches
  bool samplers;    // alg / alg_temp (the family's sample_tokens)
  bool samples;     // temperature > 0
  bool divergence;  // refresh_mode 'divergence'
  bool filters;     // top_p / top_k (BlockBatch proposes the argmax otherwise)
};

// Branch b's part of a step: its window [start, end) (a block step) or its whole row (a full
// forward), fed as query row `row` of the packed forward, whose first output is `first`.
struct Span {
  int64_t b = 0, row = 0, first = 0, start = 0, end = 0;
};

// For each of `rows` (canvas rows of length L in x), the index in `rows` of the first row with the
// same canvas (itself when none before it has).
std::vector<int64_t> first_equal_rows(const int64_t* x, int64_t L, const std::vector<int64_t>& rows);

// A refresh's KV copies, appended to its plan's entries as a row-copy source map ([B], -1: none;
// BranchRows::copy_on_device): a folded span (its query row fed by an earlier span) copies the K/V the
// forward wrote into the earlier span's branch row.
void add_fold_sources(StepPlan& p, const std::vector<Span>& spans, int64_t B);
// Those sources again, from the plan's entries (the last B).
std::vector<int64_t> fold_sources(const StepPlan& p, int64_t B);
// The init's row copies as a source map: the batch-1 forward filled row 0, every other row copies it.
std::vector<int64_t> init_sources(int64_t B);

// The branches' canvases, windows, maps and counters, and the family's rules over them: the
// executor the skeleton runs a step's readout and the coordination with (BlockBatchRules::readout).
class Branches {
 public:
  explicit Branches(int64_t B) : st_(static_cast<size_t>(B * br::kFields), 0) {}
  virtual ~Branches() = default;
  virtual void check(const Stop& stop, int64_t forwards) const = 0;
  bool done(int64_t b) const { return st(b)[br::kDone] != 0; }  // as of the last absorb
  // every branch's commits so far
  int64_t committed() const {
    int64_t n = 0;
    for (size_t b = 0; b < st_.size() / br::kFields; ++b) n += st(static_cast<int64_t>(b))[br::kCommitted];
    return n;
  }
  // The next block step's windows: every branch not done with a mask in its window, in order.
  virtual std::vector<Span> work() = 0;
  // For each of `rows` (branches), the index in `rows` of the first with the same canvas.
  virtual std::vector<int64_t> first_equal(const std::vector<int64_t>& rows) const = 0;
  // The outputs a forward over `spans` reads (p.q.logit_index) and the executor's entries (p.extra).
  virtual void reads(StepPlan& p, const std::vector<Span>& spans) = 0;
  virtual at::Tensor tokens_from(const StepPlan& p, const at::Tensor& buffer) const = 0;
  virtual std::vector<at::Tensor> after_forward(const StepPlan& p, const at::Tensor& buffer,
                                                const at::Tensor& logits) = 0;
  virtual void absorb(const StepPlan& p, const at::Tensor& logits, const std::vector<at::Tensor>& host) = 0;
  virtual void coordinate() = 0;      // advance, merge, sync (kDevice: ran in the step's after_forward)
  virtual bool refresh_wanted() = 0;  // asked once per coordination
  // The exit rule: the winner, or -1; eos: the winner ended on EOS (an early exit).
  virtual int64_t exit(bool& eos) = 0;
  virtual int64_t natural_winner() const = 0;  // every branch done without an exit
  virtual std::vector<int64_t> tokens(int64_t winner, bool eos) = 0;
  // The `logprobs` option (docs/ALGORITHMS.md 17): branch `winner`'s records of the generation
  // (host float64 [G, 1 + 2 top]; undefined when off; eos: as tokens(), NaN where it filled EOS),
  // and the rows of generation positions [from, from + count) that can no longer change whoever
  // wins: the longest prefix where every branch holds the same record (settled_rows).
  virtual at::Tensor logprobs(int64_t winner, bool eos) const = 0;
  virtual at::Tensor settled_logprobs(int64_t from, int64_t count) const = 0;
  BranchStats stats(int64_t b) const {  // all but forwards (the skeleton's)
    BranchStats s;
    s.block_size = st(b)[br::kBlock];
    s.committed = st(b)[br::kCommitted];
    s.merged = st(b)[br::kMerged];
    s.copied = st(b)[br::kCopied];
    return s;
  }

 protected:
  int64_t* st(int64_t b) { return &st_[b * br::kFields]; }
  const int64_t* st(int64_t b) const { return &st_[b * br::kFields]; }
  std::vector<int64_t> st_;  // the state table [B, kFields] of kernels/branches.h (kDevice: the last readback)
};

// The rows of `rec` [B, count, R] (the branches' records of `count` positions, any device) that
// every branch holds alike, from the first: host [n, R]. A sync copies records and nothing else
// rewrites a position that holds a token, so such a row is the winner's whoever wins.
at::Tensor settled_rows(const at::Tensor& rec, int64_t count);

// The executors (one file each).
std::unique_ptr<Branches> device_branches(const Network& model, const std::vector<int64_t>& prompt,
                                          const DecodeOptions& o, const std::vector<int64_t>& sizes, BranchRows& rows);
std::unique_ptr<Branches> host_branches(const Network& model, const std::vector<int64_t>& prompt,
                                        const DecodeOptions& o, const BlockBatchRules& rules,
                                        const std::vector<int64_t>& sizes, BranchRows& rows);

}  // namespace blockbatch::bbatch
