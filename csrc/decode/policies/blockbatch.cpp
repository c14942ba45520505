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
// exactly). The family's rules (decode/family.h) fill in:
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
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/full.h>
#include <ATen/ops/gather.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "decode/family.h"
#include "decode/policies/host_canvas.h"
#include "decode/policies/branch_rows.h"
#include "kernels/branches.h"
#include "ops/ops.h"

namespace blockbatch {

namespace {

namespace br = branches;

// Branch b's part of a step: its window [start, end) (a block step) or its whole row (a full
// forward), fed as query row `row` of the packed forward, whose first output is `first`.
struct Span {
  int64_t b = 0, row = 0, first = 0, start = 0, end = 0;
};

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
// The init's row copies as a source map: the batch-1 forward filled row 0, every other row copies it.
std::vector<int64_t> init_sources(int64_t B) {
  std::vector<int64_t> src(static_cast<size_t>(B), 0);
  src[0] = -1;
  return src;
}

// The branches' canvases, windows, maps and counters, and the family's rules over them: the
// executor the skeleton runs a step's readout and the coordination with (FamilyRules::readout).
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

// EOS-ready branches whose EOS probabilities differ by less than float32's machine epsilon tie at
// the early exit; the smallest block size among them wins. The authors rank them by a low-precision
// softmax (bfloat16; float32 in the parity runs) in which near-certain probabilities collapse onto
// equal values and max() keeps the first branch.
constexpr double kEosTie = 1.0 / (1 << 23);

// Readout::kDevice. Everything a branch owns lives on the model's device: canvases [B, L], KV rows,
// the sparse probability maps and the state table (windows, counters, flags). A step is one device
// program (StepRunner: one host->device copy of its index buffer; on CUDA a graph replayed per
// active-branch set): forward, confidence, sparse probabilities, bb_absorb_ (map update, threshold
// commit, EOS readiness) and, after init and block steps, bb_coordinate_ (advance, merge, sync),
// the row copies (decode/policies/branch_rows.h) and the divergence test; then ONE device->host
// copy of the state table (13 numbers per branch), from which the host decides the next step's
// shape. The bookkeeping is csrc/kernels/branches.h: the same source runs as CPU loops and as one
// CUDA thread block. Sampling (temperature > 0) draws its Gumbel noise from the seeded host
// generator (the reference's draws), so those steps read the float64 logits back and absorb eagerly.
class DeviceBranches final : public Branches {
 public:
  DeviceBranches(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o,
                 const std::vector<int64_t>& sizes, BranchRows& rows)
      : Branches(static_cast<int64_t>(sizes.size())), model_(model), o_(o), c_(model.config()),
        lp_(static_cast<int64_t>(prompt.size())), G_(o.gen_length), L_(lp_ + G_),
        B_(static_cast<int64_t>(sizes.size())), K_(static_cast<int64_t>(std::floor(1.0 / *o.prob_floor)) + 1),
        sampling_(o.temperature > 0),
        generator_(at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(o.seed))), eos_(B_, 0.0),
        sync_h_(B_, -1), rows_(rows) {
    std::vector<int64_t> canvas(static_cast<size_t>(B_ * L_), c_.mask_token_id);
    for (int64_t b = 0; b < B_; ++b) {
      std::copy(prompt.begin(), prompt.end(), canvas.begin() + b * L_);
      st(b)[br::kBlock] = sizes[b];
      st(b)[br::kStart] = lp_;
      st(b)[br::kEnd] = lp_ + sizes[b];
      st(b)[br::kMasks] = sizes[b];
    }
    const at::TensorOptions dev = at::TensorOptions().device(model.device());
    auto to_dev = [&](std::vector<int64_t>& v, at::IntArrayRef shape) {
      return at::from_blob(v.data(), shape, at::kLong).to(model.device(), false, /*copy=*/true);
    };
    canvas_ = to_dev(canvas, {B_, L_});
    state_ = to_dev(st_, {B_, br::kFields});
    eos_prob_ = at::zeros({B_}, dev.dtype(at::kDouble));
    map_ids_ = at::full({B_, G_, K_}, -1, dev.dtype(at::kLong));
    map_probs_ = at::zeros({B_, G_, K_}, dev.dtype(at::kDouble));
    flags_ = at::zeros({br::kFlags}, dev.dtype(at::kLong));
    // Until the first coordination overwrites it: the init's copies.
    std::vector<int64_t> init = init_sources(B_);
    sync_src_ = to_dev(init, {B_});
  }

