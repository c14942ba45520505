// Policy 'block': the block-causal families' decoder (LLaDA2.0 / 2.1, the authors' generate; ALGORITHMS.md
// 11) as a step machine (decode/decoder.h). The python twin is reference/llada2.py block_generate with
// cache=True.
//
// Blocks of block_length are aligned at absolute position 0; the block holding the prompt's tail is
// the first one decoded, and the canvas runs to the end of the last block. Attention is block-causal,
// so the K/V of a finished block are final: the exact block cache. A forward's queries run from the
// first position whose K/V are not final yet to the current block's end, each block its own query row
// in dual mode whose keys end at that block's end (a position sees its block and the earlier ones):
// the first forward prefills the prompt's complete blocks, the first forward of a block also writes
// the previous block's final K/V, the others run the current block only. The NFE is the authors'
// count of forwards.
//
// A step reads the current block's logits: argmax and its float32 softmax probability (the mask id
// is not excluded, as in the authors' code; block_rules.h, shared with policy 'wavefront'). LLaDA2.0
// (edit_threshold None): the block's steps follow the schedule of `steps` (block_length // steps
// commits each, the remainder first); a step commits every mask rated > threshold if at least the
// schedule's count are, else the count most confident (at::topk, as the authors' torch.topk).
// LLaDA2.1: a step commits by the same rule with a count of one and, in the same step, replaces every
// generated committed token of the block whose prediction differs with confidence > edit_threshold; a
// block ends on a step that starts without masks and edits nothing, or after max_post_steps mask-free
// steps.
//
// SDAR (the authors' generate.py block_diffusion_generate with their harness's greedy proposal; the python
// twin is reference/sdar.py block_generate, docs/sdar.md): a block runs the schedule of `steps` (not
// capped at gen_length); the option `unmasking` picks a step's commits (dynamic: > threshold if at least
// the schedule's count are, else the top count; static: the top count; sequential: the count leftmost
// masks; entropy_bounded: the k leftmost masks, k the multiples of the block's summed entropy below
// entropy_bound). The top count is at::topk over the block's confidences (-inf off the masks) on the
// host: torch's CPU order on ties, as the authors' torch.topk on CPU; a count above the masks left takes
// decided positions too, rewritten with their argmax (the authors' code). The decode ends at the end of
// a block whose generated part holds EOS. The authors run a block's store forward (its final K/V) and
// the prefill of the prompt's complete blocks as forwards of their own; here both fold into the next
// block's first forward, as for LLaDA2, and the NFE reported is the authors' count: prefill (1 if the
// prompt holds a complete block) + denoising forwards + one store forward per decoded block
// (nfe_prefill, nfe_block, nfe_store).
//
// DUET's prefix K/V sparsity (prefix_kv_budget, ALGORITHMS.md 18.1; the python twin is reference/duet.py):
// a block's first step also captures every layer's queries of the block (ForwardBatch::query_capture);
// from them and the cached prefix keys each layer selects at most prefix_kv_budget prefix positions
// (select_prefix below), and the block's later steps attend, per layer, those keys and the block's own
// (PackedQueries::set_layer_keys). A block whose prefix is shorter than prefix_kv_min_context, or not
// longer than the budget, decodes densely.
//
// DUET's query pruning (query_keep_ratio, ALGORITHMS.md 18.2): a block's later step hands the forward a row_keep
// callback (ForwardBatch::row_keep) that, after query_select_layer, ranks the block's masks by the LM head on that
// layer's hidden state (or reuses the last ranking) and keeps the decided rows and ceil(ratio x masks) masks for
// the deeper layers (query_rows below); a dropped row keeps its previous K/V there and gets uniform logits.
#include <ATen/ops/cdist.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/tensor.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/full.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/where.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>

#include "decode/logprobs.h"
#include "decode/policies/block_rules.h"
#include "decode/policies/policy.h"

