// BlockBatch multi-branch consensus decoding for every family (ALGORITHMS.md 4 and 5.4), as a step
// machine (decode/decoder.h). The python twins are reference/blockbatch.py (LLaDA's rules) and
// reference/dream.py (_DreamBlockBatch); all are written from the spec and must agree on tokens,
// NFE, winner and every counter.
//
// The skeleton, the same for every family (BlockBatch below): an init forward over the prompt row
// (its K/V copied to every branch's row); then, until an exit or every branch is done: a block step
// (every branch with a mask in its window feeds the window [start - shift, end - shift) against its
// own KV row, dual mode: one packed forward, or none when no branch has one), the exit check, the
// coordination (advance, merge, sync), the refresh decision and a refresh (one full forward over the
// rows of the branches not done; with fold_rows a row whose canvas equals an earlier row's is not
// fed: a full forward reads nothing but the canvas, so the twin takes that row's logits and K/V
// exactly). The family's row (kRules below) fills in:
//   logit_shift   canvas position p reads output p - shift (a block step feeds the windows shifted)
//   full_forward  kCommitByRule: a full forward commits by the threshold rule and records every
//                 position's map, and the init is followed by a coordination; kFirstMaskArgmax: it
//                 seeds each branch's first window mask, and the init goes straight to the loop
//   exit          kEosProbabilityTie is checked after block steps; kDecodedProgressBlock after
//                 every phase (the init, the loop's top, before and after the coordination, a refresh)
//   nfe           the winner's forwards, or every forward
//   readout       which executor keeps the branches (Branches): kDevice, the device state of
//                 kernels/branches.h (LLaDA's map, gate, EOS exit and block refresh clock; the
//                 coordination runs on the device inside the step); kHostTopk, the host canvas
//                 ranked in at::topk's tie order (Dream's accumulated map, >= gate, decoded /
//                 progress / block exit and frontier-token clock; the coordination on the host).
#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/full.h>
#include <ATen/ops/gather.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "decode/policies/blockbatch.h"

namespace blockbatch {

namespace bbatch {

// For each of `rows` (canvas rows of length L in x), the index in `rows` of the first row with the
// same canvas (itself when none before it has).
std::vector<int64_t> first_equal_rows(const int64_t* x, int64_t L, const std::vector<int64_t>& rows) {
  std::vector<int64_t> first(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    first[i] = static_cast<int64_t>(i);
    const int64_t* xi = x + rows[i] * L;
    for (size_t j = 0; j < i; ++j) {
      if (first[j] == static_cast<int64_t>(j) && std::equal(xi, xi + L, x + rows[j] * L)) {
        first[i] = static_cast<int64_t>(j);
        break;
      }
    }
  }
  return first;
}

// A refresh's KV copies, appended to its plan's entries as a row-copy source map ([B], -1: none;
// BranchRows::copy_on_device): a folded span (its query row fed by an earlier span) copies the K/V the forward wrote
// into the earlier span's branch row.
void add_fold_sources(StepPlan& p, const std::vector<Span>& spans, int64_t B) {
  std::vector<int64_t> src(static_cast<size_t>(B), -1);
  for (size_t i = 0; i < spans.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (spans[j].row == spans[i].row) {
        src[spans[i].b] = spans[j].b;
        break;
      }
    }
  }
  p.extra.insert(p.extra.end(), src.begin(), src.end());
}
// Those sources again, from the plan's entries (the last B).
std::vector<int64_t> fold_sources(const StepPlan& p, int64_t B) { return {p.extra.end() - B, p.extra.end()}; }

at::Tensor settled_rows(const at::Tensor& rec, int64_t count) {
  const at::Tensor r = rec.contiguous().cpu();
  const int64_t B = r.size(0), R = r.size(2);
  const double* d = r.const_data_ptr<double>();
  int64_t n = 0;
  for (bool same = true; same && n < count; n += same ? 1 : 0) {
    for (int64_t b = 1; b < B && same; ++b) {
      same = std::memcmp(d + n * R, d + (b * count + n) * R, sizeof(double) * R) == 0;
    }
  }
  return r.select(0, 0).narrow(0, 0, n);
}
// The init's row copies as a source map: the batch-1 forward filled row 0, every other row copies it.
std::vector<int64_t> init_sources(int64_t B) {
  std::vector<int64_t> src(static_cast<size_t>(B), 0);
  src[0] = -1;
  return src;
}

}  // namespace bbatch