  void check(const Stop& stop, int64_t forwards) const override { stop.check(forwards, canvas_); }

  std::vector<Span> work() override {
    std::vector<Span> w;
    for (int64_t b = 0; b < B_; ++b) {
      if (!st(b)[br::kDone] && st(b)[br::kMasks] > 0) w.push_back({b, 0, 0, st(b)[br::kStart], st(b)[br::kEnd]});
    }
    return w;
  }

  // CPU: the canvas itself; CUDA: one copy of [B, L] ids per refresh (the state readback came before).
  std::vector<int64_t> first_equal(const std::vector<int64_t>& rows) const override {
    const at::Tensor c = canvas_.cpu();
    return first_equal_rows(c.const_data_ptr<int64_t>(), L_, rows);
  }

  // Spans (rows of branch, logits row, first position, rows, full): a full forward reads and
  // records every generated position of each of its rows.
  void reads(StepPlan& p, const std::vector<Span>& spans) override {
    const bool full = p.kind != StepKind::kBlock;
    if (full) {
      for (int64_t r = 0; r < p.q.rows(); ++r) {
        for (int64_t q = lp_; q < L_; ++q) p.q.logit_index.push_back(r * L_ + q);
      }
    }
    for (const Span& s : spans) {
      if (full) p.extra.insert(p.extra.end(), {s.b, s.row * G_, lp_, G_, 1});
      else p.extra.insert(p.extra.end(), {s.b, s.first, s.start, s.end - s.start, 0});
    }
    if (p.kind == StepKind::kRefresh) add_fold_sources(p, spans, B_);
    p.sampling = sampling_;
  }

  at::Tensor tokens_from(const StepPlan&, const at::Tensor&) const override { return canvas_; }

  std::vector<at::Tensor> after_forward(const StepPlan& p, const at::Tensor& buffer,
                                        const at::Tensor& logits) override {
    if (!p.forward) {  // a block step without a forward: only the coordination
      coordinate_on_device();
      return status();
    }
    const at::Tensor lg = logits.contiguous();
    const int64_t S = spans_in(p);
    if (p.kind == StepKind::kInit) rows_.copy_on_device(sync_src_);  // the batch-1 forward filled row 0
    if (p.kind == StepKind::kRefresh) rows_.copy_on_device(buffer.narrow(0, p.base + S * br::kSpanFields, B_));
    if (sampling_) return {lg.to(at::kDouble)};
    auto [token, conf] = ops::confidence(lg, c_.mask_token_id);
    auto [ids, probs] = ops::sparse_probs(lg, *o_.prob_floor, K_);
    absorb_spans(lg, buffer.narrow(0, p.base, S * br::kSpanFields).view({S, br::kSpanFields}), token, conf, ids, probs);
    if (p.kind != StepKind::kRefresh) coordinate_on_device();
    return status();
  }

  void absorb(const StepPlan& p, const at::Tensor& logits, const std::vector<at::Tensor>& host) override {
    if (!p.forward || !sampling_) {
      take_status(host);
      return follow(p);
    }
    // Sampling: the host draws each span's proposals in span order; the spans are absorbed one by one.
    const std::vector<int64_t>& spans = p.extra;
    const int64_t S = spans_in(p);
    const at::Tensor lg = logits.contiguous();
    const at::Tensor& logits64 = host[0];
    const int64_t n = logits64.size(0);
    auto [ids, probs] = ops::sparse_probs(lg, *o_.prob_floor, K_);
    for (int64_t i = 0; i < S; ++i) {
      const int64_t* sp = &spans[i * br::kSpanFields];
      const int64_t b = sp[br::kSpanRow], s = st(b)[br::kStart], w = st(b)[br::kEnd] - s;
      const int64_t wrow = sp[br::kSpanLogitRow] + s - sp[br::kSpanFirstPos];
      const Proposals prop =
          sample_proposals(logits64.narrow(0, wrow, w), c_.mask_token_id, o_.temperature, generator_);
      // One buffer per span: its span row, then token and conf (float64 bits) per logits row.
      std::vector<int64_t> h(sp, sp + br::kSpanFields);
      h.resize(br::kSpanFields + 2 * n, 0);
      std::copy(prop.token.begin(), prop.token.end(), h.begin() + br::kSpanFields + wrow);
      std::memcpy(h.data() + br::kSpanFields + n + wrow, prop.conf.data(), sizeof(double) * prop.conf.size());
      const at::Tensor dev = at::from_blob(h.data(), {static_cast<int64_t>(h.size())}, at::kLong)
                                 .to(model_.device(), false, /*copy=*/true);
      absorb_spans(lg, dev.narrow(0, 0, br::kSpanFields).view({1, br::kSpanFields}), dev.narrow(0, br::kSpanFields, n),
                   dev.narrow(0, br::kSpanFields + n, n).view(at::kDouble), ids, probs);
    }
    if (p.kind != StepKind::kRefresh) coordinate_on_device();
    take_status(read_back(status()));
    follow(p);
  }

