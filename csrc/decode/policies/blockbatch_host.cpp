// BlockBatch's host executor (Readout::kHostTopk; decode/policies/blockbatch.h): Dream's accumulated
// map, >= gate, decoded / progress / block exit and frontier-token clock over a host canvas.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/full.h>
#include <ATen/ops/gather.h>
#include <ATen/ops/log_softmax.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/tensor.h>
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
#include "decode/policies/host_canvas.h"
#include "ops/ops.h"

namespace blockbatch::bbatch {

namespace {

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
               const BlockBatchRules& rules, const std::vector<int64_t>& sizes, BranchRows& rows)
      : Branches(static_cast<int64_t>(sizes.size())), o_(o), rules_(rules),
        shift_(family_spec(model.config().family).logit_shift), mask_(model.config().mask_token_id),
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
    if (o.logprobs) {  // the `logprobs` option: per-branch records (ALGORITHMS.md 17), on the device
      top_ = *o.logprobs;
      const at::TensorOptions f64 = at::TensorOptions().dtype(at::kDouble).device(model.device());
      rec_ = at::full({B_ * L_, 1 + 2 * top_}, std::numeric_limits<double>::quiet_NaN(), f64);
    }
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
        if (seeds_[i] >= 0) p.q.logit_index.push_back(spans[i].row * L_ + seeds_[i] - shift_);
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
    if (o_.merge) {
      const std::vector<int64_t> before = recording() ? x_ : std::vector<int64_t>();
      br::merge_step(br::SerialExec{}, view(), p_);
      record_merges(before);
    }
    snap_all();
    if (!o_.sync) return;
    std::vector<int64_t> src(B_, -1);  // the rows each synced branch copied: its KV row follows
    br::sync_step(br::SerialExec{}, view(), src.data(), p_);
    record_syncs(src);
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

  at::Tensor logprobs(int64_t winner, bool eos) const override {
    if (!recording()) return {};
    at::Tensor r = rec_.narrow(0, winner * L_ + lp_, G_).to(at::kCPU, /*non_blocking=*/false, /*copy=*/true);
    if (eos)
      r.narrow(0, *first_eos(winner) + 1, G_ - *first_eos(winner) - 1).fill_(std::numeric_limits<double>::quiet_NaN());
    return r;
  }

