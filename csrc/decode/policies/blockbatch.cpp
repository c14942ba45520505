// BlockBatch multi-branch consensus decoding (ALGORITHMS.md section 4), as a step machine
// (decode/decoder.h): init, then block steps with a refresh where the coordination asks. The python twin is
// python/blockbatch/reference/blockbatch.py; both are written from the spec and must agree on
// tokens, winner and every counter.
//
// Everything a branch owns lives on the model's device: canvases [B, L], KV rows, the sparse
// probability maps and the state table (windows, counters, flags). A step is one device program
// (StepRunner: one host->device copy of its index buffer; on CUDA a graph replayed per
// active-branch set): forward, confidence, sparse probabilities, bb_absorb_ (map update, threshold
// commit, EOS readiness) and, after init and block steps, bb_coordinate_ (advance, merge, sync),
// kv_copy_rows_ and the divergence test; then ONE device->host copy of the state table (12
// numbers per branch), from which the host decides the next step's shape. The bookkeeping is
// csrc/kernels/branches.h: the same source runs as CPU loops and as one CUDA thread block.
// Sampling (temperature > 0) draws its Gumbel noise from the seeded host generator (the
// reference's draws), so those steps read the float64 logits back and absorb eagerly.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "decode/decoder.h"
#include "kernels/branches.h"
#include "ops/ops.h"