  void coordinate() override {}  // on the device, in the step (coordinate_on_device)
  bool refresh_wanted() override { return flags_h_[br::kRefreshWanted] != 0; }

  // The early exit: the first EOS-ready branch (smallest block size) within kEosTie of the highest
  // EOS probability (the same rule as the reference's EOS_TIE; docs/ALGORITHMS.md 4.6).
  int64_t exit(bool& eos) override {
    double best = -1.0;
    for (int64_t b = 0; b < B_; ++b) {
      if (st(b)[br::kEosReady]) best = std::max(best, eos_[b]);
    }
    for (int64_t b = 0; b < B_; ++b) {
      if (st(b)[br::kEosReady] && eos_[b] >= best - kEosTie) return eos = true, b;
    }
    return -1;
  }

  int64_t natural_winner() const override {  // most progress, the smallest block size on ties
    int64_t w = 0;
    for (int64_t b = 1; b < B_; ++b) {
      if (progress(b) > progress(w)) w = b;
    }
    return w;
  }

  std::vector<int64_t> tokens(int64_t winner, bool) override {
    const at::Tensor t = canvas_.select(0, winner).cpu();
    return std::vector<int64_t>(t.const_data_ptr<int64_t>(), t.const_data_ptr<int64_t>() + L_);
  }

 private:
  int64_t progress(int64_t b) const { return (st(b)[br::kDone] ? L_ : st(b)[br::kStart]) - lp_; }
  // The spans in a plan's entries (a refresh's fold sources follow them).
  int64_t spans_in(const StepPlan& p) const {
    return (static_cast<int64_t>(p.extra.size()) - (p.kind == StepKind::kRefresh ? B_ : 0)) / br::kSpanFields;
  }

  // The tensors a step reads back (in one copy) and the host mirror they refresh; paged rows: the
  // last coordination's sync sources too (the host's page tables follow its copies).
  std::vector<at::Tensor> status() const {
    if (rows_.paged()) return {state_, eos_prob_, flags_, sync_src_};
    return {state_, eos_prob_, flags_};
  }
  void take_status(const std::vector<at::Tensor>& host) {
    std::copy_n(host[0].const_data_ptr<int64_t>(), st_.size(), st_.begin());
    std::copy_n(host[1].const_data_ptr<double>(), B_, eos_.begin());
    std::copy_n(host[2].const_data_ptr<int64_t>(), br::kFlags, flags_h_);
    if (rows_.paged()) std::copy_n(host[3].const_data_ptr<int64_t>(), B_, sync_h_.begin());
  }
  // The row copies the step made on the device, in their order (the init's, a refresh's folded
  // twins', the coordination's sync), told to the host's page tables.
  void follow(const StepPlan& p) {
    if (!rows_.paged()) return;
    if (p.kind == StepKind::kInit) rows_.copied(init_sources(B_));
    if (p.kind == StepKind::kRefresh) return rows_.copied(fold_sources(p, B_));
    rows_.copied(sync_h_);
  }