  at::Tensor settled_logprobs(int64_t from, int64_t count) const override {
    if (!recording()) return {};
    return settled_rows(rec_.view({B_, L_, -1}).narrow(1, lp_ + from, count), count);
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
    if (recording()) {  // the slots' records grow with them
      at::Tensor slots = at::zeros({B_ * G_, k, 1 + 2 * top_}, rec_.options());
      if (map_k_ > 0) slots.narrow(1, 0, map_k_).copy_(slots_.view({B_ * G_, map_k_, -1}));
      slots_ = slots.view({B_ * G_ * k, -1});
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
    std::vector<int64_t> token, at, from;  // logprobs: the seeds' rec_ rows and logits rows
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
        at.push_back(b * L_ + seeds_[i]);
        from.push_back(static_cast<int64_t>(k));
        row(b)[seeds_[i]] = token[k++];
        st(b)[br::kCommitted] += 1;
        std::fill_n(&map_ids_[view().entry(b, lp_)], G_ * map_k_, -1);  // the seed clears the map
        advance(b);
      }
      st(b)[br::kSinceRefresh] = 0;
    }
    if (recording() && !at.empty()) {
      const at::Tensor lg = logits.to(at::kFloat);
      const at::Tensor tok = dev(token).view({-1, 1});
      rec_.index_copy_(0, dev(at), row_values(at::log_softmax(lg, -1), tok).index_select(0, dev(from)));
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
    commits_.clear(), commit_rows_.clear(), slot_ids_.clear(), slot_from_.clear();
    for (const Span& s : spans_) absorb(s.b, s.first, h);
    if (!recording()) return;
    // The rows' values for the committed tokens, and for every id a map slot took (row i's k-th id:
    // entry i * K + k of the second table), written where the absorbs said.
    const at::Tensor ls = at::log_softmax(logits, -1);
    if (!commits_.empty()) {
      rec_.index_copy_(0, dev(commits_), row_values(ls, pred).index_select(0, dev(commit_rows_)));
    }
    if (!slot_ids_.empty()) {  // the slots as the map stands now (an entry may have grown since)
      std::vector<int64_t> at;
      for (size_t i = 0; i < slot_ids_.size(); i += 3)
        at.push_back(slot_of(slot_ids_[i], slot_ids_[i + 1], slot_ids_[i + 2]));
      const at::Tensor per_id = row_values(ls, pid).reshape({-1, 1 + 2 * top_});  // [rows * K, R]
      slots_.index_copy_(0, dev(at), per_id.index_select(0, dev(slot_from_)));
    }
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
      if (recording()) commits_.push_back(b * L_ + lo + j), commit_rows_.push_back(first + j);
    }
    // MapRule::kAccumulateSinceSeed: every probability above the floor, over older entries of its token.
    while (br::record_map(br::SerialExec{}, view(), b, lo, n, pid, pv, K, br::MapMode::kAccumulate)) {
      grow(2 * map_k_);
    }
    // logprobs: the slot each id went to takes this row's values for it (absorb_block writes them)
    for (int64_t j = 0; recording() && j < n; ++j) {
      for (int64_t k = 0; k < K; ++k) {
        if (pid[j * K + k] >= 0) {
          slot_ids_.insert(slot_ids_.end(), {b, lo + j, pid[j * K + k]});
          slot_from_.push_back((first + j) * K + k);
        }
      }
    }
    advance(b);
  }

  // --- the `logprobs` option (docs/ALGORITHMS.md 17) ---------------------------------------------
  // rec_ [B L, 1 + 2 top]: what each branch's canvas holds, the record of the forward that gave it;
  // slots_ [B G map_k, 1 + 2 top]: per map slot, the row whose probability it holds (the id's
  // log-prob in it, its top alternatives), the row a merge of that id reads. On the device; the
  // host hands index lists only.
  bool recording() const { return rec_.defined(); }
  at::Tensor dev(const std::vector<int64_t>& v) const { return at::tensor(v, at::kLong).to(rec_.device()); }
  // Per row of log-softmax `ls` [n, V] and each of its ids [n, m]: [n, m, R] (the id's log-prob,
  // then the row's top ids and log-probs); m = 1 gives [n, R].
  at::Tensor row_values(const at::Tensor& ls, const at::Tensor& ids) const {
    const at::Tensor lp = ls.gather(1, ids.clamp(0, ls.size(1) - 1)).to(at::kDouble).unsqueeze(-1);  // [n, m, 1]
    if (top_ == 0) return ids.size(1) == 1 ? lp.squeeze(1) : lp;
    auto [v, i] = at::topk(ls, top_, -1);
    const at::Tensor alt =
        at::cat({i.to(at::kDouble), v.to(at::kDouble)}, 1).unsqueeze(1).expand({-1, ids.size(1), -1});
    const at::Tensor out = at::cat({lp, alt}, -1);
    return ids.size(1) == 1 ? out.squeeze(1) : out;
  }
  // The flat slot of `id` in branch b's map entry at `pos` (it holds it).
  int64_t slot_of(int64_t b, int64_t pos, int64_t id) const {
    const int64_t e = (b * G_ + pos - lp_) * map_k_;
    for (int64_t s = 0; s < map_k_; ++s) {
      if (map_ids_[e + s] == id) return e + s;
    }
    TORCH_CHECK(false, "blockbatch: internal error: map entry (", b, ", ", pos, ") lost token ", id);
  }
  // A merge filled masks of its destination from its own map: each takes its slot's record.
  void record_merges(const std::vector<int64_t>& before) {
    if (!recording()) return;
    std::vector<int64_t> at, from;
    for (int64_t b = 0; b < B_; ++b) {
      for (int64_t q = lp_; q < L_; ++q) {
        if (before[b * L_ + q] != x_[b * L_ + q])
          at.push_back(b * L_ + q), from.push_back(slot_of(b, q, x_[b * L_ + q]));
      }
    }
    if (!at.empty()) rec_.index_copy_(0, dev(at), slots_.index_select(0, dev(from)));
  }
  // A sync copies the leader's canvas and map: their records with them.
  void record_syncs(const std::vector<int64_t>& src) {
    if (!recording() || std::all_of(src.begin(), src.end(), [](int64_t s) { return s < 0; })) return;
    std::vector<int64_t> rows(B_);
    for (int64_t b = 0; b < B_; ++b) rows[b] = src[b] >= 0 ? src[b] : b;
    const at::Tensor r = dev(rows);
    at::Tensor rec = rec_.view({B_, L_, -1}), slots = slots_.view({B_, G_ * map_k_, -1});
    rec.copy_(rec.index_select(0, r));
    slots.copy_(slots.index_select(0, r));
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
  const BlockBatchRules& rules_;
  const int64_t shift_;  // the family's logit shift
  const int64_t mask_, limit_, eos_, lp_, G_, L_, B_;
  const float threshold_;  // compared with float32 probabilities
  const int64_t K_;
  BranchRows& rows_;
  const br::CoordinateParams p_;  // the merge gate and the window and clock rules of the row
  std::vector<int64_t> x_;        // the canvases: B rows of L, concatenated
  int64_t map_k_ = 0;             // slots per map entry (grown when an entry accumulates more)
  std::vector<int64_t> map_ids_;
  std::vector<double> map_probs_;
  bool synced_ = false;         // sync_refresh: the last coordination synced a branch that is not done
  std::vector<Span> spans_;     // the step in flight
  std::vector<int64_t> seeds_;  // its seed positions (full forwards)
  int64_t top_ = 0;             // the `logprobs` option's top alternatives
  at::Tensor rec_, slots_;      // its tables (undefined when off): recording()
  // A block step's writes into them: rec_ rows and logits rows; (branch, position, id) and entries of
  // the step's [rows K] ids.
  std::vector<int64_t> commits_, commit_rows_, slot_ids_, slot_from_;
};

}  // namespace

std::unique_ptr<Branches> host_branches(const Network& model, const std::vector<int64_t>& prompt,
                                        const DecodeOptions& o, const BlockBatchRules& rules,
                                        const std::vector<int64_t>& sizes, BranchRows& rows) {
  return std::make_unique<HostBranches>(model, prompt, o, rules, sizes, rows);
}

}  // namespace blockbatch::bbatch
