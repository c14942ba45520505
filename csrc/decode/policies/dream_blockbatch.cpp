// BlockBatch for the Dream family (docs/ALGORITHMS.md 5.4), as a step machine (decode/decoder.h):
// the host bookkeeping between two forwards runs in settle(). The python twin is
// python/blockbatch/reference/dream.py (_DreamBlockBatch); both are written from the semantics of
// the authors' Dream decoder and must agree on tokens, NFE, winner and every counter.
//
// Differences from LLaDA's BlockBatch (blockbatch.cpp) that make this a policy of its own: the
// block step feeds the predecessor window [s-1, e-1) (output j predicts canvas s + j); a full
// forward (init, refresh) writes only the first mask of each branch's window; probability maps
// keep every probability > prob_floor seen since the branch's last full forward (an unpenalised
// softmax) and are copied by leader sync; the merge gate is >=; the exit checks run after every
// phase; without stop_on_eos the loop ignores EOS altogether; NFE counts every forward.
//
// The bookkeeping runs on the host over a host canvas (B rows of length L, uploaded with each
// forward's index buffer); the device runs the forward and the readout (top-1 token and its
// probability after the mask penalty, and the few probabilities above the floor per row), of
// which one copy comes back per step.
#include <ATen/TensorOperators.h>
#include <ATen/ops/gather.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/topk.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "decode/policies/host_canvas.h"

namespace blockbatch {

namespace {

constexpr double kMaskPenalty = -1e4;  // written into the mask id's logit before ranking
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Branch {
  int64_t row = 0, block = 0, start = 0, end = 0;
  int64_t progress = 0;       // first masked generated position (relative), or G / first EOS + 1 when done
  int64_t decoded = 0;        // non-mask generated tokens up to the first EOS
  int64_t since_refresh = 0;  // frontier progress (tokens) since the last full forward
  bool done = false;
  bool has_probs = false;     // probs holds a map (reset by a full forward's seed)
  std::vector<std::vector<std::pair<int64_t, double>>> probs;  // per canvas position: (token, probability)
  BranchStats stats;
};

enum class Exit { kNone, kEosReady, kBranchComplete, kAllDone };

class DreamBlockBatch final : public host::HostCanvasDecoder {
 public:
  DreamBlockBatch(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o, const Stop& stop,
                  at::Tensor kv)
      : HostCanvasDecoder(model, prompt, o, stop), eos_(*o.stop_on_eos ? model.config().eos_token_id : -1),
        G_(o.gen_length), threshold_(static_cast<float>(*o.threshold)), floor_(static_cast<float>(*o.prob_floor)),
        K_(static_cast<int64_t>(std::floor(1.0 / *o.prob_floor)) + 1) {
    std::vector<int64_t> sizes = *o.block_sizes;
    std::sort(sizes.begin(), sizes.end());
    B_ = static_cast<int64_t>(sizes.size());
    x_.resize(B_ * L_, mask_);
    for (int64_t r = 0; r < B_; ++r) {
      std::copy(prompt.begin(), prompt.end(), x_.begin() + r * L_);
      Branch b;
      b.row = r;
      b.block = sizes[r];
      b.start = lp_;
      b.end = std::min(lp_ + sizes[r], L_);
      b.stats.block_size = sizes[r];
      br_.push_back(std::move(b));
    }
    kv_ = kv.defined() ? std::move(kv) : model.new_kv(B_, L_);
  }

  // Forwards: init, then block steps and refreshes, as settle() finds them between exits.
  bool done() const override { return finished_; }

  StepPlan plan() override {
    stop_.check(st_.nfe_init + st_.nfe_block + st_.nfe_refresh, x_);
    if (next_ == Next::kInit) return init_plan();
    return next_ == Next::kBlock ? block_plan() : refresh_plan();
  }