namespace blockbatch {

namespace {

// The block policy's rules for one block-causal family: a family without a row is refused by the
// policy (a new block-causal family adds its row here, and the fields its decoder differs by).
struct BlockRules {
  const char* family;
  bool editing;  // LLaDA2.1's token editing (edit_threshold) is defined on its checkpoints
  // SDAR's generate: the option `unmasking` picks a step's commits, `steps` is not capped at gen_length,
  // a top count above the masks left rewrites decided positions, and the NFE counts the prefill and one
  // store forward per block (else LLaDA2.0's threshold rule, its count capped, and the forwards run)
  bool unmasking;
  bool eos_early_stop;  // LLaDA2.0's eos_early_stop under stop_on_eos (else EOS ends a decode at a block's end only)
};

const std::vector<BlockRules> kRules{
    {"llada2", /*editing=*/true, /*unmasking=*/false, /*eos_early_stop=*/true},
    {"sdar", /*editing=*/false, /*unmasking=*/true, /*eos_early_stop=*/false},
};

const BlockRules& rules_of(const ModelConfig& c) {
  const BlockRules* r = family_row(kRules, family_spec(c.family));
  TORCH_CHECK(r != nullptr, "policy 'block' has no rules for ", family_spec(c.family).name,
              " checkpoints (refused at admission)");
  return *r;
}

class BlockDecoder final : public Decoder {
 public:
  BlockDecoder(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o, const Stop& stop,
               KvRows kv)
      : c_(model.config()), rules_(rules_of(c_)), o_(o), stop_(stop), lp_(static_cast<int64_t>(prompt.size())),
        B_(o.block_length), L_(canvas_length(o, lp_)), blocks_(L_ / B_),
        editing_(rules_.editing && o.edit_threshold.has_value()),
        unmasking_(rules_.unmasking ? o.unmasking.value_or(Unmasking::kDynamic) : std::optional<Unmasking>{}),
        threshold_(o.threshold.value_or(std::numeric_limits<double>::infinity())),
        schedule_(editing_ ? std::vector<int64_t>{} : transfer_schedule()),
        // SDAR's ranked rules with a count above one a step may rewrite decided positions of the block.
        rewrites_(unmasking_ && (*unmasking_ == Unmasking::kDynamic || *unmasking_ == Unmasking::kStatic) &&
                  static_cast<int64_t>(schedule_.size()) < B_),
        device_(model.device()), model_(model), logprobs_(o.logprobs, L_, model.device()) {
    x_ = prompt;
    x_.resize(L_, c_.mask_token_id);
    kv_ = kv.defined() ? std::move(kv) : KvRows{model.new_kv(1, L_), {}};
    // A prefix-cache hit: the prompt's first complete blocks already hold their final K/V.
    TORCH_CHECK(kv_.cached % B_ == 0 && kv_.cached <= lp_ / B_ * B_, "block: a prefix hit of ", kv_.cached,
                " positions is not whole complete prompt blocks");
    cached_ = kv_.cached;
    st_.prefix_cache_hit_tokens = cached_;
    st_.branches.push_back(BranchStats{B_});
    block_ = lp_ / B_;
    start_block();
  }

  bool done() const override { return block_ >= blocks_; }

  StepPlan plan() override {
    if (editing_ || rewrites_) {  // the current block's committed tokens may still change: not stable yet
      std::vector<int64_t> stable = x_;
      std::fill(stable.begin() + block_ * B_, stable.begin() + (block_ + 1) * B_, c_.mask_token_id);
      stop_.check(st_.nfe, stable);
    } else {
      stop_.check(st_.nfe, x_);
    }
    const int64_t end = (block_ + 1) * B_;
    StepPlan p;
    p.mode = KvMode::kDual;
    p.kind = cached_ < block_ * B_ ? StepKind::kBlockStart : StepKind::kWindow;
    for (int64_t s = cached_; s < end; s += B_) {  // one query row per block, its keys up to its end
      p.q.add_positions(s, s + B_, 0);
      p.q.kv_lens.push_back(s + B_);
    }
    const int64_t first = p.q.size() - B_;  // the current block's outputs: the last row's
    if (first > 0) {
      for (int64_t i = 0; i < B_; ++i) p.q.logit_index.push_back(first + i);
    }
    const int64_t s = block_ * B_;
    if (step_ == 0 && prefix_sparse(s)) {  // DUET: this dense step yields the block's queries
      p.q.query_capture = at::empty({c_.n_layers, B_, c_.n_heads, c_.head_dim()},
                                    at::TensorOptions().dtype(at::kFloat).device(device_));
    } else if (step_ > 0 && selected_block_ == block_ && p.q.rows() == 1) {
      std::vector<std::vector<int64_t>> keys(selected_.size());
      for (size_t l = 0; l < selected_.size(); ++l) {
        keys[l] = selected_[l];
        for (int64_t i = s; i < end; ++i) keys[l].push_back(i);
      }
      p.q.set_layer_keys(keys);
      st_.prefix_keys_selected += c_.n_layers * static_cast<int64_t>(selected_.front().size());
    }
    pending_.reset();
    if (step_ > 0 && p.q.rows() == 1) {
      query_rows(p.q);
    } else {
      kept_.clear();
    }
    p.extra = x_;
    return p;
  }

