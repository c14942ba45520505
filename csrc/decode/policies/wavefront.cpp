// Policy 'wavefront': FlowBlock's gated wavefront decoding (issue 54; ALGORITHMS.md 15) on the block-causal
// families with token editing (LLaDA2.1), as a step machine (decode/decoder.h). The python twin is
// reference/wavefront.py wavefront_generate.
//
// Blocks of block_length are aligned at absolute position 0, as for policy 'block' (block.cpp). A request
// holds a window of 1..max_active_blocks adjacent active blocks after its frozen prefix (the prompt and the
// committed blocks). Each step is ONE forward over every active block: each active block is its own query
// row whose keys end at that block's end (KvMode::kDual writes the rows' K/V before the attention), so
// block i sees the frozen prefix's cached K/V and the active blocks <= i (windowed block-causal attention;
// the frozen K/V are exact, never recomputed). The forward after the oldest block committed also runs that
// block once more (and the first forward the prompt's complete blocks): its final K/V are written then, as
// block.cpp's block starts do, so the prefix holds the K/V of its committed tokens.
//
// In every active block the block policy's commit rule with editing applies (block_rules.h): a step
// commits the masks rated > threshold, at least the most confident one, and replaces every generated
// committed token whose proposal differs with confidence > edit_threshold, decided on the blocks as the
// step found them. The oldest block commits (retires, in order) on a step that began without masks in it
// and edited nothing in it, or before a step once it has begun more than max_post_steps steps without
// masks; then the next one may commit in the same step by the same rule. A block enters at the window's
// end (before a step) when the readiness gate fires on the youngest active block: its decoded fraction of
// generated positions >= spawn_threshold (the better of the two signals measured, docs/bench/wavefront);
// the window never empties while blocks remain. stop_on_eos: the first committed block with EOS in a
// mask-free generation ends the request, as the block policy's (the drafts after it are dropped: masks).
//
// max_active_blocks = 1 is the block policy with editing, step for step (tests/decode/test_wavefront.py).
#include <ATen/TensorOperators.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <limits>
#include <string>

#include "decode/logprobs.h"
#include "decode/policies/block_rules.h"
#include "decode/policies/policy.h"

namespace blockbatch {

namespace {

// The wavefront policy's rules for one family: a family without a row is refused by the policy. It needs
// token editing (the drafts after the oldest block are repaired by edits) and block-causal attention.
struct WavefrontRules {
  const char* family;
};

const std::vector<WavefrontRules> kRules{
    {"llada2"},  // LLaDA2.1's editing on block-causal LLaDA2 checkpoints
};

class WavefrontDecoder final : public Decoder {
 public:
  WavefrontDecoder(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o, const Stop& stop,
                   KvRows kv)
      : c_(model.config()), o_(o), stop_(stop), lp_(static_cast<int64_t>(prompt.size())), B_(o.block_length),
        L_(canvas_length(o, lp_)), blocks_(L_ / B_),
        threshold_(static_cast<float>(o.threshold.value_or(std::numeric_limits<double>::infinity()))),
        edit_threshold_(static_cast<float>(o.edit_threshold.value())), post_(blocks_, 0), stale_(L_, false),
        logprobs_(o.logprobs, L_, model.device()) {
    x_ = prompt;
    x_.resize(L_, c_.mask_token_id);
    kv_ = kv.defined() ? std::move(kv) : KvRows{model.new_kv(1, L_), {}};
    // A prefix-cache hit: the prompt's first complete blocks already hold their final K/V.
    TORCH_CHECK(kv_.cached % B_ == 0 && kv_.cached <= lp_ / B_ * B_, "wavefront: a prefix hit of ", kv_.cached,
                " positions is not whole complete prompt blocks");
    cached_ = kv_.cached;
    st_.prefix_cache_hit_tokens = cached_;
    st_.branches.push_back(BranchStats{B_});
    first_ = lp_ / B_;
    end_ = first_ + 1;
    advance();
  }

  bool done() const override { return first_ >= blocks_; }

  StepPlan plan() override {
    // The active blocks may still change: what can no longer change ends at the oldest one.
    std::vector<int64_t> stable = x_;
    std::fill(stable.begin() + first_ * B_, stable.begin() + end_ * B_, c_.mask_token_id);
    stop_.check(st_.nfe, stable);
    StepPlan p;
    p.mode = KvMode::kDual;
    p.kind = cached_ < first_ * B_ ? StepKind::kBlockStart : StepKind::kWindow;
    for (int64_t s = cached_; s < end_ * B_; s += B_) {  // one query row per block, its keys up to its end
      p.q.add_positions(s, s + B_, 0);
      p.q.kv_lens.push_back(s + B_);
    }
    const int64_t from = first_ * B_ - cached_;  // the active blocks' outputs: the last rows'
    if (from > 0) {
      for (int64_t i = from; i < p.q.size(); ++i) p.q.logit_index.push_back(i);
    }
    p.extra = x_;
    return p;
  }