  void absorb(const StepPlan& p, const at::Tensor& logits, const std::vector<at::Tensor>&) override {
    const int64_t before = total_committed();
    if (next_ == Next::kBlock) {
      absorb_block(logits);
    } else {
      if (next_ == Next::kInit) {
        st_.nfe_init += 1;
        if (B_ > 1) kv_.narrow(0, 1, B_ - 1).copy_(kv_.narrow(0, 0, 1).expand_as(kv_.narrow(0, 1, B_ - 1)));
      } else {
        st_.nfe_refresh += 1;
      }
      seed(seeding_, seed_pos_, logits);
    }
    st_.steps.push_back({total_committed() - before, p.q.size()});
    if (next_ == Next::kInit) {
      exit_ = finished();
      stage_ = Stage::kTop;
    } else {
      stage_ = next_ == Next::kBlock ? Stage::kAfterBlock : Stage::kAfterRefresh;
    }
    settle();
  }

  DecodeResult finish() override {
    if (exit_ == Exit::kNone) {  // every branch done: the most progress, then the larger block
      winner_ = 0;
      for (int64_t r = 1; r < B_; ++r) {
        if (std::make_pair(br_[r].progress, br_[r].block) > std::make_pair(br_[winner_].progress, br_[winner_].block))
          winner_ = r;
      }
      exit_ = Exit::kAllDone;
    }
    DecodeResult res;
    res.tokens.assign(x_.begin() + winner_ * L_, x_.begin() + (winner_ + 1) * L_);
    if (exit_ == Exit::kEosReady) {  // the text ends at the winner's first EOS
      const int64_t cut = lp_ + *first_eos(winner_) + 1;
      std::fill(res.tokens.begin() + cut, res.tokens.end(), eos_);
    }
    DecodeStats& st = res.stats;
    st = std::move(st_);
    st.early_exit = exit_ == Exit::kEosReady;
    st.winner = winner_;
    st.winner_block_size = br_[winner_].block;
    for (const Branch& b : br_) st.branches.push_back(b.stats);
    host::finish_stats(st);
    return res;
  }