  at::Tensor tokens_from(const StepPlan& p, const at::Tensor& buffer) const override {
    return host_canvas_tokens(p, buffer);
  }

  void absorb(const StepPlan& p, const at::Tensor& logits, const std::vector<at::Tensor>&) override {
    st_.nfe += 1;
    cached_ = block_ * B_;           // every block before the current one is final and written now
    if (p.q.row_keep && pending_) {  // the forward's row selection (DUET 18.2)
      kept_ = pending_->kept;
      kept_age_ = pending_->age;
      st_.query_rows_dropped += pending_->dropped;
    }
    pending_.reset();
    if (p.q.query_capture.defined()) select_prefix(p.q.query_capture);
    // The authors' proposals: argmax of the float32 logits (the first index of the maximum), its
    // softmax probability; ids past the tokenizer's are never proposed.
    const block_rules::Proposals proposals = block_rules::proposals(logits, c_.proposal_limit());
    const at::Tensor &conf = proposals.conf, &tok = proposals.token;
    const int64_t s = block_ * B_;
    std::vector<bool> active(B_);
    int64_t masks = 0;
    for (int64_t i = 0; i < B_; ++i) masks += active[i] = x_[s + i] == c_.mask_token_id;
    const int64_t* t = tok.const_data_ptr<int64_t>();
    std::vector<int64_t> chosen;
    if (unmasking_) {
      chosen = unmask(active, conf, schedule_[step_]);
    } else if (masks > 0) {
      chosen = commit_masks(active, conf, editing_ ? 1 : schedule_[step_]);
    }
    // Edits are decided on the block as the step found it, then written with the commits.
    std::vector<int64_t> edits;
    if (editing_) {
      edits = block_rules::edits(active, x_, s, lp_, t, conf.const_data_ptr<float>(),
                                 static_cast<float>(*o_.edit_threshold));
    }
    const std::vector<int64_t> before =
        logprobs_.on() ? std::vector<int64_t>(x_.begin() + s, x_.begin() + s + B_) : std::vector<int64_t>();
    bool eos_committed = false;
    for (int64_t i : chosen) {
      x_[s + i] = t[i];
      eos_committed = eos_committed || t[i] == c_.eos_token_id;
    }
    for (int64_t i : edits) x_[s + i] = t[i];
    if (logprobs_.on()) {  // the block's rows, in its order: commits and edits alike
      std::vector<int64_t> positions(B_);
      for (int64_t i = 0; i < B_; ++i) positions[i] = s + i;
      logprobs_.record(positions, logits, before, std::vector<int64_t>(x_.begin() + s, x_.begin() + s + B_));
    }
    // Masks given a token (a rewritten decided position is no commit).
    const int64_t committed =
        std::count_if(chosen.begin(), chosen.end(), [&](int64_t i) { return active[i] && t[i] != c_.mask_token_id; });
    st_.steps.push_back({committed, p.q.size(), p.q.key_tokens(p.mode, L_)});
    st_.branches[0].committed += committed;
    st_.edits += static_cast<int64_t>(edits.size());
    if (editing_ && masks > 0 && committed == 0) {  // the authors' loop would never end
      stop_.no_progress(static_cast<int64_t>(st_.steps.size()) - 1,
                        "block " + std::to_string(block_) + ": the model proposes the mask id for every mask left");
    }
    ++step_;
    if (editing_) {
      if (masks == 0 && edits.empty()) return end_block();
    } else if (rules_.eos_early_stop && o_.stop_on_eos.value_or(false) && eos_committed && eos_ends_text()) {
      stopped_ = true;
      return end_block();
    }
    advance();
  }