  // Divergence trigger on the device (no readback): per layer and K/V, unit-normalise each active
  // row's flattened tensor; refresh when some row's mean squared distance to the active rows' mean
  // exceeds 2 (1 - |mean|^2). Identical rows (right after a sync) give dist = 0 and rho2 = +-1e-16
  // of rounding: never refresh on rounding noise (same rule as the reference). One layer at a
  // time: the float64 copy is 4x a layer of the KV rows, not 4x all of them (LLaDA-8B, L 2048,
  // 6 rows: 0.8 GB instead of 26 GB, which a captured graph would keep in its pool).
  at::Tensor diverged() const {
    const at::Tensor active = state_.select(1, br::kDone).eq(0);
    const at::Tensor w = active.to(at::kDouble);
    const at::Tensor n = w.sum();
    // A pooled KV row (batched decoding) is longer than the canvas: only the canvas' L positions count.
    std::vector<at::Tensor> sq, spread;  // per layer: [B, 2] squared distances, [2] 1 - |mean|^2
    for (int64_t l = 0; l < c_.n_layers; ++l) {
      // [branch, K/V, elements] of this layer (paged rows: gathered from their pages)
      at::Tensor x = rows_.kv().layer_rows(l, L_).reshape({B_, 2, -1}).to(at::kDouble);
      x = x / x.norm(2, {-1}, true).clamp_min(1e-30);
      const at::Tensor mu = (x * w.view({B_, 1, 1})).sum(0) / n;
      sq.push_back((x - mu).pow(2).sum(-1));
      spread.push_back(1 - mu.pow(2).sum(-1));
    }
    const at::Tensor dist = at::cat(sq, 1).mean(-1);
    const at::Tensor rho2 = at::cat(spread).mean();
    const at::Tensor over = ((dist > rho2.clamp_min(0) * 2) & active).any();
    const at::Tensor moved = dist.masked_fill(active.logical_not(), 0).max() > 1e-9;
    return (over & moved & (n >= 2)).to(at::kLong).reshape({1});
  }

  // Steps 3-5 (advance, merge, sync and its KV copies) and the refresh decision, on the device.
  void coordinate_on_device() {
    const bool periodic = o_.refresh_mode == RefreshMode::kPeriodic;
    ops::bb_coordinate_(canvas_, state_, eos_prob_, flags_, sync_src_, map_ids_, map_probs_, lp_, c_.mask_token_id,
                        o_.merge_gate, o_.merge, o_.sync, o_.sync_gap, o_.refresh_tokens, periodic);
    rows_.copy_on_device(sync_src_);
    if (!periodic && o_.refresh_tokens > 0) flags_.narrow(0, br::kRefreshWanted, 1).copy_(diverged());
    if (o_.sync_refresh) {  // a branch that received the leader's row (and is not done) refreshes: on the device
      const at::Tensor synced = (sync_src_.ge(0) & state_.select(1, br::kDone).eq(0)).any().to(at::kLong).reshape({1});
      at::Tensor wanted = flags_.narrow(0, br::kRefreshWanted, 1);
      wanted.copy_(wanted.bitwise_or(synced));
    }
  }

  void absorb_spans(const at::Tensor& logits, const at::Tensor& spans, const at::Tensor& token, const at::Tensor& conf,
                    const at::Tensor& ids, const at::Tensor& probs) {
    ops::bb_absorb_(canvas_, state_, eos_prob_, map_ids_, map_probs_, spans, token, conf, ids, probs, logits, lp_,
                    c_.mask_token_id, c_.eos_token_id, *o_.threshold, *o_.stop_on_eos);
  }