namespace {

using namespace bbatch;  // NOLINT(google-build-using-namespace): the policy's own pieces

const std::vector<BlockBatchRules> kRules{
    {"llada", SeedRule::kCommitByRule, MapRule::kReplace, /*gate_inclusive=*/false, ExitRule::kEosProbabilityTie,
     RefreshClock::kBlocks, NfeCount::kWinnerParticipation, Readout::kDevice, /*samplers=*/false, /*samples=*/true,
     /*divergence=*/true, /*filters=*/false},
    {"dream", SeedRule::kFirstMaskArgmax, MapRule::kAccumulateSinceSeed, /*gate_inclusive=*/true,
     ExitRule::kDecodedProgressBlock, RefreshClock::kFrontierTokens, NfeCount::kEveryForward, Readout::kHostTopk,
     /*samplers=*/true, /*samples=*/false, /*divergence=*/false, /*filters=*/false},
};

const BlockBatchRules& rules_of(const ModelConfig& c) {
  const BlockBatchRules* r = family_row(kRules, family_spec(c.family));
  TORCH_CHECK(r != nullptr, "blockbatch has no rules for ", family_spec(c.family).name,
              " checkpoints (refused at admission)");
  return *r;
}

// The skeleton: the order of forwards, exit checks, coordinations and refreshes, the stop checks,
// the no-progress guard and the counters, the same for every family.
class BlockBatch final : public Decoder {
 public:
  BlockBatch(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o, const Stop& stop,
             KvRows kv)
      : rules_(rules_of(model.config())), shift_(family_spec(model.config().family).logit_shift), stop_(stop),
        lp_(static_cast<int64_t>(prompt.size())), G_(o.gen_length), L_(lp_ + G_),
        B_(static_cast<int64_t>(o.block_sizes->size())), sizes_(*o.block_sizes),
        every_phase_(rules_.exit == ExitRule::kDecodedProgressBlock),
        seeding_(rules_.full_forward == SeedRule::kFirstMaskArgmax), fold_(o.fold_rows), forwards_(B_, 0) {
    std::sort(sizes_.begin(), sizes_.end());
    kv_ = std::move(kv);  // the pool's rows, or made here (dense; share_prompt_kv: pages)
    rows_ = std::make_unique<BranchRows>(model, kv_, B_, lp_, L_, o);
    // Each executor implements one combination of the map, exit, refresh-clock and seed rules.
    const bool host = rules_.readout == Readout::kHostTopk;
    TORCH_CHECK(host ? rules_.map == MapRule::kAccumulateSinceSeed && rules_.exit == ExitRule::kDecodedProgressBlock &&
                           rules_.refresh_clock == RefreshClock::kFrontierTokens && seeding_
                     : rules_.map == MapRule::kReplace && rules_.exit == ExitRule::kEosProbabilityTie &&
                           rules_.refresh_clock == RefreshClock::kBlocks && !seeding_ && !rules_.gate_inclusive,
                "blockbatch: no branch executor implements the rules of family '", rules_.family, "'");
    book_ = host ? host_branches(model, prompt, o, rules_, sizes_, *rows_)
                 : device_branches(model, prompt, o, sizes_, *rows_);
  }

  bool done() const override { return finished_; }