  at::Tensor logprob_rows(int64_t from, int64_t count) const override { return logprobs_.rows(lp_ + from, count); }

  DecodeResult finish() override {
    DecodeResult res;
    res.tokens.assign(x_.begin(), x_.begin() + lp_ + o_.gen_length);
    res.logprobs = logprobs_.rows(lp_, o_.gen_length);
    st_.nfe_block = st_.nfe;
    if (rules_.unmasking) {  // the authors' count: their prefill and store forwards are folded here
      st_.nfe_prefill = lp_ >= B_ ? 1 : 0;
      st_.nfe = st_.nfe_prefill + st_.nfe_block + st_.nfe_store;
    }
    st_.nfe_paper = st_.nfe;
    st_.branches[0].forwards = st_.nfe;
    st_.winner_block_size = B_;
    res.stats = std::move(st_);
    return res;
  }

 private:
  // LLaDA2.0's schedule: `steps` steps of block_length // steps commits, one more for the first
  // block_length % steps (steps capped at gen_length, as the authors' min(steps, gen_length)).
  std::vector<int64_t> transfer_schedule() const {
    const int64_t steps = rules_.unmasking ? o_.steps.value_or(B_) : std::min(o_.steps.value_or(B_), o_.gen_length);
    std::vector<int64_t> out;
    for (int64_t i = 0; i < steps; ++i) out.push_back(B_ / steps + (i < B_ % steps ? 1 : 0));
    return out;
  }

  // The masks to commit: those rated > threshold if at least `at_least` are, else the `at_least`
  // most confident (at::topk over the block, -inf where no mask: the authors' torch.topk order).
  std::vector<int64_t> commit_masks(const std::vector<bool>& active, const at::Tensor& conf, int64_t at_least) const {
    return block_rules::commit_masks(active, conf.const_data_ptr<float>(), static_cast<float>(threshold_), at_least);
  }

  // SDAR's commits (`unmasking`): the block positions a step writes its proposals to, `count` the
  // schedule's share of this step. The ranked rules take at::topk over the whole block (-inf off the
  // masks) on the host, torch's CPU order as the authors' torch.topk: a count above the masks left takes
  // decided positions too.
  std::vector<int64_t> unmask(const std::vector<bool>& active, const at::Tensor& conf, int64_t count) const {
    const float* c = conf.const_data_ptr<float>();
    std::vector<int64_t> masked;
    for (int64_t i = 0; i < B_; ++i) {
      if (active[i]) masked.push_back(i);
    }
    auto top = [&]() {
      std::vector<float> ranked(B_, -std::numeric_limits<float>::infinity());
      for (int64_t i : masked) ranked[i] = c[i];
      const at::Tensor row = at::from_blob(ranked.data(), {B_}, at::kFloat);
      const at::Tensor idx = std::get<1>(at::topk(row, count)).contiguous();
      const int64_t* ip = idx.const_data_ptr<int64_t>();
      return std::vector<int64_t>(ip, ip + idx.numel());
    };
    switch (*unmasking_) {
      case Unmasking::kDynamic: {
        const float threshold = static_cast<float>(threshold_);
        std::vector<int64_t> high;
        for (int64_t i : masked) {
          if (c[i] > threshold) high.push_back(i);
        }
        return static_cast<int64_t>(high.size()) >= count ? high : top();
      }
      case Unmasking::kStatic: return top();
      case Unmasking::kSequential: {
        std::vector<int64_t> out;
        for (int64_t i = masked.front(); i < std::min(masked.front() + count, B_); ++i) out.push_back(i);
        return out;
      }
      case Unmasking::kEntropyBounded: {
        // One entropy for the whole block (every position's q = max(p, 1e-12)); k = how many of its
        // running sums E, 2E, ... (over the masks) are below the bound, in [1, masks]; the k leftmost.
        const at::Tensor q = conf.clamp_min(1e-12);
        const at::Tensor entropy = q.mul(q.log()).sum().neg();
        const at::Tensor sums = at::cumsum(entropy.expand({static_cast<int64_t>(masked.size())}), 0);
        const at::Tensor bound = at::full({}, static_cast<float>(o_.entropy_bound), at::kFloat);
        const int64_t below = sums.lt(bound).sum().item<int64_t>();
        const int64_t k = std::max<int64_t>(1, std::min<int64_t>(below, static_cast<int64_t>(masked.size())));
        return std::vector<int64_t>(masked.begin(), masked.begin() + k);
      }
    }
    return {};
  }

