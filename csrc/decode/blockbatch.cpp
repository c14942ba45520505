// BlockBatch multi-branch consensus decoding (ALGORITHMS.md section 4). The python twin is
// python/blockbatch/reference/blockbatch.py; both are written from the spec and must agree on
// tokens, winner and every counter.
//
// Host side: canvases, windows, counters and the sparse probability maps (small). Device side:
// the KV rows [branches, layers, 2, kv_heads, L, head_dim] and the forwards. Each forward costs
// one host->device copy of its packed indices and one host<-device copy of its proposals and
// sparse probabilities (StepRunner; on CUDA the step replays a graph per active-branch set).
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/tensor.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <set>

#include "decode/commit.h"
#include "decode/decode.h"
#include "decode/step.h"
#include "decode/step_runner.h"
#include "torch/ops.h"

namespace blockbatch {

namespace {

struct Branch {
  int64_t block_size = 0;
  int64_t row = 0;                 // canvas row and KV row
  int64_t start = 0, end = 0;      // current window
  int64_t decoded = 0;             // committed by its forwards or received by sync
  bool done = false;
  int64_t blocks_since_refresh = 0;
  bool needs_refresh = false;
  bool eos_ready = false;
  double eos_prob = 0;
  // prob_map[p - lp]: tokens with probability > prob_floor at generated position p, from the
  // most recent forward of this branch that covered p (empty: none above the floor / never).
  std::vector<std::vector<std::pair<int64_t, double>>> prob_map;
  BranchStats stats;
  int64_t nfe_init = 0, nfe_block = 0, nfe_refresh = 0;
};

class BlockBatchDecoder {
 public:
  BlockBatchDecoder(const Model& model, const std::vector<int64_t>& prompt, const DecodeOptions& o)
      : model_(model), o_(o), c_(model.config()), lp_(static_cast<int64_t>(prompt.size())),
        L_(lp_ + o.gen_length), generator_(at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(o.seed))),
        runner_(model, o.cuda_graphs) {
    std::vector<int64_t> sizes = o.block_sizes;
    std::sort(sizes.begin(), sizes.end());
    max_k_ = static_cast<int64_t>(std::floor(1.0 / o.prob_floor)) + 1;
    for (size_t i = 0; i < sizes.size(); ++i) {
      Branch b;
      b.block_size = sizes[i];
      b.row = static_cast<int64_t>(i);
      b.start = lp_;
      b.end = lp_ + sizes[i];
      b.prob_map.resize(o.gen_length);
      b.stats.block_size = sizes[i];
      branches_.push_back(std::move(b));
      canvas_.emplace_back(L_, c_.mask_token_id);
      std::copy(prompt.begin(), prompt.end(), canvas_.back().begin());
    }
    kv_ = model.new_kv(static_cast<int64_t>(sizes.size()), L_);
  }

  DecodeResult run() {
    const auto t0 = std::chrono::steady_clock::now();
    full_forward(all_branches(), /*init=*/true);
    coordinate();
    Branch* winner = nullptr;
    while (!all_done()) {
      block_step();
      Branch* ready = nullptr;  // highest EOS probability; the first (smallest size) wins ties
      for (auto& b : branches_) {
        if (b.eos_ready && (!ready || b.eos_prob > ready->eos_prob)) ready = &b;
      }
      if (ready) {
        winner = ready;
        stats_.early_exit = true;
        break;
      }
      coordinate();
    }
    if (!winner) {  // natural exit: most progress, the smallest block size on ties
      for (auto& b : branches_) {
        if (!winner || progress(b) > progress(*winner)) winner = &b;
      }
    }
    DecodeResult res;
    res.tokens = canvas_[winner->row];
    stats_.nfe = stats_.nfe_init + stats_.nfe_block + stats_.nfe_refresh;
    stats_.nfe_paper = winner->nfe_init + winner->nfe_block + winner->nfe_refresh;
    stats_.winner = winner->row;
    stats_.winner_block_size = winner->block_size;
    for (auto& b : branches_) {
      b.stats.forwards = b.nfe_init + b.nfe_block + b.nfe_refresh;
      stats_.branches.push_back(b.stats);
    }
    stats_.graph_captures = runner_.captures();
    stats_.graph_replays = runner_.replays();
    stats_.wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    res.stats = std::move(stats_);
    return res;
  }

