// Policy 'window': Window-Diffusion (arXiv 2601.20332; the authors' LLaDA `generate`, ALGORITHMS.md 13)
// as a step machine (decode/decoder.h). The python twin is reference/window.py.
//
// A decode runs in phases of refresh_interval steps. A phase's first step is a full forward over the
// whole canvas that writes every position's K/V and commits like LLaDA's vanilla decoder; right after
// its commit the phase's key window is fixed: every non-mask position (prompt included) plus the first
// window_tokens masks. The other steps of the phase are pruned: only the active positions (the first
// active_tokens masks, plus the positions the phase's full step committed for the first pruned step,
// then the positions its pruned steps committed) run through the layers, each writing its own K/V
// into the cache before the layer's attention (KvMode::kDual) and attending the window (a gathered
// key list, PackedQueries::add_keys). Every step commits LLaDA's fixed per-step count over the whole
// generation (`steps` steps, one block) by confidence.
//
// Ties decide tokens: the proposal is the argmax of the logits (first index of the maximum, ids past
// the tokenizer's never; the mask id is not excluded, as in the authors' code; temperature > 0: of
// their Gumbel-perturbed float64 logits, drawn from the seeded host generator), its confidence the
// float32 softmax probability, and the selection at::topk on the host over the vector the authors
// build (the whole canvas at a full step, -inf where no mask; the active positions in ascending order
// at a pruned step), so equal confidences fall as their torch.topk on the CPU.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/topk.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <iterator>
#include <limits>
#include <string>

#include "decode/policies/policy.h"
#include "kernels/cpu/commit_rules.h"

namespace blockbatch {

namespace {

// The window policy's rules for one family: a family without a row is refused by the policy.
struct WindowRules {
  const char* family;
  bool phase_full_canvas;  // LLaDA: a phase's full forward runs the whole canvas and commits by the schedule
};

const std::vector<WindowRules> kRules{
    {"llada", /*phase_full_canvas=*/true},
};

const WindowRules& rules_of(const ModelConfig& c) {
  const WindowRules* r = family_row(kRules, family_spec(c.family));
  TORCH_CHECK(r != nullptr, "policy 'window' has no rules for ", family_spec(c.family).name,
              " checkpoints (refused at admission)");
  return *r;
}

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int64_t steps_of(const DecodeOptions& o) { return o.steps.value_or(o.gen_length); }

// The largest count of LLaDA's schedule over the generation: ceil(gen_length / steps).
int64_t max_count(const DecodeOptions& o) {
  const int64_t s = steps_of(o);
  return (o.gen_length + s - 1) / s;
}

class WindowDecoder final : public Decoder {
 public:
  WindowDecoder(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o, const Stop& stop,
                KvRows kv)
      : c_(model.config()), rules_(rules_of(c_)), o_(o), stop_(stop), lp_(static_cast<int64_t>(prompt.size())),
        L_(lp_ + o.gen_length), schedule_(fixed_schedule(o.gen_length, steps_of(o))),
        generator_(at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(o.seed))) {
    (void)rules_;
    x_ = prompt;
    x_.resize(L_, c_.mask_token_id);
    kv_ = kv.defined() ? std::move(kv) : KvRows{model.new_kv(1, L_), {}};
    st_.branches.push_back(BranchStats{0});
  }

  bool done() const override { return step_ >= static_cast<int64_t>(schedule_.size()); }

  StepPlan plan() override {
    stop_.check(st_.nfe, x_);
    StepPlan p;
    full_ = step_ % o_.refresh_interval == 0;
    if (full_) {  // the phase's full forward: every position, its K/V written into the cache
      p.q.add_positions(0, L_, 0);
      p.mode = KvMode::kFull;
      p.kind = StepKind::kRefresh;
    } else {  // the active positions against the phase's window
      for (int64_t q : active_) {
        p.q.positions.push_back(q);
        p.q.gather.push_back(q);
      }
      p.q.cu_seqlens.push_back(p.q.size());
      p.q.kv_rows.push_back(0);
      p.q.add_keys(window_);
      p.mode = KvMode::kDual;
      p.kind = StepKind::kWindow;
    }
    p.extra = x_;
    return p;
  }