  // DUET: whether block steps starting at prefix length s select prefix keys (the cost gate, and a
  // prefix longer than the budget: a budget covering it selects everything, the dense decode).
  bool prefix_sparse(int64_t s) const {
    return o_.prefix_kv_budget > 0 && s >= o_.prefix_kv_min_context && s > o_.prefix_kv_budget;
  }

  // DUET's selection (ALGORITHMS.md 18.1) for the current block, from its queries q [layers, B, H, hd]
  // (after QK-norm and RoPE) and the cached prefix keys. Candidates: the previous block's selection and
  // the positions final since, else the whole prefix. Per layer: Raw-L1 distances D[h, i, j] from each
  // query head and row to the candidate keys of its KV head; each (head, row) keeps its
  // ceil(budget / (H B)) nearest (ties: the lower position), their union is filled (or cut) to the budget
  // by min_{h,i} D ascending (ties: the lower position); the positions ascending.
  void select_prefix(const at::Tensor& q) {
    const int64_t s = block_ * B_, H = c_.n_heads, Hkv = c_.n_kv_heads, hd = c_.head_dim();
    const int64_t budget = o_.prefix_kv_budget;
    const bool incremental = selected_block_ == block_ - 1 && !selected_.empty();
    std::vector<std::vector<int64_t>> out(c_.n_layers);
    for (int64_t l = 0; l < c_.n_layers; ++l) {
      std::vector<int64_t> cand;
      if (incremental) {
        cand = selected_[l];
        for (int64_t i = s - B_; i < s; ++i) cand.push_back(i);
      } else {
        for (int64_t i = 0; i < s; ++i) cand.push_back(i);
      }
      const int64_t C = static_cast<int64_t>(cand.size());
      if (C <= budget) {
        out[l] = cand;
        continue;
      }
      const at::Tensor idx = at::tensor(cand, at::TensorOptions().dtype(at::kLong)).to(device_);
      // [Hkv, C, hd] candidate keys of this layer (KV row 0), float32
      const at::Tensor k = kv_.layer_rows(l, s).select(0, 0).select(0, 0).index_select(1, idx).to(at::kFloat);
      // [Hkv, (H / Hkv) B, hd]: query head h reads KV head h / (H / Hkv)
      const at::Tensor qg = q.select(0, l).permute({1, 0, 2}).reshape({Hkv, (H / Hkv) * B_, hd});
      const at::Tensor d = at::cdist(qg, k, 1.0).reshape({H * B_, C}).cpu();  // [pairs, C]
      const int64_t local = std::min<int64_t>(C, (budget + H * B_ - 1) / (H * B_));
      const at::Tensor nearest =
          std::get<1>(at::sort(d, /*stable=*/true, /*dim=*/1, /*descending=*/false)).narrow(1, 0, local).contiguous();
      std::vector<char> in_union(C, 0);
      const int64_t* np = nearest.const_data_ptr<int64_t>();
      for (int64_t i = 0; i < nearest.numel(); ++i) in_union[np[i]] = 1;
      const at::Tensor score = std::get<0>(d.min(0)).contiguous();
      const at::Tensor order =
          std::get<1>(at::sort(score, /*stable=*/true, /*dim=*/0, /*descending=*/false)).contiguous();
      const int64_t* op = order.const_data_ptr<int64_t>();
      const int64_t in = std::count(in_union.begin(), in_union.end(), 1);
      std::vector<char> keep(C, 0);
      int64_t taken = 0;
      if (in >= budget) {  // the union's best `budget` by score
        for (int64_t i = 0; i < C && taken < budget; ++i) {
          if (in_union[op[i]]) keep[op[i]] = 1, ++taken;
        }
      } else {  // the union, filled by score
        keep = in_union;
        taken = in;
        for (int64_t i = 0; i < C && taken < budget; ++i) {
          if (!keep[op[i]]) keep[op[i]] = 1, ++taken;
        }
      }
      for (int64_t j = 0; j < C; ++j) {
        if (keep[j]) out[l].push_back(cand[j]);
      }
      std::sort(out[l].begin(), out[l].end());
    }
    selected_ = std::move(out);
    selected_block_ = block_;
  }