  const Network& model_;
  const DecodeOptions o_;
  const ModelConfig& c_;
  const int64_t lp_, G_, L_, B_, K_;
  const bool sampling_;
  at::Generator generator_;
  // Host mirror of the last readback (and st_).
  std::vector<double> eos_;
  int64_t flags_h_[br::kFlags] = {0, 0};
  std::vector<int64_t> sync_h_;  // paged rows: the last coordination's sync sources
  // Device state (rows = branches by ascending block size; see kernels/branches.h).
  BranchRows& rows_;
  at::Tensor canvas_, state_, eos_prob_, map_ids_, map_probs_, flags_, sync_src_;
};

constexpr double kMaskPenalty = -1e4;  // written into the mask id's logit before ranking
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Readout::kHostTopk (docs/ALGORITHMS.md 5.4). The bookkeeping runs on the host over a host canvas
// (B rows of length L, uploaded with each forward's index buffer); the device runs the forward and
// the readout (top-1 token and its probability after the mask penalty, and the few probabilities
// above the floor per row), of which one copy comes back per step. Without stop_on_eos EOS is an
// ordinary token; with it a row's generation ends, for every purpose, at its first EOS.
// Its windows, done flags, decoded counts and refresh clock are branches.h's (snap_window and advance
// with eos_cut, recount and frontier_clock; kFrontier is the first mask before the EOS cut).
class HostBranches final : public Branches {
 public:
  HostBranches(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o,
               const FamilyRules& rules, const std::vector<int64_t>& sizes, BranchRows& rows)
      : Branches(static_cast<int64_t>(sizes.size())), o_(o), rules_(rules), mask_(model.config().mask_token_id),
        limit_(model.config().proposal_limit()), eos_(*o.stop_on_eos ? model.config().eos_token_id : -1),
        lp_(static_cast<int64_t>(prompt.size())), G_(o.gen_length), L_(lp_ + G_),
        B_(static_cast<int64_t>(sizes.size())), threshold_(static_cast<float>(*o.threshold)),
        K_(static_cast<int64_t>(std::floor(1.0 / *o.prob_floor)) + 1), rows_(rows),
        p_{o.merge_gate,
           o.merge,
           o.sync,
           o.sync_gap,
           o.refresh_tokens,
           true,
           rules.gate_inclusive,
           /*eos_cut=*/true,
           /*recount=*/true,
           rules.refresh_clock == RefreshClock::kFrontierTokens,
           /*merge_own_window=*/true,
           /*sync_copies_map=*/true} {
    x_.resize(B_ * L_, mask_);
    grow(K_);
    for (int64_t r = 0; r < B_; ++r) {
      std::copy(prompt.begin(), prompt.end(), x_.begin() + r * L_);
      st(r)[br::kBlock] = sizes[r];
      st(r)[br::kStart] = lp_;
      st(r)[br::kEnd] = lp_ + sizes[r];
    }
  }

  void check(const Stop& stop, int64_t forwards) const override { stop.check(forwards, x_); }

  std::vector<Span> work() override {
    std::vector<Span> w;
    for (int64_t b = 0; b < B_; ++b) {
      if (done(b)) continue;
      to_active_window(b);
      const int64_t s = st(b)[br::kStart], e = st(b)[br::kEnd];
      if (!done(b) && has_mask(b, s, e)) w.push_back({b, 0, 0, s, e});
    }
    return w;
  }

  std::vector<int64_t> first_equal(const std::vector<int64_t>& rows) const override {
    return first_equal_rows(x_.data(), L_, rows);
  }

  // A full forward reads the output before each seed (the window's first mask), or one placeholder
  // row when there is no seed (the forward still runs and counts); a block step every output.
  void reads(StepPlan& p, const std::vector<Span>& spans) override {
    spans_ = spans;
    if (p.kind != StepKind::kBlock) {
      seeds_ = seed_positions(spans);
      for (size_t i = 0; i < spans.size(); ++i) {
        if (seeds_[i] >= 0) p.q.logit_index.push_back(spans[i].row * L_ + seeds_[i] - rules_.logit_shift);
      }
      if (p.q.logit_index.empty()) p.q.logit_index.push_back(0);
    }
    p.extra = x_;
    if (p.kind == StepKind::kRefresh) add_fold_sources(p, spans, B_);
  }

  at::Tensor tokens_from(const StepPlan& p, const at::Tensor& buffer) const override {
    return buffer.narrow(0, p.base, B_ * L_);
  }

  std::vector<at::Tensor> after_forward(const StepPlan& p, const at::Tensor& buffer, const at::Tensor&) override {
    if (p.kind == StepKind::kRefresh) rows_.copy_on_device(buffer.narrow(0, p.base + B_ * L_, B_));
    return {};
  }

  void absorb(const StepPlan& p, const at::Tensor& out, const std::vector<at::Tensor>&) override {
    if (p.kind == StepKind::kBlock) return absorb_block(out);
    if (p.kind == StepKind::kInit) rows_.copy(init_sources(B_));
    if (p.kind == StepKind::kRefresh) rows_.copied(fold_sources(p, B_));  // after_forward's copies
    seed(out);
  }

  void coordinate() override {
    snap_all();
    if (st(br::leader(view()))[br::kDecoded] == 0) return;
    if (o_.merge) br::merge_step(br::SerialExec{}, view(), p_);
    snap_all();
    if (!o_.sync) return;
    std::vector<int64_t> src(B_, -1);  // the rows each synced branch copied: its KV row follows
    br::sync_step(br::SerialExec{}, view(), src.data(), p_);
    for (int64_t b = 0; b < B_; ++b) synced_ = synced_ || (src[b] >= 0 && !done(b));
    rows_.copy(src);
  }

