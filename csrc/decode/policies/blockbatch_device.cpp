// BlockBatch's device executor (Readout::kDevice; decode/policies/blockbatch.h): LLaDA's map, gate,
// EOS exit and block refresh clock, the bookkeeping and the coordination on the device.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <ATen/ops/gather.h>
#include <ATen/ops/log.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/where.h>
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

#include "decode/policies/blockbatch.h"
#include "ops/ops.h"

namespace blockbatch::bbatch {

namespace {

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
    if (o.logprobs) {  // the `logprobs` option: per-branch records (ALGORITHMS.md 17)
      top_ = *o.logprobs;
      rec_ = at::full({B_, L_, 1 + 2 * top_}, std::numeric_limits<double>::quiet_NaN(), dev.dtype(at::kDouble));
      seen_ = at::zeros({B_, G_, 2 * top_}, dev.dtype(at::kDouble));
    }
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
    const at::Tensor spans = buffer.narrow(0, p.base, S * br::kSpanFields).view({S, br::kSpanFields});
    const at::Tensor before = recording() ? canvas_.clone() : at::Tensor();
    absorb_spans(lg, spans, token, conf, ids, probs);
    record_commits(lg, spans, before);
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
      const at::Tensor span = dev.narrow(0, 0, br::kSpanFields).view({1, br::kSpanFields});
      const at::Tensor before = recording() ? canvas_.clone() : at::Tensor();
      absorb_spans(lg, span, dev.narrow(0, br::kSpanFields, n), dev.narrow(0, br::kSpanFields + n, n).view(at::kDouble),
                   ids, probs);
      record_commits(lg, span, before);
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

  at::Tensor logprobs(int64_t winner, bool) const override {
    if (!recording()) return {};
    return rec_.select(0, winner).narrow(0, lp_, G_).cpu();
  }

  at::Tensor settled_logprobs(int64_t from, int64_t count) const override {
    if (!recording()) return {};
    return settled_rows(rec_.narrow(1, lp_ + from, count), count);
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
    const at::Tensor before = recording() ? canvas_.clone() : at::Tensor();
    ops::bb_coordinate_(canvas_, state_, eos_prob_, flags_, sync_src_, map_ids_, map_probs_, lp_, c_.mask_token_id,
                        o_.merge_gate, o_.merge, o_.sync, o_.sync_gap, o_.refresh_tokens, periodic);
    record_coordination(before);
    rows_.copy_on_device(sync_src_);
    if (!periodic && o_.refresh_tokens > 0) flags_.narrow(0, br::kRefreshWanted, 1).copy_(diverged());
    if (o_.sync_refresh) {  // a branch that received the leader's row (and is not done) refreshes: on the device
      const at::Tensor synced = (sync_src_.ge(0) & state_.select(1, br::kDone).eq(0)).any().to(at::kLong).reshape({1});
      at::Tensor wanted = flags_.narrow(0, br::kRefreshWanted, 1);
      wanted.copy_(wanted.bitwise_or(synced));
    }
  }

  // --- the `logprobs` option (docs/ALGORITHMS.md 17): per-branch tables on the device ------------
  // rec_ [B, L, 1 + 2 top]: what each branch's canvas holds, the record of the forward that gave it
  // (the token's log-prob, then the top ids and their log-probs); seen_ [B, G, 2 top]: the top
  // alternatives of the forward that last wrote each position's probability map entry (the row a
  // merge reads). Every update is a fixed-shape tensor op on device data (the spans, the canvas
  // before and after), so a captured step replays it.
  bool recording() const { return rec_.defined(); }

  // A forward's commits: position q of branch b read logits row rowmap[b, q] (-1: not read) where
  // some span covers it; the positions whose token changed take that row's values, every covered
  // position's map-entry alternatives (seen_) too.
  void record_commits(const at::Tensor& logits, const at::Tensor& spans, const at::Tensor& before) {
    if (!recording()) return;
    const int64_t V = logits.size(1), R = 1 + 2 * top_;
    const at::TensorOptions lo = spans.options();
    const at::Tensor b = spans.select(1, br::kSpanRow).view({-1, 1, 1});
    const at::Tensor lrow = spans.select(1, br::kSpanLogitRow).view({-1, 1, 1});
    const at::Tensor pos0 = spans.select(1, br::kSpanFirstPos).view({-1, 1, 1});
    const at::Tensor cnt = spans.select(1, br::kSpanRows).view({-1, 1, 1});
    const at::Tensor q = at::arange(L_, lo).view({1, 1, L_});
    const at::Tensor in = at::arange(B_, lo).view({1, B_, 1}).eq(b) & q.ge(pos0) & q.lt(pos0 + cnt);
    const at::Tensor rowmap = at::where(in, lrow + q - pos0, -1).amax(0);  // [B, L]; one span per branch
    const at::Tensor covered = rowmap.ge(0), r = rowmap.clamp_min(0).reshape({-1});
    const at::Tensor ls = at::log_softmax(logits.to(at::kFloat), -1);
    const at::Tensor token = canvas_.clamp(0, V - 1).reshape({-1});
    std::vector<at::Tensor> cols{ls.reshape({-1}).index_select(0, r * V + token).to(at::kDouble).view({B_, L_, 1})};
    if (top_ > 0) {
      auto [v, i] = at::topk(ls, top_, -1);
      const at::Tensor alt = at::cat({i.to(at::kDouble), v.to(at::kDouble)}, 1).index_select(0, r).view({B_, L_, -1});
      cols.push_back(alt);
      const at::Tensor gen = covered.narrow(1, lp_, G_).unsqueeze(-1);
      seen_.copy_(at::where(gen, alt.narrow(1, lp_, G_), seen_));
    }
    const at::Tensor changed = (canvas_.ne(before) & covered).unsqueeze(-1);
    rec_.copy_(at::where(changed, at::cat(cols, -1).view({B_, L_, R}), rec_));
  }

  // A coordination: a merge fills a mask of branch b from b's probability map, whose entry its last
  // forward over the position wrote: the record is the log of the probability the merge read and
  // that forward's alternatives (seen_). Then a sync copies the leader's canvas, records included.
  void record_coordination(const at::Tensor& before) {
    if (!recording()) return;
    const at::Tensor tok = canvas_.narrow(1, lp_, G_);
    const at::Tensor p = (map_probs_ * map_ids_.eq(tok.unsqueeze(-1))).sum(-1);  // [B, G]
    std::vector<at::Tensor> cols{at::log(p).unsqueeze(-1)};
    if (top_ > 0) cols.push_back(seen_);
    const at::Tensor merged =
        (tok.ne(before.narrow(1, lp_, G_)) & sync_src_.lt(0).unsqueeze(1)).unsqueeze(-1);  // synced rows: below
    at::Tensor gen = rec_.narrow(1, lp_, G_);
    gen.copy_(at::where(merged, at::cat(cols, -1), gen));
    const at::Tensor src = at::where(sync_src_.ge(0), sync_src_, at::arange(B_, sync_src_.options()));
    rec_.copy_(rec_.index_select(0, src));
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
  int64_t top_ = 0;        // the `logprobs` option's top alternatives
  at::Tensor rec_, seen_;  // its per-branch tables (undefined when off): record_commits
};

}  // namespace

std::unique_ptr<Branches> device_branches(const Network& model, const std::vector<int64_t>& prompt,
                                          const DecodeOptions& o, const std::vector<int64_t>& sizes, BranchRows& rows) {
  return std::make_unique<DeviceBranches>(model, prompt, o, sizes, rows);
}

}  // namespace blockbatch::bbatch