  // DUET's query pruning (ALGORITHMS.md 18.2) for a later step of the block (its one query row, the
  // block): dense (kept_ cleared) when the ratio is 1, the prefix is below the cost gate, at most
  // query_dense_masks masks remain or no layer follows the selection layer; else the step prunes its
  // rows after query_select_layer: the decided rows and the reused selection's masks still masked
  // when at least `count` are and it is younger than query_reuse_interval, else a fresh one ranked by
  // the LM head on that layer's residual stream (argmax softmax probability; those > threshold if at
  // least `count` are, else the `count` most confident, at::topk as the reference's torch.topk).
  void query_rows(PackedQueries& q) {
    const int64_t s = block_ * B_;
    std::vector<int64_t> masked, decided;
    for (int64_t i = 0; i < B_; ++i) (x_[s + i] == c_.mask_token_id ? masked : decided).push_back(i);
    const int64_t m = static_cast<int64_t>(masked.size());
    // query_select_layer: the family's default (contract.py by_family) was filled in by admit().
    if (o_.query_keep_ratio >= 1.0 || s < o_.query_min_context || m <= o_.query_dense_masks ||
        o_.query_select_layer.value() >= c_.n_layers - 1) {
      kept_.clear();
      return;
    }
    const int64_t layer = *o_.query_select_layer;
    const int64_t count =
        std::min<int64_t>(m, std::max<int64_t>(1, static_cast<int64_t>(std::ceil(o_.query_keep_ratio * m))));
    q.row_keep_layer = layer;
    q.row_keep = [this, masked, decided, count](const at::Tensor& hidden) {
      std::vector<int64_t> pick;
      const int64_t s = block_ * B_;
      for (int64_t i : kept_) {
        if (x_[s + i] == c_.mask_token_id) pick.push_back(i);
      }
      if (!kept_.empty() && kept_age_ < o_.query_reuse_interval && static_cast<int64_t>(pick.size()) >= count) {
        pending_ = Pending{kept_, kept_age_ + 1, 0};  // reused: its masks still masked
      } else {
        pick.clear();
        const auto opts = at::TensorOptions().dtype(at::kLong);
        const at::Tensor rows = at::tensor(masked, opts).to(hidden.device());
        const at::Tensor p =
            std::get<0>(at::softmax(model_.head(hidden.index_select(0, rows)).to(at::kFloat), -1).max(-1)).cpu();
        const float* pp = p.const_data_ptr<float>();
        const float threshold = static_cast<float>(threshold_);
        std::vector<int64_t> high;
        for (int64_t j = 0; j < static_cast<int64_t>(masked.size()); ++j) {
          if (pp[j] > threshold) high.push_back(masked[j]);
        }
        if (static_cast<int64_t>(high.size()) >= count) {
          pick = high;
        } else {
          const at::Tensor top = std::get<1>(at::topk(p, count)).contiguous();
          const int64_t* tp = top.const_data_ptr<int64_t>();
          for (int64_t j = 0; j < count; ++j) pick.push_back(masked[tp[j]]);
          std::sort(pick.begin(), pick.end());
        }
        pending_ = Pending{pick, 1, 0};
      }
      std::vector<int64_t> keep = decided;
      keep.insert(keep.end(), pick.begin(), pick.end());
      std::sort(keep.begin(), keep.end());
      pending_->dropped = B_ - static_cast<int64_t>(keep.size());
      return at::tensor(keep, at::TensorOptions().dtype(at::kLong)).to(hidden.device());
    };
  }