  at::Tensor tokens_from(const StepPlan& p, const at::Tensor& buffer) const override {
    return host_canvas_tokens(p, buffer);
  }

  void absorb(const StepPlan& p, const at::Tensor& logits, const std::vector<at::Tensor>&) override {
    st_.nfe += 1;
    cached_ = first_ * B_;  // every block before the oldest active one is final and written now
    const int64_t window = end_ - first_;
    st_.blocks_in_flight += window;
    st_.max_blocks_in_flight = std::max(st_.max_blocks_in_flight, window);
    const block_rules::Proposals proposals = block_rules::proposals(logits, c_.proposal_limit());
    const int64_t* t = proposals.token.const_data_ptr<int64_t>();
    const float* conf = proposals.conf.const_data_ptr<float>();
    // Every active block's commits and edits, decided on the canvas as the step found it.
    std::vector<std::vector<int64_t>> chosen(window), edits(window);
    std::vector<bool> settled(window);  // began the step without masks, edited nothing
    int64_t committed = 0;
    for (int64_t k = 0; k < window; ++k) {
      const int64_t s = (first_ + k) * B_;
      std::vector<bool> active(B_);
      int64_t masks = 0;
      for (int64_t i = 0; i < B_; ++i) masks += active[i] = x_[s + i] == c_.mask_token_id;
      if (masks > 0) chosen[k] = block_rules::commit_masks(active, conf + k * B_, threshold_, 1);
      edits[k] = block_rules::edits(active, x_, s, lp_, t + k * B_, conf + k * B_, edit_threshold_);
      const int64_t given = std::count_if(chosen[k].begin(), chosen[k].end(),
                                          [&](int64_t i) { return t[k * B_ + i] != c_.mask_token_id; });
      if (masks > 0 && given == 0) {  // the loop would never end
        stop_.no_progress(
            static_cast<int64_t>(st_.steps.size()),
            "block " + std::to_string(first_ + k) + ": the model proposes the mask id for every mask left");
      }
      committed += given;
      settled[k] = masks == 0 && edits[k].empty();
    }
    std::vector<int64_t> positions;  // the active blocks', the logits rows' order
    if (logprobs_.on()) {
      for (int64_t q = first_ * B_; q < end_ * B_; ++q) positions.push_back(q);
    }
    const std::vector<int64_t> before = logprobs_.held(x_, positions);
    for (int64_t k = 0; k < window; ++k) {
      const int64_t s = (first_ + k) * B_;
      const bool stale = k > 0;  // drafted while an older block is still in flight
      for (int64_t i : chosen[k]) {
        x_[s + i] = t[k * B_ + i];
        stale_[s + i] = stale;
      }
      for (int64_t i : edits[k]) {
        st_.redrafted_tokens += stale_[s + i] ? 1 : 0;
        x_[s + i] = t[k * B_ + i];
        stale_[s + i] = stale;
      }
      st_.edits += static_cast<int64_t>(edits[k].size());
    }
    logprobs_.record(positions, logits, before, logprobs_.held(x_, positions));
    st_.steps.push_back({committed, p.q.size(), p.q.key_tokens(p.mode, L_), window});
    st_.branches[0].committed += committed;
    // The oldest blocks that settled commit, in order.
    const int64_t oldest = first_;
    while (!done() && first_ < oldest + window && settled[first_ - oldest]) retire();
    advance();
  }

  at::Tensor logprob_rows(int64_t from, int64_t count) const override { return logprobs_.rows(lp_ + from, count); }

  DecodeResult finish() override {
    DecodeResult res;
    res.tokens.assign(x_.begin(), x_.begin() + lp_ + o_.gen_length);
    res.logprobs = logprobs_.rows(lp_, o_.gen_length);
    st_.nfe_block = st_.nfe;
    st_.nfe_paper = st_.nfe;
    st_.branches[0].forwards = st_.nfe;
    st_.winner_block_size = B_;
    res.stats = std::move(st_);
    return res;
  }

 private:
  bool has_mask(int64_t block) const {
    const auto from = x_.begin() + block * B_;
    return std::find(from, from + B_, c_.mask_token_id) != from + B_;
  }

  // The readiness gate on the youngest active block: the decoded fraction of its generated positions.
  bool ready() const {
    const int64_t s = (end_ - 1) * B_, from = std::max(s, lp_);
    const int64_t decoded =
        std::count_if(x_.begin() + from, x_.begin() + s + B_, [&](int64_t v) { return v != c_.mask_token_id; });
    return static_cast<double>(decoded) >= o_.spawn_threshold * static_cast<double>(s + B_ - from);
  }