 private:
  int64_t* row(int64_t r) { return &x_[r * L_]; }
  const int64_t* row(int64_t r) const { return &x_[r * L_]; }
  bool all_done() const {
    return std::all_of(br_.begin(), br_.end(), [](const Branch& b) { return b.done; });
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
  int64_t counted_end(int64_t r) const {
    const auto fe = first_eos(r);
    return fe ? *fe + 1 : G_;
  }

  // Window = own-size block of the first mask before the first EOS; recount `decoded`.
  void snap(Branch& b) {
    const auto fe = first_eos(b.row);
    const int64_t counted = fe ? *fe + 1 : G_, decode_end = fe ? *fe : G_;
    const int64_t* g = row(b.row) + lp_;
    b.decoded = 0;
    for (int64_t j = 0; j < counted; ++j) b.decoded += g[j] != mask_;
    int64_t first = -1;
    for (int64_t j = 0; j < decode_end && first < 0; ++j) {
      if (g[j] == mask_) first = j;
    }
    if (first < 0) {
      b.done = true;
      b.progress = fe ? *fe + 1 : G_;
      b.start = b.end = lp_ + b.progress;
      return;
    }
    b.done = false;
    b.start = lp_ + first / b.block * b.block;
    b.end = std::min(b.start + b.block, lp_ + decode_end);
    b.progress = first;
  }
  void advance(Branch& b) {
    const int64_t old = b.progress;
    snap(b);
    b.since_refresh += std::max<int64_t>(b.progress - old, 0);
  }
  void to_active_window(Branch& b) {
    while (!b.done && !has_mask(b.row, b.start, b.end)) {
      const int64_t prev = b.progress;
      advance(b);
      if (b.done || b.progress <= prev) break;
    }
  }
  int64_t window_hi(const Branch& b) const {
    const auto fe = first_eos(b.row);
    return fe ? std::min(b.end, lp_ + *fe) : b.end;
  }

  // --- forwards ------------------------------------------------------------------------------

  // A full forward's seeds (init, refresh): after moving each branch to its active window, the
  // window's first mask, written from the output before it (shifted logits); kNoSeed when the
  // window has none, kWasDone for a branch done before the forward. The forward changes no host
  // state, so this runs before it.
  static constexpr int64_t kNoSeed = -1, kWasDone = -2;
  std::vector<int64_t> seed_positions(const std::vector<Branch*>& branches) {
    std::vector<int64_t> pos;
    for (Branch* b : branches) {
      int64_t p = kWasDone;
      if (!b->done) {
        p = kNoSeed;
        to_active_window(*b);
        const int64_t hi = window_hi(*b);
        for (int64_t q = b->start; q < hi && p < 0 && !b->done; ++q) {
          if (row(b->row)[q] == mask_) p = q;
        }
      }
      pos.push_back(p);
    }
    return pos;
  }
  // The logits rows of the seeds (the output before each seed position, in the packed forward
  // whose query row i is branch i's canvas when `per_row`, else the one shared row).
  std::vector<int64_t> seed_rows(const std::vector<int64_t>& pos, bool per_row) const {
    std::vector<int64_t> rows;
    for (size_t i = 0; i < pos.size(); ++i) {
      if (pos[i] >= 0) rows.push_back((per_row ? static_cast<int64_t>(i) * L_ : 0) + pos[i] - 1);
    }
    return rows;
  }
  // Writes the seeds; `logits` holds one row per seed, in order.
  void seed(const std::vector<Branch*>& branches, const std::vector<int64_t>& pos, const at::Tensor& logits) {
    std::vector<int64_t> token;
    if (std::any_of(pos.begin(), pos.end(), [](int64_t p) { return p >= 0; })) {
      at::Tensor lg = logits.to(at::kFloat).clone();
      lg.select(1, mask_).fill_(kMaskPenalty);
      const at::Tensor pred = host::to_host({std::get<1>(at::topk(proposable(lg), 1))})[0];
      token.assign(pred.const_data_ptr<int64_t>(), pred.const_data_ptr<int64_t>() + pred.numel());
    }
    size_t k = 0;
    for (size_t i = 0; i < branches.size(); ++i) {
      Branch& b = *branches[i];
      if (pos[i] == kWasDone) continue;
      if (pos[i] == kNoSeed) {
        b.since_refresh = 0;
        continue;
      }
      row(b.row)[pos[i]] = token[k++];
      b.stats.committed += 1;
      b.has_probs = false;
      advance(b);
      b.since_refresh = 0;
    }
  }

  // A full forward's query rows: the seeds' logits rows, or one placeholder row when there is no
  // seed (the forward still runs and counts).
  static void set_logit_rows(PackedQueries& q, std::vector<int64_t> rows) {
    q.logit_index = rows.empty() ? std::vector<int64_t>{0} : std::move(rows);
  }

  // The host loop between two forwards (the authors' order of exits, block step, coordination and
  // refresh): runs until the next forward is known (next_) or the decode is finished.
  void settle() {
    // Bound: every block step with a forward commits at least one token in some branch (each
    // branch in it has a mask in its window and commits one), merges and syncs only fill masks,
    // so the canvas rows fill within B * G block steps; a sync can undo a lagging row's progress
    // at most once per leader token. 4 B G + 8 iterations cover it with room to spare.
    const int64_t max_iterations = 4 * B_ * G_ + 8;
    for (;;) {
      if (stage_ == Stage::kTop) {
        if (exit_ != Exit::kNone || all_done()) break;
        TORCH_CHECK(iterations_ < max_iterations, "dream blockbatch: internal error: the decode did not finish within ",
                    max_iterations, " iterations; please report it with the options");
        if ((exit_ = finished()) != Exit::kNone) break;
        if (!all_done()) {
          todo_.clear();
          for (Branch& b : br_) {
            if (b.done) continue;
            to_active_window(b);
            if (!b.done && has_mask(b.row, b.start, b.end)) todo_.push_back(&b);
          }
          if (!todo_.empty()) {
            next_ = Next::kBlock;
            return;
          }
        }
        stage_ = Stage::kAfterBlock;
      } else if (stage_ == Stage::kAfterBlock) {
        if ((exit_ = finished()) != Exit::kNone) break;
        coordinate();
        if ((exit_ = finished()) != Exit::kNone) break;
        bool want = false, any_active = false;
        for (const Branch& b : br_) {
          if (b.done) continue;
          any_active = true;
          want = want || (o_.refresh_tokens > 0 && b.since_refresh >= o_.refresh_tokens);
        }
        want = want || (o_.sync_refresh && synced_);  // variant: refresh after a sync (ALGORITHMS.md 10.3)
        synced_ = false;
        if (any_active && want) {
          seeding_.clear();
          for (Branch& b : br_) {
            if (!b.done) seeding_.push_back(&b);
          }
          seed_pos_ = seed_positions(seeding_);
          next_ = Next::kRefresh;
          return;
        }
        stage_ = Stage::kTop;
        ++iterations_;
      } else {  // after a refresh
        exit_ = finished();
        stage_ = Stage::kTop;
        ++iterations_;
      }
    }
    finished_ = true;
  }

  // Init (1 NFE): the prompt row's full forward fills KV row 0, copied to every row; every branch
  // writes its first mask.
  StepPlan init_plan() {
    seeding_.clear();
    for (Branch& b : br_) seeding_.push_back(&b);
    seed_pos_ = seed_positions(seeding_);
    PackedQueries q;
    q.add_positions(0, L_, 0, 0);
    set_logit_rows(q, seed_rows(seed_pos_, false));
    for (Branch& b : br_) b.stats.forwards += 1;
    return canvas_plan(std::move(q), KvMode::kFull, StepKind::kInit);
  }

  // Refresh (1 NFE): one full forward over every active row (each writes its own KV row).
  StepPlan refresh_plan() {
    PackedQueries q;
    for (Branch* b : seeding_) {
      q.add_positions(0, L_, b->row, b->row * L_);
      b->stats.forwards += 1;
    }
    set_logit_rows(q, seed_rows(seed_pos_, true));
    return canvas_plan(std::move(q), KvMode::kFull, StepKind::kRefresh);
  }

  // Block step (1 NFE): every active branch whose window holds a mask feeds its predecessor
  // window [start - 1, end - 1) against its own KV row (dual cache); output j predicts start + j.
  StepPlan block_plan() {
    PackedQueries q;
    first_.clear();  // each branch's first row in the packed logits
    for (Branch* b : todo_) {
      first_.push_back(q.size());
      q.add_positions(b->start - 1, b->end - 1, b->row, b->row * L_);
      b->stats.forwards += 1;
    }
    return canvas_plan(std::move(q), KvMode::kDual, StepKind::kBlock);
  }

  void absorb_block(const at::Tensor& out) {
    const at::Tensor logits = out.to(at::kFloat);
    st_.nfe_block += 1;
    // Readout of every row: top-1 after the mask penalty and its probability; the raw softmax's
    // K largest probabilities (every one above the floor is among them: K > 1 / floor).
    at::Tensor lg = logits.clone();
    lg.select(1, mask_).fill_(kMaskPenalty);
    const at::Tensor pred = std::get<1>(at::topk(proposable(lg), 1));
    const at::Tensor conf = at::gather(at::softmax(lg, -1), -1, pred).squeeze(-1);
    auto [pv, pid] = at::topk(at::softmax(logits, -1), std::min(K_, logits.size(-1)));
    const std::vector<at::Tensor> h = host::to_host({pred.squeeze(-1), conf, pid, pv});
    for (size_t i = 0; i < todo_.size(); ++i) absorb(*todo_[i], first_[i], h);
  }

  void absorb(Branch& b, int64_t first, const std::vector<at::Tensor>& h) {
    const int64_t lo = b.start, hi = std::min(window_hi(b), L_), n = hi - lo;
    if (n <= 0 || !has_mask(b.row, lo, hi)) {
      advance(b);
      return;
    }
    const int64_t* pred = h[0].const_data_ptr<int64_t>() + first;
    const double* conf = h[1].const_data_ptr<double>() + first;
    const int64_t K = h[2].size(1);
    const int64_t* pid = h[2].const_data_ptr<int64_t>() + first * K;
    const double* pv = h[3].const_data_ptr<double>() + first * K;
    int64_t* x = row(b.row);
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
      b.stats.committed += 1;
    }
    // The map: every probability above the floor of the raw softmax, overwriting older entries.
    if (!b.has_probs) {
      b.probs.assign(L_, {});
      b.has_probs = true;
    }
    for (int64_t j = 0; j < n; ++j) {
      auto& slot = b.probs[lo + j];
      for (int64_t k = 0; k < K; ++k) {
        const double p = pv[j * K + k];
        if (!(static_cast<float>(p) > floor_)) continue;
        const int64_t t = pid[j * K + k];
        auto it = std::find_if(slot.begin(), slot.end(), [t](const auto& e) { return e.first == t; });
        if (it == slot.end()) slot.emplace_back(t, p);
        else it->second = p;
      }
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

  int64_t total_committed() const {
    int64_t n = 0;
    for (const Branch& b : br_) n += b.stats.committed;
    return n;
  }

  // --- coordination --------------------------------------------------------------------------

  int64_t leader() const {  // most decoded; the first (smallest block) of equal counts
    int64_t l = 0;
    for (int64_t r = 1; r < B_; ++r) {
      if (br_[r].decoded > br_[l].decoded) l = r;
    }
    return l;
  }
  std::vector<Branch*> compatible(const Branch& dst, const std::vector<Branch*>& sources) const {
    std::vector<Branch*> out;
    const int64_t* gd = row(dst.row) + lp_;
    for (Branch* src : sources) {
      const int64_t* gs = row(src->row) + lp_;
      const int64_t n = std::min(counted_end(dst.row), counted_end(src->row));
      bool ok = true;
      for (int64_t j = 0; j < n && ok; ++j) {
        if (gd[j] != mask_ && gs[j] != mask_ && gd[j] != gs[j]) ok = false;
      }
      if (ok) out.push_back(src);
    }
    return out;
  }
  void merge(Branch& dst, const std::vector<Branch*>& sources) {
    if (!dst.has_probs) return;
    const auto fe = first_eos(dst.row);
    const int64_t lo = std::max(dst.start, lp_);
    int64_t hi = std::min(dst.end, L_);
    if (fe) hi = std::min(hi, lp_ + *fe);
    int64_t filled = 0;
    for (int64_t pos = lo; pos < hi; ++pos) {
      if (row(dst.row)[pos] != mask_ || dst.probs[pos].empty()) continue;
      int64_t best_tok = mask_;
      double best_p = 0.0;
      for (const Branch* src : sources) {
        if (src->done) continue;
        const auto sfe = first_eos(src->row);
        if (sfe && pos > lp_ + *sfe) continue;
        const int64_t tok = row(src->row)[pos];
        if (tok == mask_) continue;
        double p = 0.0;
        for (const auto& e : dst.probs[pos]) {
          if (e.first == tok) p = e.second;
        }
        if (p > best_p) best_tok = tok, best_p = p;
      }
      if (best_p >= o_.merge_gate && best_tok != mask_) {
        row(dst.row)[pos] = best_tok;
        filled += 1;
      }
    }
    if (filled) {
      dst.stats.merged += filled;
      advance(dst);
    }
  }
  void sync(Branch& dst, const Branch& lead) {
    int64_t* d = row(dst.row);
    const int64_t* s = row(lead.row);
    for (int64_t p = 0; p < L_; ++p) {
      if (d[p] != s[p] && s[p] != mask_) dst.stats.copied += 1;
      d[p] = s[p];
    }
    dst.since_refresh = lead.since_refresh;
    dst.has_probs = lead.has_probs;
    dst.probs = lead.probs;
    kv_.select(0, dst.row).copy_(kv_.select(0, lead.row));
    snap(dst);
  }
  void coordinate() {
    for (Branch& b : br_) snap(b);
    if (br_[leader()].decoded == 0) return;
    std::vector<Branch*> order;
    for (Branch& b : br_) {
      if (!b.done) order.push_back(&b);
    }
    std::stable_sort(order.begin(), order.end(), [](const Branch* a, const Branch* b) { return a->end > b->end; });
    const bool past_prompt = std::any_of(order.begin(), order.end(), [&](const Branch* b) { return b->end > lp_; });
    if (o_.merge && past_prompt) {
      for (size_t i = 0; i < order.size(); ++i) {
        const std::vector<Branch*> sources =
            compatible(*order[i], std::vector<Branch*>(order.begin() + static_cast<int64_t>(i) + 1, order.end()));
        if (!sources.empty()) merge(*order[i], sources);
      }
    }
    for (Branch& b : br_) snap(b);
    const int64_t l = leader();
    if (!o_.sync) return;
    for (Branch& b : br_) {
      if (b.row == l || b.done) continue;
      if (br_[l].decoded - b.decoded > o_.sync_gap) {
        sync(b, br_[l]);
        synced_ = synced_ || !b.done;
      }
    }
  }

  // --- exits ---------------------------------------------------------------------------------

  // EOS-ready (a first EOS with no mask before it): the most decoded, then progress, then block;
  // else a complete row (no mask at all): the most decoded, then block.
  Exit finished() {
    for (Branch& b : br_) snap(b);
    if (eos_ >= 0) {
      int64_t w = -1;
      for (Branch& b : br_) {
        const auto fe = first_eos(b.row);
        if (!fe || has_mask(b.row, lp_, lp_ + *fe)) continue;
        b.done = true;
        if (w < 0 || std::make_tuple(b.decoded, b.progress, b.block) >
                         std::make_tuple(br_[w].decoded, br_[w].progress, br_[w].block))
          w = b.row;
      }
      if (w >= 0) {
        winner_ = w;
        return Exit::kEosReady;
      }
    }
    int64_t w = -1;
    for (Branch& b : br_) {
      if (has_mask(b.row, lp_, L_)) continue;
      b.done = true, b.progress = G_, b.decoded = G_;
      if (w < 0 || std::make_pair(b.decoded, b.block) > std::make_pair(br_[w].decoded, br_[w].block)) w = b.row;
    }
    if (w >= 0) {
      winner_ = w;
      return Exit::kBranchComplete;
    }
    return Exit::kNone;
  }

  const int64_t eos_, G_;
  const float threshold_, floor_;  // compared with float32 probabilities
  const int64_t K_;
  int64_t B_ = 0, winner_ = 0;
  std::vector<Branch> br_;
  bool synced_ = false;  // sync_refresh: the last coordination synced a branch that is not done
  // The step machine: where settle() stands, the next forward, its branches and seeds.
  enum class Stage { kTop, kAfterBlock, kAfterRefresh };
  enum class Next { kInit, kBlock, kRefresh };
  Stage stage_ = Stage::kTop;
  Next next_ = Next::kInit;
  Exit exit_ = Exit::kNone;
  bool finished_ = false;
  int64_t iterations_ = 0;
  std::vector<Branch*> todo_, seeding_;
  std::vector<int64_t> first_, seed_pos_;
};

}  // namespace

std::unique_ptr<Decoder> dream_blockbatch_decoder(const Network& model, const std::vector<int64_t>& prompt,
                                                  const DecodeOptions& o, const Stop& stop, at::Tensor kv) {
  return std::make_unique<DreamBlockBatch>(model, prompt, o, stop, std::move(kv));
}

}  // namespace blockbatch