  StepPlan plan() override {
    StepPlan p;
    p.kind = next_;
    int64_t owner = -1;
    if (next_ == StepKind::kCoordinate) {  // no branch has a mask in its window: the device coordination only
      p.forward = false;
      return p;
    }
    book_->check(stop_, nfe());
    if (next_ == StepKind::kBlock) {  // every window with a mask, against its own KV row (dual)
      spans_ = std::move(windows_);
      for (Span& s : spans_) {
        s.first = p.q.size();
        p.q.add_positions(s.start - shift_, s.end - shift_, s.b, s.b * L_);
      }
      p.mode = KvMode::kDual;
      stats_.nfe_block += 1;
    } else {  // a full forward: the prompt row, read by every branch (init), or every row not done (refresh)
      const bool init = next_ == StepKind::kInit;
      if (init) p.q.add_positions(0, L_, 0, 0);
      std::vector<int64_t> rows;
      for (int64_t b = 0; b < B_; ++b) {
        if (init || !book_->done(b)) rows.push_back(b);
      }
      owner = rows.front();  // share_prompt_kv: the prompt's K/V written through the first row fed
      // fold_rows: a refresh row whose canvas equals an earlier one's reads that row's outputs.
      const std::vector<int64_t> same = !init && fold_ ? book_->first_equal(rows) : std::vector<int64_t>();
      spans_.clear();
      for (size_t i = 0; i < rows.size(); ++i) {
        const int64_t b = rows[i];
        if (init) {
          spans_.push_back({b, 0, 0, lp_, L_});
        } else if (!same.empty() && same[i] != static_cast<int64_t>(i)) {
          spans_.push_back({b, spans_[same[i]].row, 0, lp_, L_});
          stats_.folded_rows += 1;
          stats_.folded_tokens += L_;
        } else {
          spans_.push_back({b, p.q.rows(), 0, lp_, L_});
          p.q.add_positions(0, L_, b, b * L_);
        }
      }
      (init ? stats_.nfe_init : stats_.nfe_refresh) += 1;
      p.mode = KvMode::kFull;
    }
    for (const Span& s : spans_) forwards_[s.b] += 1;
    before_ = book_->committed();
    book_->reads(p, spans_);
    rows_->before_forward(p.q, p.mode == KvMode::kFull, owner);  // paged: copy on write
    return p;
  }

  at::Tensor tokens_from(const StepPlan& p, const at::Tensor& buffer) const override {
    return book_->tokens_from(p, buffer);
  }

  std::vector<at::Tensor> after_forward(const StepPlan& p, const at::Tensor& buffer,
                                        const at::Tensor& logits) override {
    std::vector<at::Tensor> out = book_->after_forward(p, buffer, logits);
    if (p.forward && p.kind != StepKind::kBlock) rows_->after_full();
    return out;
  }

  void absorb(const StepPlan& p, const at::Tensor& logits, const std::vector<at::Tensor>& host) override {
    book_->absorb(p, logits, host);
    if (p.forward) {
      const int64_t committed = book_->committed() - before_;
      stats_.steps.push_back({committed, p.q.size(), p.q.key_tokens(p.mode, L_)});
      // Every branch in an init or block step commits at least one token in its window.
      if (committed == 0 && p.kind != StepKind::kRefresh) no_progress(p.kind == StepKind::kInit);
    }
    settle(p.kind);
  }

  at::Tensor logprob_rows(int64_t from, int64_t count) const override { return book_->settled_logprobs(from, count); }

  DecodeResult finish() override {
    if (winner_ < 0) winner_ = book_->natural_winner();
    DecodeResult res;
    res.tokens = book_->tokens(winner_, early_exit_);
    res.logprobs = book_->logprobs(winner_, early_exit_);
    stats_.nfe = nfe();
    stats_.nfe_paper = rules_.nfe == NfeCount::kWinnerParticipation ? forwards_[winner_] : stats_.nfe;
    stats_.winner = winner_;
    stats_.winner_block_size = sizes_[winner_];
    stats_.kv_pages_copied = rows_->pages_copied();
    stats_.early_exit = early_exit_;
    for (int64_t b = 0; b < B_; ++b) {
      BranchStats s = book_->stats(b);
      s.forwards = forwards_[b];
      stats_.branches.push_back(s);
    }
    res.stats = std::move(stats_);
    return res;
  }

 private:
  int64_t nfe() const { return stats_.nfe_init + stats_.nfe_block + stats_.nfe_refresh; }
  bool all_done() const {
    for (int64_t b = 0; b < B_; ++b) {
      if (!book_->done(b)) return false;
    }
    return true;
  }
  bool exited() {
    bool eos = false;
    const int64_t w = book_->exit(eos);
    if (w < 0) return false;
    winner_ = w;
    early_exit_ = eos;
    finished_ = true;
    return true;
  }