 private:
  int64_t progress(const Branch& b) const { return (b.done ? L_ : b.start) - lp_; }
  bool all_done() const {
    return std::all_of(branches_.begin(), branches_.end(), [](const Branch& b) { return b.done; });
  }
  std::vector<Branch*> all_branches() {
    std::vector<Branch*> out;
    for (auto& b : branches_) out.push_back(&b);
    return out;
  }
  std::vector<Branch*> active() {
    std::vector<Branch*> out;
    for (auto& b : branches_) {
      if (!b.done) out.push_back(&b);
    }
    return out;
  }
  bool has_masks(const Branch& b) const {
    const auto& x = canvas_[b.row];
    return std::find(x.begin() + b.start, x.begin() + b.end, c_.mask_token_id) != x.begin() + b.end;
  }

  // Window = the block of the branch's own size holding its first masked generated position.
  void snap_window(Branch& b) {
    const auto& x = canvas_[b.row];
    auto it = std::find(x.begin() + lp_, x.end(), c_.mask_token_id);
    if (it == x.end()) {
      b.done = true;
      b.start = b.end = L_;
      return;
    }
    const int64_t k = (it - x.begin() - lp_) / b.block_size;
    b.start = lp_ + k * b.block_size;
    b.end = b.start + b.block_size;
  }

  void advance(Branch& b) {
    snap_window(b);
    if (b.done) return;
    b.blocks_since_refresh += 1;
    if (o_.refresh_tokens > 0 && o_.refresh_mode == RefreshMode::kPeriodic &&
        b.blocks_since_refresh * b.block_size >= o_.refresh_tokens) {
      b.needs_refresh = true;
    }
  }

  // Sparse probabilities for `rows` logits rows, recorded at positions first_pos...
  void record_probs(Branch& b, const int64_t* ids, const double* probs, int64_t rows, int64_t first_pos) {
    for (int64_t i = 0; i < rows; ++i) {
      auto& entry = b.prob_map[first_pos + i - lp_];
      entry.clear();
      for (int64_t k = 0; k < max_k_; ++k) {
        if (ids[i * max_k_ + k] >= 0) entry.emplace_back(ids[i * max_k_ + k], probs[i * max_k_ + k]);
      }
    }
  }

  // Threshold rule inside the branch's window from that window's proposals.
  int64_t commit_window(Branch& b, const int64_t* token, const double* conf) {
    auto& x = canvas_[b.row];
    const int64_t n = b.end - b.start;
    std::vector<double> c(n);
    bool any = false;
    for (int64_t i = 0; i < n; ++i) {
      const bool candidate = x[b.start + i] == c_.mask_token_id;
      c[i] = candidate ? conf[i] : -std::numeric_limits<double>::infinity();
      any = any || candidate;
    }
    if (!any) return 0;
    const std::vector<char> chosen = select_threshold(c.data(), n, o_.threshold);
    int64_t k = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (chosen[i]) {
        x[b.start + i] = token[i];
        ++k;
      }
    }
    b.decoded += k;
    b.stats.committed += k;
    return k;
  }

  struct Sparse {
    at::Tensor ids, probs;  // host
  };
  // What the host reads back from one forward, in ONE device-to-host copy: the greedy proposals
  // and the sparse probability map (sampling: the float64 logits instead of the proposals).
  struct StepData {
    at::Tensor logits;    // device
    Proposals all;        // greedy proposals of every logits row
    Sparse sp;
    at::Tensor logits64;  // host, sampling only
  };
  StepData forward(const PackedQueries& q, KvMode mode) {
    const bool sampling = o_.temperature > 0;
    StepRunner::Output out = runner_.run(q, kv_, mode, sampling ? 1 : 0, [&](const at::Tensor& logits) {
      const at::Tensor l = logits.contiguous();
      auto [ids, probs] = ops::sparse_probs(l, o_.prob_floor, max_k_);
      if (sampling) return std::vector<at::Tensor>{ids, probs, l.to(at::kDouble)};
      auto [token, conf] = ops::confidence(l, c_.mask_token_id);
      return std::vector<at::Tensor>{token, conf, ids, probs};
    });
    StepData d;
    d.logits = out.logits;
    if (sampling) {
      d.sp = {out.host[0], out.host[1]};
      d.logits64 = out.host[2];
    } else {
      d.all = to_proposals(out.host[0], out.host[1]);
      d.sp = {out.host[2], out.host[3]};
    }
    return d;
  }

  // Proposals for the logits rows [first, first + n). Greedy proposals come from one call over
  // all rows; sampling draws noise per branch window, in branch order.
  Proposals window_proposals(const StepData& d, int64_t first, int64_t n) {
    if (o_.temperature > 0) {
      return sample_proposals(d.logits64.narrow(0, first, n), c_.mask_token_id, o_.temperature, generator_);
    }
    Proposals p;
    p.token.assign(d.all.token.begin() + first, d.all.token.begin() + first + n);
    p.conf.assign(d.all.conf.begin() + first, d.all.conf.begin() + first + n);
    return p;
  }