  // Before a step: the post steps of the mask-free active blocks, the oldest blocks that spent them
  // commit, and the window grows while the gate fires.
  void advance() {
    if (done()) return;
    for (int64_t b = first_; b < end_; ++b) {
      if (!has_mask(b)) ++post_[b];
    }
    while (!done() && post_[first_] > o_.max_post_steps) retire();
    while (!done() && end_ - first_ < o_.max_active_blocks && end_ < blocks_ && ready()) ++end_;
  }

  // The oldest active block commits: the request ends there (stop_on_eos, EOS in a mask-free
  // generation), or the window moves on (a new block enters when it would be empty).
  void retire() {
    const int64_t end = (first_ + 1) * B_;
    if (o_.stop_on_eos.value_or(false) &&
        block_rules::eos_ends_generation(x_, lp_, end, c_.eos_token_id, c_.mask_token_id)) {
      std::fill(x_.begin() + end, x_.end(), c_.mask_token_id);  // the drafts after it are not committed
      logprobs_.forget(end, L_ - end);
      first_ = end_ = blocks_;
      return;
    }
    ++first_;
    if (first_ == end_ && first_ < blocks_) ++end_;
  }

  const ModelConfig& c_;
  const DecodeOptions o_;
  const Stop& stop_;
  const int64_t lp_, B_, L_, blocks_;
  const float threshold_, edit_threshold_;
  std::vector<int64_t> x_;
  std::vector<int64_t> post_;  // per block: steps it began without masks
  std::vector<bool> stale_;    // per position: its token was written while an older block was in flight
  LogprobRecord logprobs_;
  int64_t first_ = 0, end_ = 0, cached_ = 0;  // the window: blocks [first_, end_)
  DecodeStats st_;
};

std::unique_ptr<Decoder> make(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o,
                              const Stop& stop, KvRows kv) {
  return std::make_unique<WavefrontDecoder>(model, prompt, o, stop, std::move(kv));
}

std::string family_refusal(const FamilySpec& f) {
  if (f.attention != AttentionPattern::kBlockCausal) {
    return c10::str("is the decoder of block-causal checkpoints; ", f.name, " checkpoints are bidirectional");
  }
  if (family_row(kRules, f) == nullptr) {
    return c10::str("has no rules for ", f.name,
                    " checkpoints: it needs token editing (edit_threshold), which they do not define");
  }
  return "";
}

Refusal option_refusal(const FamilySpec* family, const DecodeOptions& o) {
  // Asked once the family is known, so that a family without a row hears that first (family_refusal).
  if (family != nullptr && !o.edit_threshold) {
    return {"edit_threshold",
            "policy 'wavefront' needs edit_threshold (LLaDA2.1's token editing): the blocks after the oldest are "
            "drafts that editing repairs (e.g. edit_threshold=0.5)"};
  }
  if (o.steps && *o.steps < 1) {
    return {"steps", c10::str("steps must be None or >= 1 for policy 'wavefront', got ", *o.steps)};
  }
  if (o.factor) return {"factor", "policy 'wavefront' commits by threshold: leave factor None"};
  if (o.temperature != 0) {
    return {"temperature", "policy 'wavefront' decodes greedily (the argmax, as LLaDA2.1's decoder): leave "
                           "temperature 0"};
  }
  if (o.top_p || o.top_k || o.alg_temp != 0 || (o.alg && *o.alg != Alg::kConfidence)) {
    const char* param = o.top_p ? "top_p" : o.top_k ? "top_k" : o.alg_temp != 0 ? "alg_temp" : "alg";
    return {param,
            "alg / alg_temp / top_p / top_k are samplers of the bidirectional decoders; policy 'wavefront' proposes "
            "the argmax"};
  }
  if (o.unmasking) {
    return {"unmasking", "unmasking: the unmasking rules are SDAR's; policy 'wavefront' commits by LLaDA2.1's rule "
                         "(leave unmasking None)"};
  }
  if (o.entropy_bound != DecodeOptions{}.entropy_bound) {
    return {"entropy_bound", "entropy_bound is read by SDAR's unmasking 'entropy_bounded'; policy 'wavefront' "
                             "does not read it (leave it at its default)"};
  }
  return {};
}

}  // namespace

namespace pd = policy_defaults;

extern const PolicyDescriptor kWavefrontPolicy{
    .id = Policy::kWavefront,
    .family_refusal = family_refusal,
    .option_refusal = option_refusal,
    .kv_rows = pd::one,
    .canvas_unit = pd::block_length,
    .cached_prompt_block = pd::block_length,
    .graphs = pd::yes,
    .needs_paged_pool = pd::no_option,
    .adapts_to_load = pd::no,
    .at_load = pd::as_is,
    .steps_with_confidence = true,
    .step_kinds = {StepKind::kBlockStart, StepKind::kWindow},
    .stats = {"nfe_block", "edits", "prefix_cache_hit_tokens", "blocks_in_flight", "max_blocks_in_flight",
              "redrafted_tokens"},
    .logprobs = true,
    .make = make};

}  // namespace blockbatch