  // Some branch not done advanced refresh_tokens tokens since its last seed, or (sync_refresh) the
  // last coordination synced a branch that is not done.
  bool refresh_wanted() override {
    bool want = false;
    for (int64_t b = 0; b < B_; ++b) {
      want = want || (!done(b) && o_.refresh_tokens > 0 && st(b)[br::kSinceRefresh] >= o_.refresh_tokens);
    }
    want = want || (o_.sync_refresh && synced_);
    synced_ = false;
    return want;
  }

  // EOS-ready (a first EOS with no mask before it; the snap marks it done): the most decoded, then
  // progress, then block; else a complete row (no mask at all, so G decoded): the larger block.
  int64_t exit(bool& eos) override {
    snap_all();
    int64_t w = -1;
    auto key = [&](int64_t b) { return std::make_tuple(st(b)[br::kDecoded], st(b)[br::kFrontier], st(b)[br::kBlock]); };
    for (int64_t b = 0; eos_ >= 0 && b < B_; ++b) {
      const auto fe = first_eos(b);
      if (fe && !has_mask(b, lp_, lp_ + *fe) && (w < 0 || key(b) > key(w))) w = b;
    }
    if (w >= 0) return eos = true, w;
    for (int64_t b = 0; b < B_; ++b) {
      if (!has_mask(b, lp_, L_) && (w < 0 || st(b)[br::kBlock] > st(w)[br::kBlock])) w = b;
    }
    return w;
  }

  int64_t natural_winner() const override {  // the most progress, then the larger block
    int64_t w = 0;
    for (int64_t r = 1; r < B_; ++r) {
      if (std::make_pair(st(r)[br::kFrontier], st(r)[br::kBlock]) >
          std::make_pair(st(w)[br::kFrontier], st(w)[br::kBlock]))
        w = r;
    }
    return w;
  }

  std::vector<int64_t> tokens(int64_t winner, bool eos) override {
    std::vector<int64_t> t(x_.begin() + winner * L_, x_.begin() + (winner + 1) * L_);
    if (eos) std::fill(t.begin() + lp_ + *first_eos(winner) + 1, t.end(), eos_);  // cut after the first EOS
    return t;
  }

 private:
  int64_t* row(int64_t r) { return &x_[r * L_]; }
  const int64_t* row(int64_t r) const { return &x_[r * L_]; }
  // The canvases, state table and maps in branches.h's layout (maps [B, G, map_k_]: ids, -1 free, and
  // probabilities), on the host.
  br::View view() {
    return {x_.data(), st_.data(), nullptr, map_ids_.data(), map_probs_.data(), B_, L_, lp_, map_k_, mask_, eos_};
  }
  void grow(int64_t k) {  // entries of k slots, keeping what they hold
    std::vector<int64_t> ids(B_ * G_ * k, -1);
    std::vector<double> probs(B_ * G_ * k, 0.0);
    for (int64_t e = 0; e < B_ * G_; ++e) {
      std::copy_n(map_ids_.data() + e * map_k_, map_k_, ids.data() + e * k);
      std::copy_n(map_probs_.data() + e * map_k_, map_k_, probs.data() + e * k);
    }
    map_ids_.swap(ids), map_probs_.swap(probs), map_k_ = k;
  }
  bool has_mask(int64_t r, int64_t lo, int64_t hi) const {
    for (int64_t p = lo; p < hi; ++p) {
      if (row(r)[p] == mask_) return true;
    }
    return false;
  }
  // First EOS of row r's generation (relative), when EOS is honoured.
  std::optional<int64_t> first_eos(int64_t r) const {
    if (eos_ < 0) return std::nullopt;
    for (int64_t j = 0; j < G_; ++j) {
      if (row(r)[lp_ + j] == eos_) return j;
    }
    return std::nullopt;
  }

