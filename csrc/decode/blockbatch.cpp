// BlockBatch multi-branch consensus decoding (ALGORITHMS.md section 4). The python twin is
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
#include <chrono>
#include <cmath>
#include <cstring>
#include <string>

#include "decode/decode.h"
#include "decode/step.h"
#include "decode/step_runner.h"
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

// Step kinds in the StepRunner shape key.
enum StepKind : int64_t { kInitStep = 10, kBlockStep, kRefreshStep, kCoordinateStep };

class BlockBatchDecoder {
 public:
  BlockBatchDecoder(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o,
                    const Stop& stop)
      : model_(model), o_(o), stop_(stop), c_(model.config()), lp_(static_cast<int64_t>(prompt.size())), G_(o.gen_length),
        L_(lp_ + G_), B_(static_cast<int64_t>(o.block_sizes->size())),
        K_(static_cast<int64_t>(std::floor(1.0 / *o.prob_floor)) + 1),
        generator_(at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(o.seed))),
        runner_(model, o.cuda_graphs), st_(static_cast<size_t>(B_ * br::kFields), 0), eos_(B_, 0.0),
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
    kv_ = model.new_kv(B_, L_);
  }

  DecodeResult run() {
    const auto t0 = std::chrono::steady_clock::now();
    init_step();
    maybe_refresh();
    int64_t winner = -1;
    // Bound: each branch's `decoded` never exceeds G (commits and merges fill masks; a sync
    // copies a row whose leader decoded no more than G minus its masks), every block step with a
    // forward adds at least one to some branch's count (or fails: Stop::no_progress), and a step
    // with no forward leaves every active branch with masks. So at most 2 B G + 2 iterations.
    const int64_t max_iterations = 2 * B_ * G_ + 2;
    for (int64_t iteration = 0; !all_done(); ++iteration) {
      TORCH_CHECK(iteration < max_iterations, "blockbatch: internal error: the decode did not finish within ",
                  max_iterations, " block steps (2 * branches * gen_length + 2); please report it with the options");
      block_step();
      // Early exit: the first EOS-ready branch (smallest block size) within kEosTie of the highest
      // EOS probability (the same rule as the reference's EOS_TIE; docs/ALGORITHMS.md 4.6).
      double best = -1.0;
      for (int64_t b = 0; b < B_; ++b) {
        if (st(b)[br::kEosReady]) best = std::max(best, eos_[b]);
      }
      for (int64_t b = 0; b < B_ && winner < 0; ++b) {
        if (st(b)[br::kEosReady] && eos_[b] >= best - kEosTie) winner = b;
      }
      if (winner >= 0) {
        stats_.early_exit = true;
        break;
      }
      maybe_refresh();
    }
    if (winner < 0) {  // natural exit: most progress, the smallest block size on ties
      for (int64_t b = 0; b < B_; ++b) {
        if (winner < 0 || progress(b) > progress(winner)) winner = b;
      }
    }
    DecodeResult res;
    const at::Tensor tokens = canvas_.select(0, winner).cpu();
    res.tokens.assign(tokens.const_data_ptr<int64_t>(), tokens.const_data_ptr<int64_t>() + L_);
    stats_.nfe = stats_.nfe_init + stats_.nfe_block + stats_.nfe_refresh;
    stats_.nfe_paper = forwards_[winner];
    stats_.winner = winner;
    stats_.winner_block_size = st(winner)[br::kBlock];
    for (int64_t b = 0; b < B_; ++b) {
      BranchStats s;
      s.block_size = st(b)[br::kBlock];
      s.committed = st(b)[br::kCommitted];
      s.merged = st(b)[br::kMerged];
      s.copied = st(b)[br::kCopied];
      s.forwards = forwards_[b];
      stats_.branches.push_back(s);
    }
    stats_.graph_captures = runner_.captures();
    stats_.graph_replays = runner_.replays();
    stats_.wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
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

  void absorb(const at::Tensor& logits, const at::Tensor& spans, const at::Tensor& token, const at::Tensor& conf,
              const at::Tensor& ids, const at::Tensor& probs) {
    ops::bb_absorb_(canvas_, state_, eos_prob_, map_ids_, map_probs_, spans, token, conf, ids, probs, logits, lp_,
                    c_.mask_token_id, c_.eos_token_id, *o_.threshold, *o_.stop_on_eos);
  }

  // One forward over `q` and what follows it on the device: absorb every span (rows of `spans`:
  // branch, logits row, first position, rows, full) and, unless it is a refresh, coordinate.
  // Greedy: one device program and one readback. Sampling: the float64 logits come back, the
  // host draws each span's proposals in span order, and the spans are absorbed one by one.
  void forward_step(const PackedQueries& q, KvMode mode, StepKind kind, const std::vector<int64_t>& spans) {
    const int64_t S = static_cast<int64_t>(spans.size()) / br::kSpanFields;
    std::vector<int64_t> buffer = q.host_buffer(mode);
    const int64_t base = static_cast<int64_t>(buffer.size());
    buffer.insert(buffer.end(), spans.begin(), spans.end());
    const bool sampling = o_.temperature > 0, coord = kind != kRefreshStep;
    const StepRunner::Key key{static_cast<int64_t>(mode), q.size(), q.rows(),
                              static_cast<int64_t>(q.logit_index.size()), sampling ? 1 : 0, kind};
    const int64_t before = committed_total();
    stop_.check(stats_.nfe_init + stats_.nfe_block + stats_.nfe_refresh - 1, canvas_);  // this forward is counted
    StepRunner::Output out = runner_.run(buffer, key, [&](const at::Tensor& dev) {
      StepRunner::Body body;
      body.logits = model_.forward(q.batch(dev, kv_, mode, canvas_)).contiguous();
      if (kind == kInitStep) ops::kv_copy_rows_(kv_, sync_src_);  // the batch-1 forward filled row 0
      if (sampling) {
        body.readout = {body.logits.to(at::kDouble)};
        return body;
      }
      auto [token, conf] = ops::confidence(body.logits, c_.mask_token_id);
      auto [ids, probs] = ops::sparse_probs(body.logits, *o_.prob_floor, K_);
      absorb(body.logits, dev.narrow(0, base, S * br::kSpanFields).view({S, br::kSpanFields}), token, conf, ids,
             probs);
      if (coord) coordinate();
      body.readout = status();
      return body;
    });
    if (sampling) {
      const at::Tensor& logits64 = out.host[0];
      const int64_t n = logits64.size(0);
      auto [ids, probs] = ops::sparse_probs(out.logits, *o_.prob_floor, K_);
      for (int64_t i = 0; i < S; ++i) {
        const int64_t* sp = &spans[i * br::kSpanFields];
        const int64_t b = sp[br::kSpanRow], s = st(b)[br::kStart], w = st(b)[br::kEnd] - s;
        const int64_t wrow = sp[br::kSpanLogitRow] + s - sp[br::kSpanFirstPos];
        const Proposals p = sample_proposals(logits64.narrow(0, wrow, w), c_.mask_token_id, o_.temperature, generator_);
        // One buffer per span: its span row, then token and conf (float64 bits) per logits row.
        std::vector<int64_t> host(sp, sp + br::kSpanFields);
        host.resize(br::kSpanFields + 2 * n, 0);
        std::copy(p.token.begin(), p.token.end(), host.begin() + br::kSpanFields + wrow);
        std::memcpy(host.data() + br::kSpanFields + n + wrow, p.conf.data(), sizeof(double) * p.conf.size());
        const at::Tensor dev = at::from_blob(host.data(), {static_cast<int64_t>(host.size())}, at::kLong)
                                   .to(model_.device(), false, /*copy=*/true);
        absorb(out.logits, dev.narrow(0, 0, br::kSpanFields).view({1, br::kSpanFields}),
               dev.narrow(0, br::kSpanFields, n), dev.narrow(0, br::kSpanFields + n, n).view(at::kDouble), ids,
               probs);
      }
      if (coord) coordinate();
      take_status(read_back(status()));
    } else {
      take_status(out.host);
    }
    const int64_t committed = committed_total() - before;
    stats_.steps.push_back({committed, q.size()});
    if (committed == 0 && kind != kRefreshStep) {  // every branch in it commits >= 1 in its window
      std::string what = kind == kInitStep ? "init forward" : "block step over branch windows";
      for (int64_t i = 0; i < S; ++i) {
        const int64_t* sp = &spans[i * br::kSpanFields];
        what += " [" + std::to_string(sp[br::kSpanFirstPos]) + ", " +
                std::to_string(sp[br::kSpanFirstPos] + (kind == kInitStep ? st(sp[br::kSpanRow])[br::kBlock]
                                                                            : sp[br::kSpanRows])) + ")";
        if (kind == kInitStep) break;
      }
      Stop::no_progress(static_cast<int64_t>(stats_.steps.size()) - 1, what);
    }
  }

  // Init (1 NFE): batch-1 full forward over [prompt | masks]; every branch records every
  // position and commits in its first window; then advance / merge / sync / refresh decision.
  void init_step() {
    PackedQueries q;
    q.add_positions(0, L_, 0, 0);
    for (int64_t p = lp_; p < L_; ++p) q.logit_index.push_back(p);
    std::vector<int64_t> spans;
    for (int64_t b = 0; b < B_; ++b) spans.insert(spans.end(), {b, 0, lp_, G_, 1});
    stats_.nfe_init += 1;
    for (int64_t b = 0; b < B_; ++b) forwards_[b] += 1;
    forward_step(q, KvMode::kFull, kInitStep, spans);
  }

  // Batched block denoise (1 NFE): every active branch whose window has masks, dual-cache
  // semantics; then coordinate. With no such branch there is no forward, only the coordination.
  void block_step() {
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
      forward_step(q, KvMode::kDual, kBlockStep, spans);
      return;
    }
    const std::vector<int64_t> buffer{0};  // nothing to send; StepRunner wants a buffer
    const StepRunner::Key key{0, 0, 0, 0, 0, kCoordinateStep};
    take_status(runner_.run(buffer, key, [&](const at::Tensor&) {
                       StepRunner::Body body;
                       coordinate();
                       body.readout = status();
                       return body;
                     }).host);
  }

  // Refresh (1 NFE) when the last coordination asked for it: one full forward over every active
  // row; each row's KV written back to its own row, maps updated, commits in each window.
  void maybe_refresh() {
    if (!flags_h_[br::kRefreshWanted] || all_done()) return;
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
    forward_step(q, KvMode::kFull, kRefreshStep, spans);
  }

  const Network& model_;
  const DecodeOptions& o_;
  const Stop& stop_;
  const ModelConfig& c_;
  const int64_t lp_, G_, L_, B_, K_;
  at::Generator generator_;
  StepRunner runner_;  // before the device tensors: the request's device work runs on its stream
  // Device state (rows = branches by ascending block size; see kernels/branches.h).
  at::Tensor canvas_, state_, eos_prob_, map_ids_, map_probs_, flags_, sync_src_, kv_;
  // Host mirror of the last readback, and the forwards each branch took part in (init, block and
  // refresh: the paper's per-branch NFE).
  std::vector<int64_t> st_;
  std::vector<double> eos_;
  int64_t flags_h_[br::kFlags] = {0, 0};
  std::vector<int64_t> forwards_;
  DecodeStats stats_;
};

}  // namespace

DecodeResult decode_blockbatch(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o,
                               const Stop& stop) {
  return BlockBatchDecoder(model, prompt, o, stop).run();
}

}  // namespace blockbatch