  // LLaDA2.0's eos_early_stop: the first EOS of the canvas before the block's end has no mask
  // between the prompt and it.
  bool eos_ends_text() const {
    const int64_t end = (block_ + 1) * B_;
    const auto eos = std::find(x_.begin(), x_.begin() + end, c_.eos_token_id);
    if (eos == x_.begin() + end) return false;
    const auto from = x_.begin() + std::min<int64_t>(lp_, eos - x_.begin());
    return std::find(from, eos, c_.mask_token_id) == eos;
  }

  void start_block() {
    step_ = 0;
    post_steps_ = 0;
    advance();
  }

  // To the next step that runs a forward, or past the last block: the checks the authors' loops make
  // before a forward.
  void advance() {
    while (block_ < blocks_) {
      const int64_t s = block_ * B_;
      const bool masks = std::find(x_.begin() + s, x_.begin() + s + B_, c_.mask_token_id) != x_.begin() + s + B_;
      if (!editing_) {
        if (step_ < static_cast<int64_t>(schedule_.size()) && masks) return;
      } else {
        if (!masks) ++post_steps_;
        if (post_steps_ <= o_.max_post_steps) return;
      }
      end_block();
      return;
    }
  }

  // The block is over: the decode ends (the text is complete), or the next block starts.
  void end_block() {
    const int64_t end = (block_ + 1) * B_;
    const auto gen = x_.begin() + std::min(lp_, end), stop = x_.begin() + end;
    const bool eos = std::find(gen, stop, c_.eos_token_id) != stop;
    // SDAR: a block left without masks runs its store forward (counted; folded into the next forward here).
    if (unmasking_ && std::find(x_.begin() + block_ * B_, stop, c_.mask_token_id) == stop) ++st_.nfe_store;
    bool over;
    if (!editing_) {
      over = stopped_ || eos;  // LLaDA2.0 ends at a block holding EOS, stop_on_eos or not
    } else {
      over = o_.stop_on_eos.value_or(false) &&
             block_rules::eos_ends_generation(x_, lp_, end, c_.eos_token_id, c_.mask_token_id);
    }
    block_ = over ? blocks_ : block_ + 1;
    if (!done()) start_block();
  }