  void snap(int64_t b) { br::snap_window(br::SerialExec{}, view(), b, p_); }
  void snap_all() {
    for (int64_t b = 0; b < B_; ++b) snap(b);
  }
  void advance(int64_t b) { br::advance(br::SerialExec{}, view(), b, p_); }
  void to_active_window(int64_t b) {
    while (!done(b) && !has_mask(b, st(b)[br::kStart], st(b)[br::kEnd])) {
      const int64_t prev = st(b)[br::kFrontier];
      advance(b);
      if (done(b) || st(b)[br::kFrontier] <= prev) break;
    }
  }
  int64_t window_hi(int64_t b) const {
    const auto fe = first_eos(b);
    return fe ? std::min(st(b)[br::kEnd], lp_ + *fe) : st(b)[br::kEnd];
  }

  // --- forwards ------------------------------------------------------------------------------

  // A full forward's seeds: after moving each branch to its active window, the window's first
  // mask; kNoSeed when the window has none, kWasDone for a branch done before the forward. The
  // forward changes no host state, so this runs before it.
  static constexpr int64_t kNoSeed = -1, kWasDone = -2;
  std::vector<int64_t> seed_positions(const std::vector<Span>& spans) {
    std::vector<int64_t> pos;
    for (const Span& s : spans) {
      const int64_t b = s.b;
      int64_t p = kWasDone;
      if (!done(b)) {
        p = kNoSeed;
        to_active_window(b);
        const int64_t hi = window_hi(b);
        for (int64_t q = st(b)[br::kStart]; q < hi && p < 0 && !done(b); ++q) {
          if (row(b)[q] == mask_) p = q;
        }
      }
      pos.push_back(p);
    }
    return pos;
  }
  // Writes the seeds; `logits` holds one row per seed, in order.
  void seed(const at::Tensor& logits) {
    std::vector<int64_t> token;
    if (std::any_of(seeds_.begin(), seeds_.end(), [](int64_t p) { return p >= 0; })) {
      at::Tensor lg = logits.to(at::kFloat).clone();
      lg.select(1, mask_).fill_(kMaskPenalty);
      const at::Tensor pred = host::to_host({std::get<1>(at::topk(proposable(lg), 1))})[0];
      token.assign(pred.const_data_ptr<int64_t>(), pred.const_data_ptr<int64_t>() + pred.numel());
    }
    size_t k = 0;
    for (size_t i = 0; i < spans_.size(); ++i) {
      const int64_t b = spans_[i].b;
      if (seeds_[i] == kWasDone) continue;
      if (seeds_[i] != kNoSeed) {
        row(b)[seeds_[i]] = token[k++];
        st(b)[br::kCommitted] += 1;
        std::fill_n(&map_ids_[view().entry(b, lp_)], G_ * map_k_, -1);  // the seed clears the map
        advance(b);
      }
      st(b)[br::kSinceRefresh] = 0;
    }
  }

  void absorb_block(const at::Tensor& out) {
    const at::Tensor logits = out.to(at::kFloat);
    // Readout of every row: top-1 after the mask penalty and its probability; the raw softmax's
    // K largest probabilities (every one above the floor is among them: K > 1 / floor), the ids of
    // those not above it -1 (compared in float32, as the reference does).
    at::Tensor lg = logits.clone();
    lg.select(1, mask_).fill_(kMaskPenalty);
    const at::Tensor pred = std::get<1>(at::topk(proposable(lg), 1));
    const at::Tensor conf = at::gather(at::softmax(lg, -1), -1, pred).squeeze(-1);
    auto [pv, pid] = at::topk(at::softmax(logits, -1), std::min(K_, logits.size(-1)));
    const std::vector<at::Tensor> h =
        host::to_host({pred.squeeze(-1), conf, pid.masked_fill(pv.gt(*o_.prob_floor).logical_not(), -1), pv});
    for (const Span& s : spans_) absorb(s.b, s.first, h);
  }