  // The host phases after a step of `kind`, until the next step is known (next_) or the decode
  // ends: after a block step (or a step without one) the exit check, the coordination and the
  // refresh decision; then the loop's top.
  void settle(StepKind kind) {
    // Bound: every block step with a forward commits at least one token in some branch, merges
    // and syncs only fill masks, so the rows fill within B G block steps (ALGORITHMS.md 4.5); a
    // Dream sync can undo a lagging row's progress at most once per leader token. 4 B G + 8
    // passes cover both with room to spare.
    const int64_t max_passes = 4 * B_ * G_ + 8;
    for (;;) {
      if (kind == StepKind::kBlock || kind == StepKind::kCoordinate || (kind == StepKind::kInit && !seeding_)) {
        if (kind != StepKind::kInit && exited()) return;
        book_->coordinate();
        if (every_phase_ && exited()) return;
        const bool want = book_->refresh_wanted();
        if (want && !all_done()) {
          next_ = StepKind::kRefresh;
          return;
        }
      } else if (every_phase_ && exited()) {  // after a seeding init or a refresh
        return;
      }
      if (all_done()) {  // the natural exit
        finished_ = true;
        return;
      }
      TORCH_CHECK(++passes_ <= max_passes, "blockbatch: internal error: the decode did not finish within ", max_passes,
                  " block steps (4 * branches * gen_length + 8); please report it with the options");
      if (every_phase_ && exited()) return;
      windows_ = book_->work();
      if (!windows_.empty() || rules_.readout == Readout::kDevice) {
        next_ = windows_.empty() ? StepKind::kCoordinate : StepKind::kBlock;
        return;
      }
      kind = StepKind::kCoordinate;  // the host coordination follows at once
    }
  }

  [[noreturn]] void no_progress(bool init) const {
    std::string what = init ? "init forward" : "block step over branch windows";
    for (const Span& s : spans_) {
      what += " [" + std::to_string(s.start) + ", " + std::to_string(init ? s.start + sizes_[s.b] : s.end) + ")";
      if (init) break;
    }
    stop_.no_progress(static_cast<int64_t>(stats_.steps.size()) - 1, what);
  }