  // What every forward does for a branch it covered: record the sparse probabilities of its
  // `n_probs` logits rows from `row` (positions from first_pos), then commit inside its window
  // from the logits rows starting at window_row.
  int64_t absorb(Branch& b, const StepData& d, int64_t row, int64_t first_pos, int64_t n_probs, int64_t window_row) {
    record_probs(b, d.sp.ids.const_data_ptr<int64_t>() + row * max_k_,
                 d.sp.probs.const_data_ptr<double>() + row * max_k_, n_probs, first_pos);
    const Proposals p = window_proposals(d, window_row, b.end - b.start);
    return commit_window(b, p.token.data(), p.conf.data());
  }

  // Init (batch-1 forward, KV copied to every row) or refresh (one forward over `rows`).
  void full_forward(const std::vector<Branch*>& rows, bool init) {
    PackedQueries q;
    const int64_t G = o_.gen_length;
    if (init) {
      q.add_row(canvas_[0].data(), 0, L_, 0);
      for (int64_t p = lp_; p < L_; ++p) q.logit_index.push_back(p);
    } else {
      for (size_t i = 0; i < rows.size(); ++i) {
        q.add_row(canvas_[rows[i]->row].data(), 0, L_, rows[i]->row);
        for (int64_t p = lp_; p < L_; ++p) q.logit_index.push_back(static_cast<int64_t>(i) * L_ + p);
      }
    }
    const StepData d = forward(q, KvMode::kFull);  // logits [rows * G, vocab] (one row at init)
    if (init) {
      for (int64_t r = 1; r < kv_.size(0); ++r) kv_.select(0, r).copy_(kv_.select(0, 0));
      stats_.nfe_init += 1;
    } else {
      stats_.nfe_refresh += 1;
    }
    int64_t total = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      Branch& b = *rows[i];
      const int64_t base = init ? 0 : static_cast<int64_t>(i) * G;  // this row's logits
      (init ? b.nfe_init : b.nfe_refresh) += 1;
      b.blocks_since_refresh = 0;
      b.needs_refresh = false;
      total += absorb(b, d, base, lp_, G, base + b.start - lp_);
    }
    stats_.steps.push_back({total, q.size()});
  }

  // Batched block denoise: every active branch whose window has masks; dual-cache semantics.
  void block_step() {
    std::vector<Branch*> rows;
    PackedQueries q;
    for (auto& b : branches_) {
      if (!b.done && has_masks(b)) {
        rows.push_back(&b);
        q.add_row(canvas_[b.row].data(), b.start, b.end, b.row);
      }
    }
    if (rows.empty()) return;
    const StepData d = forward(q, KvMode::kDual);
    stats_.nfe_block += 1;
    int64_t total = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      Branch& b = *rows[i];
      const int64_t base = q.cu_seqlens[i], n = b.end - b.start;
      b.nfe_block += 1;
      total += absorb(b, d, base, b.start, n, base);
      if (o_.stop_on_eos && !has_masks(b)) {
        const auto& x = canvas_[b.row];
        auto eos = std::find(x.begin() + b.start, x.begin() + b.end, c_.eos_token_id);
        if (eos != x.begin() + b.end) {
          const int64_t first = eos - x.begin() - b.start;
          // Rare (once per branch): the one extra device-to-host copy of a step.
          at::Tensor probs = at::softmax(d.logits.select(0, base + first).to(at::kDouble), -1).cpu();
          b.eos_ready = true;
          b.eos_prob = probs.const_data_ptr<double>()[c_.eos_token_id];
        }
      }
    }
    stats_.steps.push_back({total, q.size()});
  }

  Branch& leader() {  // most decoded, done branches included; the smallest block size on ties
    Branch* best = &branches_[0];
    for (auto& b : branches_) {
      if (b.decoded > best->decoded) best = &b;
    }
    return *best;
  }

  bool compatible(const Branch& dst, const Branch& src) const {
    const auto &a = canvas_[dst.row], &s = canvas_[src.row];
    for (int64_t p = lp_; p < L_; ++p) {
      if (a[p] != c_.mask_token_id && s[p] != c_.mask_token_id && a[p] != s[p]) return false;
    }
    return true;
  }

  static double prob_of(const std::vector<std::pair<int64_t, double>>& entry, int64_t token) {
    for (const auto& [t, p] : entry) {
      if (t == token) return p;
    }
    return 0.0;
  }

  // Confidence-gated merging: destinations by window end, descending (stable: ties keep
  // ascending block size); sources are the compatible branches after each destination.
  void merge_step() {
    std::vector<Branch*> order = active();
    std::stable_sort(order.begin(), order.end(), [](const Branch* a, const Branch* b) { return a->end > b->end; });
    for (size_t i = 0; i < order.size(); ++i) {
      Branch& dst = *order[i];
      std::vector<Branch*> sources;
      for (size_t j = i + 1; j < order.size(); ++j) {
        if (compatible(dst, *order[j])) sources.push_back(order[j]);
      }
      std::set<int64_t> seen;
      int64_t filled = 0;
      auto& x = canvas_[dst.row];
      for (Branch* src : sources) {
        for (int64_t pos = src->start; pos < src->end; ++pos) {
          if (!seen.insert(pos).second) continue;
          const auto& entry = dst.prob_map[pos - lp_];
          if (x[pos] != c_.mask_token_id || entry.empty()) continue;
          int64_t best_tok = c_.mask_token_id;
          double best_p = 0.0;
          for (Branch* s : sources) {
            const int64_t tok = canvas_[s->row][pos];
            if (tok == c_.mask_token_id) continue;
            const double p = prob_of(entry, tok);
            if (p > best_p) {
              best_tok = tok;
              best_p = p;
            }
          }
          if (best_p > o_.merge_gate && best_tok != c_.mask_token_id) {
            x[pos] = best_tok;
            ++filled;
          }
        }
      }
      dst.stats.merged += filled;
      if (filled && !dst.done && !has_masks(dst)) advance(dst);
    }
  }

  // Leader sync: lagging branches copy the leader's canvas and KV row, then re-snap their
  // window with their own block size (their probability maps and refresh counters stay).
  void sync_step() {
    Branch& lead = leader();
    for (auto& b : branches_) {
      if (&b == &lead || b.done || lead.decoded - b.decoded <= o_.sync_gap) continue;
      canvas_[b.row] = canvas_[lead.row];
      kv_.select(0, b.row).copy_(kv_.select(0, lead.row));
      b.stats.copied += std::max<int64_t>(lead.decoded - b.decoded, 0);
      b.decoded = lead.decoded;
      b.done = lead.done;
      snap_window(b);
    }
  }

  // Divergence trigger: per layer and K/V, unit-normalise each active row's flattened tensor;
  // refresh when some row's mean squared distance to the mean exceeds 2 (1 - |mean|^2).
  bool diverged() {
    std::vector<int64_t> rows;
    for (auto& b : branches_) {
      if (!b.done) rows.push_back(b.row);
    }
    if (rows.size() < 2) return false;
    at::Tensor index = at::tensor(rows, at::kLong).to(kv_.device());
    at::Tensor x = kv_.index_select(0, index).reshape({static_cast<int64_t>(rows.size()), c_.n_layers * 2, -1});
    x = x.to(at::kDouble);
    x = x / x.norm(2, {-1}, true).clamp_min(1e-30);
    at::Tensor mu = x.mean(0);
    at::Tensor dist = (x - mu).pow(2).sum(-1).mean(-1);
    at::Tensor rho2 = (1 - mu.pow(2).sum(-1)).mean();
    // Identical rows (right after a sync) give dist = 0 and rho2 = +-1e-16 of rounding: never
    // refresh on rounding noise (same rule as the reference).
    return (dist > rho2.clamp_min(0) * 2).any().item<bool>() && dist.max().item<double>() > 1e-9;
  }

  void refresh_step() {
    std::vector<Branch*> rows = active();
    if (rows.empty()) return;
    bool wanted = false;
    if (o_.refresh_mode == RefreshMode::kDivergence) {
      wanted = o_.refresh_tokens > 0 && diverged();
    } else {
      for (Branch* b : rows) wanted = wanted || b->needs_refresh;
    }
    if (wanted) full_forward(rows, /*init=*/false);
  }

  // Steps 3-6 of an iteration: advance, merge, sync, refresh.
  void coordinate() {
    for (auto& b : branches_) {
      if (!b.done && !has_masks(b)) advance(b);
    }
    if (leader().decoded > 0) {
      if (o_.merge) merge_step();
      if (o_.sync) sync_step();
    }
    refresh_step();
  }

  const Model& model_;
  const DecodeOptions& o_;
  const ModelConfig& c_;
  const int64_t lp_, L_;
  at::Generator generator_;
  StepRunner runner_;  // before kv_: the request's device work runs on the runner's stream
  int64_t max_k_ = 0;
  std::vector<Branch> branches_;
  std::vector<std::vector<int64_t>> canvas_;
  at::Tensor kv_;
  DecodeStats stats_;
};

}  // namespace

DecodeResult decode_blockbatch(const Model& model, const std::vector<int64_t>& prompt, const DecodeOptions& o) {
  return BlockBatchDecoder(model, prompt, o).run();
}

}  // namespace blockbatch