  void absorb(int64_t b, int64_t first, const std::vector<at::Tensor>& h) {
    const int64_t lo = st(b)[br::kStart], hi = std::min(window_hi(b), L_), n = hi - lo;
    if (n <= 0 || !has_mask(b, lo, hi)) {
      advance(b);
      return;
    }
    const int64_t* pred = h[0].const_data_ptr<int64_t>() + first;
    const double* conf = h[1].const_data_ptr<double>() + first;
    const int64_t K = h[2].size(1);
    const int64_t* pid = h[2].const_data_ptr<int64_t>() + first * K;
    const double* pv = h[3].const_data_ptr<double>() + first * K;
    int64_t* x = row(b);
    std::vector<bool> take(n, false);
    bool any = false;
    float best_no_eos = kNegInf, best_masked = kNegInf;
    int64_t at_no_eos = -1, at_masked = -1;
    for (int64_t j = 0; j < n; ++j) {
      const bool target = x[lo + j] == mask_;
      const float c = static_cast<float>(conf[j]);  // a float32 probability, exactly
      take[j] = target && c >= threshold_;
      any = any || take[j];
      if (!target) continue;
      if (c > best_masked) best_masked = c, at_masked = j;  // first maximum, as argmax
      if (pred[j] != eos_ && c > best_no_eos) best_no_eos = c, at_no_eos = j;
    }
    if (!any) take[at_no_eos >= 0 ? at_no_eos : at_masked] = true;
    for (int64_t j = 0; j < n; ++j) {
      if (!take[j]) continue;
      x[lo + j] = pred[j];
      st(b)[br::kCommitted] += 1;
    }
    // MapRule::kAccumulateSinceSeed: every probability above the floor, over older entries of its token.
    while (br::record_map(br::SerialExec{}, view(), b, lo, n, pid, pv, K, br::MapMode::kAccumulate)) {
      grow(2 * map_k_);
    }
    advance(b);
  }

  // Logits for ranking proposals: ids the tokenizer cannot produce never win (the probabilities
  // still come from the whole row).
  at::Tensor proposable(const at::Tensor& lg) const {
    const int64_t V = lg.size(-1);
    if (limit_ >= V) return lg;
    at::Tensor r = lg.clone();
    r.narrow(-1, limit_, V - limit_).fill_(-std::numeric_limits<double>::infinity());
    return r;
  }

  const DecodeOptions o_;
  const FamilyRules& rules_;
  const int64_t mask_, limit_, eos_, lp_, G_, L_, B_;
  const float threshold_;  // compared with float32 probabilities
  const int64_t K_;
  BranchRows& rows_;
  const br::CoordinateParams p_;  // the merge gate and the window and clock rules of FamilyRules
  std::vector<int64_t> x_;        // the canvases: B rows of L, concatenated
  int64_t map_k_ = 0;             // slots per map entry (grown when an entry accumulates more)
  std::vector<int64_t> map_ids_;
  std::vector<double> map_probs_;
  bool synced_ = false;         // sync_refresh: the last coordination synced a branch that is not done
  std::vector<Span> spans_;     // the step in flight
  std::vector<int64_t> seeds_;  // its seed positions (full forwards)
};

// The skeleton: the order of forwards, exit checks, coordinations and refreshes, the stop checks,
// the no-progress guard and the counters, the same for every family.
class BlockBatch final : public Decoder {
 public:
  BlockBatch(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o, const Stop& stop,
             KvRows kv)
      : rules_(rules_for(model.config().family)), stop_(stop), lp_(static_cast<int64_t>(prompt.size())),
        G_(o.gen_length), L_(lp_ + G_), B_(static_cast<int64_t>(o.block_sizes->size())), sizes_(*o.block_sizes),
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
                "blockbatch: no branch executor implements the rules of family '", rules_.name, "'");
    if (host) {
      book_ = std::make_unique<HostBranches>(model, prompt, o, rules_, sizes_, *rows_);
    } else {
      book_ = std::make_unique<DeviceBranches>(model, prompt, o, sizes_, *rows_);
    }
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
        p.q.add_positions(s.start - rules_.logit_shift, s.end - rules_.logit_shift, s.b, s.b * L_);
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
      stats_.steps.push_back({committed, p.q.size()});
      // Every branch in an init or block step commits at least one token in its window.
      if (committed == 0 && p.kind != StepKind::kRefresh) no_progress(p.kind == StepKind::kInit);
    }
    settle(p.kind);
  }

  DecodeResult finish() override {
    if (winner_ < 0) winner_ = book_->natural_winner();
    DecodeResult res;
    res.tokens = book_->tokens(winner_, early_exit_);
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

  const FamilyRules& rules_;
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

}  // namespace

std::unique_ptr<Decoder> blockbatch_decoder(const Network& model, const std::vector<int64_t>& prompt,
                                            const DecodeOptions& o, const Stop& stop, KvRows kv) {
  return std::make_unique<BlockBatch>(model, prompt, o, stop, std::move(kv));
}

}  // namespace blockbatch