  const BlockBatchRules& rules_;
  const int64_t shift_;  // the family's logit shift
  const Stop& stop_;
  const int64_t lp_, G_, L_, B_;
  std::vector<int64_t> sizes_;  // the branches' block sizes, ascending
  const bool every_phase_, seeding_, fold_;
  std::unique_ptr<BranchRows> rows_;  // before book_: its executors hold it
  std::unique_ptr<Branches> book_;
  StepKind next_ = StepKind::kInit;  // kInit, kBlock, kCoordinate or kRefresh
  bool finished_ = false, early_exit_ = false;
  int64_t winner_ = -1, passes_ = 0, before_ = 0;
  std::vector<Span> windows_, spans_;  // the next block step's windows; the step in flight
  std::vector<int64_t> forwards_;      // the forwards each branch took part in
  DecodeStats stats_;
};

std::unique_ptr<Decoder> make(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o,
                              const Stop& stop, KvRows kv) {
  return std::make_unique<BlockBatch>(model, prompt, o, stop, std::move(kv));
}

std::string family_refusal(const FamilySpec& f) {
  if (f.attention == AttentionPattern::kBlockCausal) {
    return c10::str("is not defined on ", f.name,
                    " checkpoints (block-causal attention: a block sees only itself and earlier blocks, so "
                    "branches of other block sizes see other keys)");
  }
  if (family_row(kRules, f) == nullptr) return c10::str("has no rules for ", f.name, " checkpoints");
  return "";
}

Refusal option_refusal(const FamilySpec* family, const DecodeOptions& o) {
  const BlockBatchRules* rules = family != nullptr ? family_row(kRules, *family) : nullptr;
  if (Refusal why = bidirectional_refusal(family, rules == nullptr || rules->samplers, o)) return why;
  if (rules != nullptr && !rules->samples && o.temperature != 0) {
    return {"temperature",
            c10::str("temperature > 0 samples only in policy 'vanilla' on ", family->name,
                     " checkpoints; policy 'blockbatch' decodes them greedily (as the authors' decoders do)")};
  }
  if (o.commit() != CommitRule::kThreshold) {
    return {o.factor ? "factor" : "threshold",
            "policy 'blockbatch' commits by threshold: set threshold and leave factor None"};
  }
  if (rules != nullptr && !rules->divergence && o.refresh_mode != RefreshMode::kPeriodic) {
    return {"refresh_mode",
            c10::str("refresh_mode 'divergence' is not defined for ", family->name,
                     " checkpoints: their BlockBatch refreshes every refresh_tokens tokens (refresh_mode='periodic')")};
  }
  if (rules != nullptr && rules->samplers && !rules->filters && (o.top_p || o.top_k)) {
    return {o.top_p ? "top_p" : "top_k",
            "top_p / top_k apply to the single-branch decoders; BlockBatch proposes the argmax"};
  }
  if (!o.block_sizes) return {};  // the family's default, checked once resolved
  if (o.block_sizes->empty()) return {"block_sizes", "block_sizes must be a non-empty list of block sizes"};
  std::set<int64_t> seen;
  for (int64_t b : *o.block_sizes) {
    if (o.gen_length % b != 0) {
      return {"block_sizes",
              c10::str("block size ", b, " in block_sizes must be a positive divisor of gen_length = ", o.gen_length)};
    }
    if (!seen.insert(b).second) {
      return {"block_sizes", c10::str("block_sizes must not repeat a size, got ", b, " twice")};
    }
  }
  return {};
}

int64_t kv_rows(const DecodeOptions& o) { return static_cast<int64_t>(o.block_sizes->size()); }

// share_prompt_kv's copies after a full forward depend on the row that owns the prompt pages that
// time (decode/policies/branch_rows.h): not a graph's fixed work, so such decodes run eagerly.
bool graphs(const DecodeOptions& o) { return !o.share_prompt_kv; }

const char* needs_paged_pool(const DecodeOptions& o) { return o.share_prompt_kv ? "share_prompt_kv" : nullptr; }

bool adapts_to_load(const DecodeOptions& o) { return o.branch_budget == BranchBudget::kAuto; }

// A request left with one branch decodes as a dual cache of that block size (with blockbatch's
// threshold and EOS exit): one branch has nothing to merge or sync with, and the dual cache's loop
// does the same forwards without the branch bookkeeping (ALGORITHMS.md 9.4).
DecodeOptions single_branch_as_dual(DecodeOptions o) {
  if (!o.block_sizes || o.block_sizes->size() != 1) return o;
  o.policy = Policy::kDual;
  o.block_length = o.block_sizes->front();
  return o;  // threshold and stop_on_eos: blockbatch's, already resolved
}

// branch_budget = auto (decode/budget.h): budget_branches' sizes at the load (an empty curve keeps
// them all), one size left as a dual cache.
DecodeOptions at_load(const DecodeOptions& o, int64_t load, const StepCurve& curve) {
  if (o.branch_budget != BranchBudget::kAuto) return o;
  DecodeOptions b = o;
  b.block_sizes = budget_branches(*o.block_sizes, o.block_length, load, curve);
  return single_branch_as_dual(b);
}

}  // namespace

namespace pd = policy_defaults;

extern const PolicyDescriptor kBlockBatchPolicy{
    .id = Policy::kBlockBatch,
    .family_refusal = family_refusal,
    .option_refusal = option_refusal,
    .kv_rows = kv_rows,
    .canvas_unit = pd::one,
    .cached_prompt_block = pd::none,
    .graphs = graphs,
    .needs_paged_pool = needs_paged_pool,
    .adapts_to_load = adapts_to_load,
    .at_load = at_load,
    .steps_with_confidence = false,
    .step_kinds = {StepKind::kInit, StepKind::kBlock, StepKind::kCoordinate, StepKind::kRefresh},
    .stats = {"nfe_init", "nfe_block", "nfe_refresh", "nfe_paper", "winner", "winner_block_size", "early_exit",
              "folded_rows", "folded_tokens", "kv_pages_copied"},
    .logprobs = true,
    .make = make};

}  // namespace blockbatch