  at::Tensor tokens_from(const StepPlan& p, const at::Tensor& buffer) const override {
    return buffer.narrow(0, p.base, static_cast<int64_t>(p.extra.size()));
  }

  void absorb(const StepPlan& p, const at::Tensor& logits, const std::vector<at::Tensor>&) override {
    const int64_t mask = c_.mask_token_id;
    // The authors' proposals: argmax of the float32 logits (first index of the maximum) among the
    // tokenizer's ids, or with temperature > 0 of their Gumbel-perturbed float64 logits
    // exp(l) / (-log u)^temperature, u one uniform draw per logit of the step's rows from the
    // seeded host generator; the confidence is the float32 softmax probability of the proposal.
    const at::Tensor l = logits.to(at::kFloat);
    at::Tensor x0;
    if (o_.temperature > 0) {
      const at::Tensor l64 = l.to(at::kDouble).cpu();
      const at::Tensor u = at::rand(l64.sizes(), generator_, at::kDouble);
      const at::Tensor score = l64.exp() / (-u.log()).pow(o_.temperature);
      x0 = score.narrow(1, 0, c_.proposal_limit()).argmax(-1).to(l.device());
    } else {
      x0 = l.narrow(1, 0, c_.proposal_limit()).argmax(-1);
    }
    const at::Tensor conf = at::softmax(l, -1).gather(-1, x0.unsqueeze(-1)).squeeze(-1).cpu().contiguous();
    const at::Tensor tok = x0.cpu().contiguous();
    const float* c = conf.const_data_ptr<float>();
    const int64_t* t = tok.const_data_ptr<int64_t>();
    const int64_t n = p.q.size();
    // The row the authors rank: output j is canvas position pos[j] (full: j itself).
    const std::vector<int64_t>& pos = p.q.positions;
    std::vector<float> ranked(n, kNegInf);
    int64_t masks = 0;
    for (int64_t j = 0; j < n; ++j) {
      if (x_[pos[j]] == mask) ranked[j] = c[j], ++masks;
    }
    const int64_t count = schedule_[step_];
    TORCH_CHECK(count <= masks, "window: internal error: step ", step_, " commits ", count, " of ", masks,
                " masks among its positions (refused at admission)");
    const at::Tensor row = at::from_blob(ranked.data(), {n}, at::kFloat);
    const at::Tensor idx = std::get<1>(at::topk(row, count)).contiguous();
    const int64_t* ip = idx.const_data_ptr<int64_t>();
    std::vector<int64_t> chosen;  // canvas positions, in topk's order
    int64_t committed = 0;
    for (int64_t r = 0; r < count; ++r) {
      const int64_t q = pos[ip[r]];
      x_[q] = t[ip[r]];
      chosen.push_back(q);
      committed += t[ip[r]] != mask;
    }
    std::sort(chosen.begin(), chosen.end());
    if (full_) {
      st_.nfe_full += 1;
      // The phase's window: every non-mask position plus the first window_tokens masks.
      window_.clear();
      int64_t seen = 0;
      for (int64_t q = 0; q < L_; ++q) {
        if (x_[q] != mask) {
          window_.push_back(q);
        } else if (seen++ < o_.window_tokens) {
          window_.push_back(q);
        }
      }
      phase_commits_ = chosen;  // the first pruned step computes the full step's commits too
      pruned_commits_.clear();
    } else {
      st_.nfe_pruned += 1;
      st_.pruned_key_tokens += static_cast<int64_t>(window_.size());
      std::vector<int64_t> merged;
      std::set_union(pruned_commits_.begin(), pruned_commits_.end(), chosen.begin(), chosen.end(),
                     std::back_inserter(merged));
      pruned_commits_ = std::move(merged);
      phase_commits_ = pruned_commits_;
    }
    // The next pruned step's active positions: the first active_tokens masks plus the phase's commits.
    active_.clear();
    int64_t seen = 0;
    size_t k = 0;
    for (int64_t q = 0; q < L_; ++q) {
      const bool first_mask = x_[q] == mask && seen++ < o_.active_tokens;
      while (k < phase_commits_.size() && phase_commits_[k] < q) ++k;
      const bool commit = k < phase_commits_.size() && phase_commits_[k] == q;
      if (first_mask || commit) active_.push_back(q);
    }
    st_.nfe += 1;
    st_.steps.push_back({committed, n});
    st_.branches[0].committed += committed;
    ++step_;
  }