  const ModelConfig& c_;
  const BlockRules& rules_;
  const DecodeOptions o_;
  const Stop& stop_;
  const int64_t lp_, B_, L_, blocks_;
  const bool editing_;
  const std::optional<Unmasking> unmasking_;  // SDAR's rule (nullopt: LLaDA2's)
  const double threshold_;
  const std::vector<int64_t> schedule_;
  const bool rewrites_;
  const c10::Device device_;
  const Network& model_;
  std::vector<int64_t> x_;
  LogprobRecord logprobs_;
  // DUET: each layer's selected prefix positions (ascending) and the block they were selected for.
  std::vector<std::vector<int64_t>> selected_;
  int64_t selected_block_ = -1;
  // DUET's query pruning: the last fresh row selection (block offsets of its masks, ascending) and its age
  // in steps; a forward's pruning records its outcome in pending_, which absorb() applies.
  struct Pending {
    std::vector<int64_t> kept;
    int64_t age = 0, dropped = 0;
  };
  std::vector<int64_t> kept_;
  int64_t kept_age_ = 0;
  std::optional<Pending> pending_;
  int64_t block_ = 0, step_ = 0, post_steps_ = 0, cached_ = 0;
  bool stopped_ = false;
  DecodeStats st_;
};

}  // namespace

namespace {

std::unique_ptr<Decoder> make(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o,
                              const Stop& stop, KvRows kv) {
  return std::make_unique<BlockDecoder>(model, prompt, o, stop, std::move(kv));
}

std::string family_refusal(const FamilySpec& f) {
  if (f.attention != AttentionPattern::kBlockCausal) {
    return c10::str("is the decoder of block-causal checkpoints; ", f.name, " checkpoints are bidirectional");
  }
  if (family_row(kRules, f) == nullptr) return c10::str("has no rules for ", f.name, " checkpoints");
  return "";
}

Refusal option_refusal(const FamilySpec* family, const DecodeOptions& o) {
  const BlockRules* rules = family != nullptr ? family_row(kRules, *family) : nullptr;
  if (o.steps && *o.steps < 1) {
    return {"steps",
            c10::str("steps must be None (block_length steps per block) or >= 1 for policy 'block', got ", *o.steps)};
  }
  if (o.factor) return {"factor", "policy 'block' commits by threshold: leave factor None"};
  if (o.temperature != 0) {
    return {"temperature",
            "policy 'block' decodes greedily (the argmax, as the authors' greedy decoders): leave temperature 0"};
  }
  if (o.top_p || o.top_k || o.alg_temp != 0 || (o.alg && *o.alg != Alg::kConfidence)) {
    const char* param = o.top_p ? "top_p" : o.top_k ? "top_k" : o.alg_temp != 0 ? "alg_temp" : "alg";
    return {param,
            "alg / alg_temp / top_p / top_k are samplers of the bidirectional decoders; policy 'block' proposes the "
            "argmax"};
  }
  if (rules != nullptr && !rules->editing && o.edit_threshold) {
    return {"edit_threshold",
            c10::str("edit_threshold: token editing is not defined on ", family->name, " checkpoints")};
  }
  if (rules != nullptr && !rules->unmasking) {
    if (o.unmasking) {
      return {"unmasking", c10::str("unmasking: the unmasking rules are SDAR's; ", family->name,
                                    " checkpoints commit by their own rule (leave unmasking None)")};
    }
    if (o.entropy_bound != DecodeOptions{}.entropy_bound) {
      return {"entropy_bound", c10::str("entropy_bound is read by SDAR's unmasking 'entropy_bounded'; ", family->name,
                                        " checkpoints do not read it (leave it at its default)")};
    }
  }
  if (o.unmasking && *o.unmasking != Unmasking::kEntropyBounded && o.entropy_bound != DecodeOptions{}.entropy_bound) {
    return {"entropy_bound", c10::str("entropy_bound is read by unmasking 'entropy_bounded' only, not '",
                                      unmasking_name(*o.unmasking), "'")};
  }
  if (o.unmasking == Unmasking::kEntropyBounded && o.steps && *o.steps < o.block_length) {
    return {"steps",
            c10::str("unmasking 'entropy_bounded' may commit one token a step: steps must be None or >= block_length (",
                     o.block_length, "), got ", *o.steps,
                     " (with fewer, the authors' loop leaves masks in a block and never stores its K/V)")};
  }
  return {};
}

}  // namespace

namespace pd = policy_defaults;

namespace {
// DUET's steps capture queries into a fresh tensor, vary their key lists and prune rows on the host: eager.
bool graphs(const DecodeOptions& o) { return o.prefix_kv_budget == 0 && o.query_keep_ratio == 1.0; }
}  // namespace

extern const PolicyDescriptor kBlockPolicy{
    .id = Policy::kBlock,
    .family_refusal = family_refusal,
    .option_refusal = option_refusal,
    .kv_rows = pd::one,
    .canvas_unit = pd::block_length,
    .cached_prompt_block = pd::block_length,
    .graphs = graphs,
    .needs_paged_pool = pd::no_option,
    .adapts_to_load = pd::no,
    .at_load = pd::as_is,
    .steps_with_confidence = true,
    .step_kinds = {StepKind::kBlockStart, StepKind::kWindow},
    .stats = {"nfe_block", "edits", "prefix_cache_hit_tokens", "nfe_prefill", "nfe_store"},
    .logprobs = true,
    .make = make};

}  // namespace blockbatch