namespace blockbatch {

namespace {

namespace br = branches;

// EOS-ready branches whose EOS probabilities differ by less than float32's machine epsilon tie at
// the early exit; the smallest block size among them wins. The authors rank them by a low-precision
// softmax (bfloat16; float32 in the parity runs) in which near-certain probabilities collapse onto
// equal values and max() keeps the first branch.
constexpr double kEosTie = 1.0 / (1 << 23);

class BlockBatchDecoder final : public Decoder {
 public:
  BlockBatchDecoder(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o,
                    const Stop& stop, at::Tensor kv)
      : model_(model), o_(o), stop_(stop), c_(model.config()), lp_(static_cast<int64_t>(prompt.size())), G_(o.gen_length),
        L_(lp_ + G_), B_(static_cast<int64_t>(o.block_sizes->size())),
        K_(static_cast<int64_t>(std::floor(1.0 / *o.prob_floor)) + 1), sampling_(o.temperature > 0),
        generator_(at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(o.seed))),
        st_(static_cast<size_t>(B_ * br::kFields), 0), eos_(B_, 0.0),
        forwards_(B_, 0) {
    std::vector<int64_t> sizes = *o.block_sizes;
    std::sort(sizes.begin(), sizes.end());
    std::vector<int64_t> canvas(static_cast<size_t>(B_ * L_), c_.mask_token_id);
    for (int64_t b = 0; b < B_; ++b) {
      std::copy(prompt.begin(), prompt.end(), canvas.begin() + b * L_);
      int64_t* st = &st_[b * br::kFields];
      st[br::kBlock] = sizes[b];
      st[br::kStart] = lp_;
      st[br::kEnd] = lp_ + sizes[b];
      st[br::kMasks] = sizes[b];
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
    // Until the first coordination overwrites it: every row copies row 0 (the init forward's KV).
    sync_src_ = at::zeros({B_}, dev.dtype(at::kLong));
    sync_src_.narrow(0, 0, 1).fill_(-1);
    kv_ = kv.defined() ? std::move(kv) : model.new_kv(B_, L_);
  }

  // Steps: init, then (a refresh when the last coordination asked for one and a branch is active)
  // block steps until every branch is done or one exits early on EOS.
  bool done() const override { return winner_ >= 0 || all_done(); }

  StepPlan plan() override {
    if (phase_ == Phase::kInit) return init_step();
    if (phase_ == Phase::kAfterStep && flags_h_[br::kRefreshWanted] && !all_done()) return refresh_step();
    // Bound: each branch's `decoded` never exceeds G (commits and merges fill masks; a sync
    // copies a row whose leader decoded no more than G minus its masks), every block step with a
    // forward adds at least one to some branch's count (or fails: Stop::no_progress), and a step
    // with no forward leaves every active branch with masks. So at most 2 B G + 2 block steps.
    const int64_t max_iterations = 2 * B_ * G_ + 2;
    TORCH_CHECK(block_steps_ < max_iterations, "blockbatch: internal error: the decode did not finish within ",
                max_iterations, " block steps (2 * branches * gen_length + 2); please report it with the options");
    return block_step();
  }

  at::Tensor tokens_from(const StepPlan&, const at::Tensor&) const override { return canvas_; }

  std::vector<at::Tensor> after_forward(const StepPlan& p, const at::Tensor& buffer, const at::Tensor& logits) override {
    if (!p.forward) {  // a block step without a forward: only the coordination
      coordinate();
      return status();
    }
    const at::Tensor lg = logits.contiguous();
    if (p.kind == StepKind::kInit) ops::kv_copy_rows_(kv_, sync_src_);  // the batch-1 forward filled row 0
    if (sampling_) return {lg.to(at::kDouble)};
    auto [token, conf] = ops::confidence(lg, c_.mask_token_id);
    auto [ids, probs] = ops::sparse_probs(lg, *o_.prob_floor, K_);
    const int64_t S = static_cast<int64_t>(p.extra.size()) / br::kSpanFields;
    absorb_spans(lg, buffer.narrow(0, p.base, S * br::kSpanFields).view({S, br::kSpanFields}), token, conf, ids, probs);
    if (p.kind != StepKind::kRefresh) coordinate();
    return status();
  }

  void absorb(const StepPlan& p, const at::Tensor& logits, const std::vector<at::Tensor>& host) override {
    if (!p.forward) {
      take_status(host);
      after_block_step();
      return;
    }
    const std::vector<int64_t>& spans = p.extra;
    const int64_t S = static_cast<int64_t>(spans.size()) / br::kSpanFields;
    if (sampling_) {  // the host draws each span's proposals in span order; the spans are absorbed one by one
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
      if (p.kind != StepKind::kRefresh) coordinate();
      take_status(read_back(status()));
    } else {
      take_status(host);
    }
    const int64_t committed = committed_total() - before_;
    stats_.steps.push_back({committed, p.q.size()});
    if (committed == 0 && p.kind != StepKind::kRefresh) {  // every branch in it commits >= 1 in its window
      const bool init = p.kind == StepKind::kInit;
      std::string what = init ? "init forward" : "block step over branch windows";
      for (int64_t i = 0; i < S; ++i) {
        const int64_t* sp = &spans[i * br::kSpanFields];
        what += " [" + std::to_string(sp[br::kSpanFirstPos]) + ", " +
                std::to_string(sp[br::kSpanFirstPos] + (init ? st(sp[br::kSpanRow])[br::kBlock] : sp[br::kSpanRows])) +
                ")";
        if (init) break;
      }
      stop_.no_progress(static_cast<int64_t>(stats_.steps.size()) - 1, what);
    }
    if (p.kind == StepKind::kBlock) {
      after_block_step();
    } else {
      phase_ = p.kind == StepKind::kInit ? Phase::kAfterStep : Phase::kAfterRefresh;
    }
  }

  DecodeResult finish() override {
    if (winner_ < 0) {  // natural exit: most progress, the smallest block size on ties
      for (int64_t b = 0; b < B_; ++b) {
        if (winner_ < 0 || progress(b) > progress(winner_)) winner_ = b;
      }
    }
    DecodeResult res;
    const at::Tensor tokens = canvas_.select(0, winner_).cpu();
    res.tokens.assign(tokens.const_data_ptr<int64_t>(), tokens.const_data_ptr<int64_t>() + L_);
    stats_.nfe = stats_.nfe_init + stats_.nfe_block + stats_.nfe_refresh;
    stats_.nfe_paper = forwards_[winner_];
    stats_.winner = winner_;
    stats_.winner_block_size = st(winner_)[br::kBlock];
    for (int64_t b = 0; b < B_; ++b) {
      BranchStats s;
      s.block_size = st(b)[br::kBlock];
      s.committed = st(b)[br::kCommitted];
      s.merged = st(b)[br::kMerged];
      s.copied = st(b)[br::kCopied];
      s.forwards = forwards_[b];
      stats_.branches.push_back(s);
    }
    res.stats = std::move(stats_);
    return res;
  }

 private:
  // Host copy of branch b's state row (as of the last readback).
  const int64_t* st(int64_t b) const { return &st_[b * br::kFields]; }
  int64_t progress(int64_t b) const { return (st(b)[br::kDone] ? L_ : st(b)[br::kStart]) - lp_; }
  bool all_done() const {
    for (int64_t b = 0; b < B_; ++b) {
      if (!st(b)[br::kDone]) return false;
    }
    return true;
  }
  int64_t committed_total() const {
    int64_t n = 0;
    for (int64_t b = 0; b < B_; ++b) n += st(b)[br::kCommitted];
    return n;
  }

  // The tensors a step reads back (in one copy) and the host mirror they refresh.
  std::vector<at::Tensor> status() const { return {state_, eos_prob_, flags_}; }
  void take_status(const std::vector<at::Tensor>& host) {
    std::copy_n(host[0].const_data_ptr<int64_t>(), st_.size(), st_.begin());
    std::copy_n(host[1].const_data_ptr<double>(), B_, eos_.begin());
    std::copy_n(host[2].const_data_ptr<int64_t>(), br::kFlags, flags_h_);
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
    const at::Tensor own = kv_.size(4) == L_ ? kv_ : kv_.narrow(4, 0, L_).contiguous();
    const at::Tensor rows = own.reshape({B_, c_.n_layers * 2, -1});  // [branch, (layer, K/V), elements]
    std::vector<at::Tensor> sq, spread;  // per layer: [B, 2] squared distances, [2] 1 - |mean|^2
    for (int64_t l = 0; l < c_.n_layers; ++l) {
      at::Tensor x = rows.narrow(1, 2 * l, 2).to(at::kDouble);
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
  void coordinate() {
    const bool periodic = o_.refresh_mode == RefreshMode::kPeriodic;
    ops::bb_coordinate_(canvas_, state_, eos_prob_, flags_, sync_src_, map_ids_, map_probs_, lp_, c_.mask_token_id,
                        o_.merge_gate, o_.merge, o_.sync, o_.sync_gap, o_.refresh_tokens, periodic);
    ops::kv_copy_rows_(kv_, sync_src_);
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

  // A forward step's plan over `q` (spans: rows of branch, logits row, first position, rows, full).
  StepPlan forward_plan(PackedQueries q, StepKind kind, std::vector<int64_t> spans) {
    stop_.check(stats_.nfe_init + stats_.nfe_block + stats_.nfe_refresh - 1, canvas_);  // this forward is counted
    before_ = committed_total();
    StepPlan p;
    p.kind = kind;
    p.q = std::move(q);
    p.mode = kind == StepKind::kBlock ? KvMode::kDual : KvMode::kFull;
    p.extra = std::move(spans);
    p.sampling = sampling_;
    return p;
  }

  // Init (1 NFE): batch-1 full forward over [prompt | masks]; every branch records every
  // position and commits in its first window; then advance / merge / sync / refresh decision.
  StepPlan init_step() {
    PackedQueries q;
    q.add_positions(0, L_, 0, 0);
    for (int64_t p = lp_; p < L_; ++p) q.logit_index.push_back(p);
    std::vector<int64_t> spans;
    for (int64_t b = 0; b < B_; ++b) spans.insert(spans.end(), {b, 0, lp_, G_, 1});
    stats_.nfe_init += 1;
    for (int64_t b = 0; b < B_; ++b) forwards_[b] += 1;
    return forward_plan(std::move(q), StepKind::kInit, std::move(spans));
  }

  // Batched block denoise (1 NFE): every active branch whose window has masks, dual-cache
  // semantics; then coordinate. With no such branch there is no forward, only the coordination.
  StepPlan block_step() {
    ++block_steps_;
    PackedQueries q;
    std::vector<int64_t> spans;
    for (int64_t b = 0; b < B_; ++b) {
      if (st(b)[br::kDone] || st(b)[br::kMasks] == 0) continue;
      spans.insert(spans.end(), {b, q.size(), st(b)[br::kStart], st(b)[br::kEnd] - st(b)[br::kStart], 0});
      q.add_positions(st(b)[br::kStart], st(b)[br::kEnd], b, b * L_);
      forwards_[b] += 1;
    }
    if (q.rows() > 0) {
      stats_.nfe_block += 1;
      return forward_plan(std::move(q), StepKind::kBlock, std::move(spans));
    }
    StepPlan p;
    p.kind = StepKind::kCoordinate;
    p.forward = false;
    return p;
  }

  // After a block step: the early exit, the first EOS-ready branch (smallest block size) within
  // kEosTie of the highest EOS probability (the same rule as the reference's EOS_TIE;
  // docs/ALGORITHMS.md 4.6); else a refresh may follow.
  void after_block_step() {
    double best = -1.0;
    for (int64_t b = 0; b < B_; ++b) {
      if (st(b)[br::kEosReady]) best = std::max(best, eos_[b]);
    }
    for (int64_t b = 0; b < B_ && winner_ < 0; ++b) {
      if (st(b)[br::kEosReady] && eos_[b] >= best - kEosTie) winner_ = b;
    }
    if (winner_ >= 0) stats_.early_exit = true;
    phase_ = Phase::kAfterStep;
  }

  // Refresh (1 NFE) when the last coordination asked for it: one full forward over every active
  // row; each row's KV written back to its own row, maps updated, commits in each window.
  StepPlan refresh_step() {
    PackedQueries q;
    std::vector<int64_t> spans;
    for (int64_t b = 0; b < B_; ++b) {
      if (st(b)[br::kDone]) continue;
      spans.insert(spans.end(), {b, q.rows() * G_, lp_, G_, 1});
      for (int64_t p = lp_; p < L_; ++p) q.logit_index.push_back(q.rows() * L_ + p);
      q.add_positions(0, L_, b, b * L_);
      forwards_[b] += 1;
    }
    stats_.nfe_refresh += 1;
    return forward_plan(std::move(q), StepKind::kRefresh, std::move(spans));
  }

  // kInit: the init forward comes next; kAfterStep: after init or a block step (a refresh may
  // come next); kAfterRefresh: a block step comes next.
  enum class Phase { kInit, kAfterStep, kAfterRefresh };
  Phase phase_ = Phase::kInit;
  int64_t winner_ = -1, block_steps_ = 0, before_ = 0;

  const Network& model_;
  const DecodeOptions o_;
  const Stop& stop_;
  const ModelConfig& c_;
  const int64_t lp_, G_, L_, B_, K_;
  const bool sampling_;
  at::Generator generator_;
  // Device state (rows = branches by ascending block size; see kernels/branches.h); kv_ (Decoder).
  at::Tensor canvas_, state_, eos_prob_, map_ids_, map_probs_, flags_, sync_src_;
  // Host mirror of the last readback, and the forwards each branch took part in (init, block and
  // refresh: the paper's per-branch NFE).
  std::vector<int64_t> st_;
  std::vector<double> eos_;
  int64_t flags_h_[br::kFlags] = {0, 0};
  std::vector<int64_t> forwards_;
  DecodeStats stats_;
};

}  // namespace

std::unique_ptr<Decoder> blockbatch_decoder(const Network& model, const std::vector<int64_t>& prompt,
                                            const DecodeOptions& o, const Stop& stop, at::Tensor kv) {
  return std::make_unique<BlockBatchDecoder>(model, prompt, o, stop, std::move(kv));
}

}  // namespace blockbatch