  DecodeResult finish() override {
    DecodeResult res;
    res.tokens = x_;
    st_.nfe_paper = st_.nfe;
    st_.branches[0].forwards = st_.nfe;
    res.stats = std::move(st_);
    return res;
  }

 private:
  const ModelConfig& c_;
  const WindowRules& rules_;
  const DecodeOptions o_;
  const Stop& stop_;
  const int64_t lp_, L_;
  const std::vector<int64_t> schedule_;
  at::Generator generator_;
  std::vector<int64_t> x_;
  std::vector<int64_t> window_, active_;  // ascending canvas positions
  std::vector<int64_t> phase_commits_, pruned_commits_;
  int64_t step_ = 0;
  bool full_ = false;
  DecodeStats st_;
};

std::unique_ptr<Decoder> make(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o,
                              const Stop& stop, KvRows kv) {
  return std::make_unique<WindowDecoder>(model, prompt, o, stop, std::move(kv));
}

std::string family_refusal(const FamilySpec& f) {
  if (f.attention == AttentionPattern::kBlockCausal) {
    return c10::str("is not defined on ", f.name,
                    " checkpoints (block-causal attention: Window-Diffusion prunes bidirectional forwards)");
  }
  if (family_row(kRules, f) == nullptr) return c10::str("has no rules for ", f.name, " checkpoints");
  return "";
}

Refusal option_refusal(const FamilySpec* family, const DecodeOptions& o) {
  if (Refusal why = bidirectional_refusal(family, /*samplers=*/false, o)) return why;
  if (steps_of(o) < 1) {
    return {"steps", c10::str("steps must be None (gen_length) or an integer in [1, gen_length = ", o.gen_length,
                              "] for policy 'window', got ", steps_of(o))};
  }
  if (o.factor) {
    return {"factor", "policy 'window' commits LLaDA's fixed per-step counts (steps); leave factor None"};
  }
  if (o.stop_on_eos.value_or(false)) {
    return {"stop_on_eos", "policy 'window' runs its steps to the end, as the authors' decoder does; leave "
                           "stop_on_eos false (the text is cut at the first EOS either way)"};
  }
  if (o.slide_window || o.early_stop) {
    return {o.slide_window ? "slide_window" : "early_stop",
            "slide_window and early_stop are Window-Diffusion's Dream options; leave them false"};
  }
  if (o.active_tokens < max_count(o)) {
    return {"active_tokens",
            c10::str("active_tokens = ", o.active_tokens, " is below the ", max_count(o),
                     " tokens a step commits (gen_length / steps, rounded up): a pruned step would commit "
                     "positions that hold no mask (the authors' code overwrites decoded tokens); raise "
                     "active_tokens or steps")};
  }
  return {};
}

int64_t one_row(const DecodeOptions&) { return 1; }

}  // namespace

namespace pd = policy_defaults;

// window: phases of a full forward then pruned forwards of a few active positions over a key window.
extern const PolicyDescriptor kWindowPolicy{.id = Policy::kWindow,
                                            .family_refusal = family_refusal,
                                            .option_refusal = option_refusal,
                                            .kv_rows = one_row,
                                            .canvas_unit = pd::one,
                                            .cached_prompt_block = pd::none,
                                            .graphs = pd::no,
                                            .needs_paged_pool = pd::no_option,
                                            .adapts_to_load = pd::no,
                                            .at_load = pd::as_is,
                                            .steps_with_confidence = false,
                                            .step_kinds = {StepKind::kRefresh, StepKind::kWindow},
                                            .stats = {"nfe_full", "nfe_pruned", "pruned_key_tokens"},
                                            .make = make};

}  // namespace blockbatch
