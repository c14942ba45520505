// Policy 'window': Window-Diffusion (arXiv 2601.20332, ALGORITHMS.md 13) as step machines
// (decode/decoder.h), one per family row: the authors' LLaDA `generate` (CanvasWindow) and their Dream
// `nearest_sample_fast_v2_cache` (PrefixSpanWindow). The python twin is reference/window.py.
//
// LLaDA (CanvasWindow). A decode runs in phases of refresh_interval steps. A phase's first step is a full forward over
// the whole canvas that writes every position's K/V and commits like LLaDA's vanilla decoder; right after its commit
// the phase's key window is fixed: every non-mask position (prompt included) plus the first window_tokens masks. The
// other steps of the phase are pruned: only the active positions (the first active_tokens masks, plus the positions the
// phase's full step committed for the first pruned step, then the positions its pruned steps committed) run through the
// layers, each writing its own K/V into the cache before the layer's attention (KvMode::kDual) and attending the window
// (a gathered key list, PackedQueries::add_keys). Every step commits LLaDA's fixed per-step count over the whole
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
#include <ATen/ops/div.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/full.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/topk.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <iterator>
#include <limits>
#include <string>

#include "decode/logprobs.h"
#include "decode/policies/host_canvas.h"
#include "decode/policies/policy.h"
#include "kernels/cpu/commit_rules.h"

namespace blockbatch {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int64_t steps_of(const DecodeOptions& o) { return o.steps.value_or(o.gen_length); }

// The largest count of LLaDA's schedule over the generation: ceil(gen_length / steps).
int64_t max_count(const DecodeOptions& o) {
  const int64_t s = steps_of(o);
  return (o.gen_length + s - 1) / s;
}

class CanvasWindow final : public Decoder {
 public:
  CanvasWindow(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o, const Stop& stop,
               KvRows kv)
      : c_(model.config()), o_(o), stop_(stop), lp_(static_cast<int64_t>(prompt.size())), L_(lp_ + o.gen_length),
        schedule_(fixed_schedule(o.gen_length, steps_of(o))),
        generator_(at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(o.seed))),
        logprobs_(o.logprobs, L_, model.device()) {
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
    return host_canvas_tokens(p, buffer);
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
    const std::vector<int64_t> before = logprobs_.held(x_, pos);
    for (int64_t r = 0; r < count; ++r) {
      const int64_t q = pos[ip[r]];
      x_[q] = t[ip[r]];
      chosen.push_back(q);
      committed += t[ip[r]] != mask;
    }
    logprobs_.record(pos, l, before, logprobs_.held(x_, pos));  // output j is position pos[j]
    std::sort(chosen.begin(), chosen.end());
    if (full_) {
      st_.nfe_full += 1;
      // The phase's window: every non-mask position plus the first window_tokens masks.
      window_.clear();
      int64_t seen = 0;
      for (int64_t q = 0; q < L_; ++q) {
        if (x_[q] != mask) {
          window_.push_back(q);
        } else if (seen++ < o_.window_tokens.value()) {
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
    st_.steps.push_back({committed, n, p.q.key_tokens(p.mode, L_)});
    st_.branches[0].committed += committed;
    ++step_;
  }

  at::Tensor logprob_rows(int64_t from, int64_t count) const override { return logprobs_.rows(lp_ + from, count); }

  DecodeResult finish() override {
    DecodeResult res;
    res.logprobs = logprobs_.rows(lp_, o_.gen_length);
    res.tokens = x_;
    st_.nfe_paper = st_.nfe;
    st_.branches[0].forwards = st_.nfe;
    res.stats = std::move(st_);
    return res;
  }

 private:
  const ModelConfig& c_;
  const DecodeOptions o_;
  const Stop& stop_;
  const int64_t lp_, L_;
  const std::vector<int64_t> schedule_;
  at::Generator generator_;
  std::vector<int64_t> x_;
  LogprobRecord logprobs_;
  std::vector<int64_t> window_, active_;  // ascending canvas positions
  std::vector<int64_t> phase_commits_, pruned_commits_;
  int64_t step_ = 0;
  bool full_ = false;
  DecodeStats st_;
};

// Dream (PrefixSpanWindow), the authors' nearest_sample_fast_v2_cache. Dream reads canvas position p
// from output p - 1 (a forward's first output keeps its own row). Steps run in phases of
// refresh_interval:
// - a full step (a phase's first; every step once early_stop has cut the canvas) forwards the canvas
//   prefix [0, K), K = decoded positions + min(window_tokens, masks) (everything after dropped), with
//   full attention, writing its K/V; it fixes the active span [s, e): s the first mask, e the
//   position of the (active_tokens + 1)-th mask (the canvas end if fewer); it commits exactly one
//   token, Dream's proposal for position s (every span mask's proposal is drawn, as theirs);
// - a pruned step forwards the span (slide_window: e recomputed from the masks, s frozen), writes its
//   K/V and attends the cache rows [0, K) (kv_lens), committing int(masks * (1 - t[i+1] / t[i]))
//   (float32, Dream's timesteps; every mask at the last step; one with early_stop) of the span's
//   masks, ranked by minus the entropy of the filtered distribution (at::topk over the span, -inf
//   where no mask) or drawn from softmax(confidence / alg_temp);
// - early_stop: after a pruned step's commit the canvas is cut after its first EOS (the checkpoint's
//   id) and every later step is a full one.
// The decode ends after `steps` steps or when no mask is left. A span past the kept prefix or a count
// above the span's masks (where the authors' code reads unwritten cache rows or re-masks decoded
// tokens) ends the request as refused, naming the option to change.
class PrefixSpanWindow final : public Decoder {
 public:
  PrefixSpanWindow(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o, const Stop& stop,
                   KvRows kv)
      : model_(model), c_(model.config()), o_(o), stop_(stop), lp_(static_cast<int64_t>(prompt.size())),
        L_(lp_ + o.gen_length), steps_(steps_of(o)), limit_(c_.proposal_limit()),
        timesteps_(host::timesteps(o.eps, steps_)),
        generator_(at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(o.seed))),
        logprobs_(o.logprobs, L_, model.device()) {
    x_ = prompt;
    x_.resize(L_, c_.mask_token_id);
    n_ = L_;
    masks_ = o.gen_length;
    kv_ = kv.defined() ? std::move(kv) : KvRows{model.new_kv(1, L_), {}};
    st_.branches.push_back(BranchStats{0});
  }

  bool done() const override { return step_ >= steps_ || masks_ == 0; }

  StepPlan plan() override {
    stop_.check(st_.nfe, x_);
    const int64_t mask = c_.mask_token_id;
    StepPlan p;
    full_ = step_ % o_.refresh_interval == 0 || reach_eos_;
    if (full_) {
      K_ = n_ - masks_ + std::min(o_.window_tokens.value(), masks_);
      s_ = std::find(x_.begin(), x_.begin() + n_, mask) - x_.begin();
      e_ = span_end();
      if (e_ > K_) {
        refuse(ErrorKind::kUnsupported, "active_tokens", "window (dream): at step ", step_, " the active span [", s_,
               ", ", e_, ") passes the kept prefix [0, ", K_,
               "): the authors' full step cannot run it; keep active_tokens <= window_tokens");
      }
      p.q.add_positions(0, K_, 0);
      p.mode = KvMode::kFull;
      p.kind = StepKind::kRefresh;
    } else {
      if (o_.slide_window.value()) {
        e_ = span_end();
        if (e_ > K_) {
          refuse(ErrorKind::kUnsupported, "window_tokens", "window (dream): at step ", step_, " the sliding span [", s_,
                 ", ", e_, ") passes the phase's kept prefix [0, ", K_,
                 "), where the authors' cache holds no K/V; raise window_tokens, or lower active_tokens or "
                 "refresh_interval");
        }
      }
      p.q.add_positions(s_, e_, 0);
      p.q.kv_lens.push_back(K_);
      p.mode = KvMode::kDual;
      p.kind = StepKind::kWindow;
    }
    // The outputs the step reads: the span's masks, shifted by one (the forward's first output keeps its own).
    rows_.clear();
    const int64_t out0 = full_ ? 0 : s_;
    for (int64_t q = s_; q < e_; ++q) {
      if (x_[q] == mask) rows_.push_back(q);
    }
    for (int64_t q : rows_) p.q.logit_index.push_back(std::max<int64_t>(q - 1 - out0, 0));
    if (rows_.empty()) p.q.logit_index.push_back(0);  // nothing to read; the step still runs
    p.extra = x_;
    return p;
  }

  at::Tensor tokens_from(const StepPlan& p, const at::Tensor& buffer) const override {
    return host_canvas_tokens(p, buffer);
  }

  void absorb(const StepPlan& p, const at::Tensor& out, const std::vector<at::Tensor>&) override {
    const int64_t mask = c_.mask_token_id;
    const int64_t n = static_cast<int64_t>(rows_.size());
    int64_t committed = 0;
    // Dream's sample_tokens over the span's masks (drawn even when none is committed, as theirs).
    const host::Proposal prop = host::propose(out.to(at::kFloat).narrow(0, 0, n), Alg::kEntropy, o_.temperature,
                                              generator_, o_.top_p, o_.top_k, limit_);
    const std::vector<int64_t> before = logprobs_.held(x_, rows_);
    if (full_) {
      const at::Tensor x0 = host::to_host({prop.x0})[0];
      x_[s_] = x0.const_data_ptr<int64_t>()[0];
      committed = x_[s_] != mask;
      st_.nfe_full += 1;
    } else {
      const int64_t k =
          o_.early_stop ? 1
                        : host::timestep_count(host::timestep_ratio(timesteps_, step_), step_ == steps_ - 1, masks_);
      st_.nfe_pruned += 1;
      st_.pruned_key_tokens += K_;
      if (k > 0) committed = commit(prop, k);
    }
    logprobs_.record(rows_, out.narrow(0, 0, n), before, logprobs_.held(x_, rows_));  // output j: rows_[j]
    masks_ = std::count(x_.begin(), x_.begin() + n_, mask);
    st_.nfe += 1;
    st_.steps.push_back({committed, p.q.size(), p.q.key_tokens(p.mode, L_)});
    st_.branches[0].committed += committed;
    ++step_;
  }

  at::Tensor logprob_rows(int64_t from, int64_t count) const override { return logprobs_.rows(lp_ + from, count); }

  DecodeResult finish() override {
    // early_stop's cut: the generation ends at its EOS (a cut inside the prompt leaves the prompt as it is)
    std::fill(x_.begin() + std::max(n_, lp_), x_.end(), c_.eos_token_id);
    logprobs_.forget(std::max(n_, lp_), L_ - std::max(n_, lp_));
    DecodeResult res;
    res.logprobs = logprobs_.rows(lp_, o_.gen_length);
    res.tokens = x_;
    st_.nfe_paper = st_.nfe;
    st_.branches[0].forwards = st_.nfe;
    res.stats = std::move(st_);
    return res;
  }

 private:
  // The position of the (active_tokens + 1)-th mask of the canvas, or its end if it has fewer.
  int64_t span_end() const {
    int64_t seen = 0;
    for (int64_t q = 0; q < n_; ++q) {
      if (x_[q] == c_.mask_token_id && seen++ == o_.active_tokens) return q;
    }
    return n_;
  }

  // A pruned step's commit of `k` span masks; returns the tokens written that are not the mask id.
  int64_t commit(const host::Proposal& prop, int64_t k) {
    const int64_t n = static_cast<int64_t>(rows_.size());
    if (k > n) {
      refuse(ErrorKind::kUnsupported, o_.slide_window.value() ? "active_tokens" : "slide_window",
             "window (dream): step ", step_, " commits ", k, " tokens but the active span [", s_, ", ", e_, ") holds ",
             n, " masks (the authors' code would mask decoded tokens again); ",
             o_.slide_window.value() ? "raise active_tokens or steps" : "set slide_window, or raise active_tokens");
    }
    const c10::Device dev = model_.device();
    std::vector<int64_t> rel;
    for (int64_t q : rows_) rel.push_back(q - s_);
    at::Tensor full = at::full({1, e_ - s_}, -std::numeric_limits<float>::infinity(), prop.conf.options());
    full.select(0, 0).index_put_({at::tensor(rel, at::kLong).to(dev)}, prop.conf);
    const at::Tensor picked = o_.alg_temp > 0
                                  ? host::multinomial(at::softmax(at::div(full, o_.alg_temp), -1), k, generator_)
                                  : std::get<1>(at::topk(full, k));
    const std::vector<at::Tensor> host = host::to_host({picked, prop.x0});
    std::vector<int64_t> slot(e_ - s_, -1);  // span offset -> its row among the masks
    for (int64_t j = 0; j < n; ++j) slot[rel[j]] = j;
    int64_t committed = 0;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t at_ = host[0].const_data_ptr<int64_t>()[j];
      TORCH_CHECK(at_ >= 0 && at_ < e_ - s_ && slot[at_] >= 0, "window (dream): internal error: picked span offset ",
                  at_, ", which holds no mask");
      x_[s_ + at_] = host[1].const_data_ptr<int64_t>()[slot[at_]];
      committed += x_[s_ + at_] != c_.mask_token_id;
    }
    if (o_.early_stop) {  // the canvas ends at its first EOS (the prompt's included, as theirs)
      const auto eos = std::find(x_.begin(), x_.begin() + n_, c_.eos_token_id);
      if (eos != x_.begin() + n_) {
        n_ = eos - x_.begin() + 1;
        reach_eos_ = true;
      }
    }
    return committed;
  }

  const Network& model_;
  const ModelConfig& c_;
  const DecodeOptions o_;
  const Stop& stop_;
  const int64_t lp_, L_, steps_, limit_;
  const at::Tensor timesteps_;
  at::Generator generator_;
  std::vector<int64_t> x_, rows_;
  LogprobRecord logprobs_;
  int64_t n_ = 0;                  // the canvas length (early_stop cuts it after the first EOS)
  int64_t masks_ = 0;              // masks in [0, n_)
  int64_t K_ = 0, s_ = 0, e_ = 0;  // the phase's kept prefix [0, K), the active span [s, e)
  int64_t step_ = 0;
  bool full_ = false, reach_eos_ = false;
  DecodeStats st_;
};

// The LLaDA row's own refusals (the authors' generate), `o` resolved for the family.
Refusal llada_refusal(const FamilySpec&, const DecodeOptions& o) {
  if (o.slide_window.value_or(false) || o.early_stop) {
    return {o.slide_window.value_or(false) ? "slide_window" : "early_stop",
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

// The Dream row's own refusals (the authors' nearest_sample_fast_v2_cache), `o` resolved for the family.
Refusal dream_refusal(const FamilySpec& family, const DecodeOptions& o) {
  if (o.alg && *o.alg != Alg::kEntropy) {
    return {"alg", c10::str("policy 'window' on ", family.name,
                            " checkpoints ranks by minus the entropy, as the authors' decoder does whatever its "
                            "alg; leave alg 'entropy' (alg = '",
                            alg_name(*o.alg), "')")};
  }
  if (o.active_tokens > *o.window_tokens && o.gen_length > *o.window_tokens) {
    return {"active_tokens",
            c10::str("active_tokens = ", o.active_tokens, " exceeds window_tokens = ", *o.window_tokens,
                     ": the active span would pass the kept prefix of a full step (the authors' code cannot run "
                     "it); keep active_tokens <= window_tokens")};
  }
  return {};
}

// The window policy's rules for one family: a family without a row is refused by the policy.
struct WindowRules {
  const char* family;
  bool samplers;  // Dream's sampler options (alg_temp, eps, top_p, top_k) apply
  Refusal (*refusal)(const FamilySpec& family, const DecodeOptions& o);  // the row's own option rules
  std::unique_ptr<Decoder> (*make)(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o,
                                   const Stop& stop, KvRows kv);
};

template <typename D>
std::unique_ptr<Decoder> make_as(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o,
                                 const Stop& stop, KvRows kv) {
  return std::make_unique<D>(model, prompt, o, stop, std::move(kv));
}

const std::vector<WindowRules> kRules{
    {"llada", /*samplers=*/false, llada_refusal, make_as<CanvasWindow>},
    {"dream", /*samplers=*/true, dream_refusal, make_as<PrefixSpanWindow>},
};

std::unique_ptr<Decoder> make(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o,
                              const Stop& stop, KvRows kv) {
  const WindowRules* r = family_row(kRules, family_spec(model.config().family));
  TORCH_CHECK(r != nullptr, "policy 'window' has no rules for ", family_spec(model.config().family).name,
              " checkpoints (refused at admission)");
  return r->make(model, prompt, o, stop, std::move(kv));
}

std::string family_refusal(const FamilySpec& f) {
  if (f.attention == AttentionPattern::kBlockCausal) {
    return c10::str("is not defined on ", f.name,
                    " checkpoints (block-causal attention: Window-Diffusion prunes bidirectional forwards)");
  }
  if (family_row(kRules, f) == nullptr) return c10::str("has no rules for ", f.name, " checkpoints");
  return "";
}

Refusal option_refusal(const FamilySpec* family, const DecodeOptions& options) {
  const WindowRules* row = family != nullptr ? family_row(kRules, *family) : nullptr;
  // The family's defaults where the request leaves an option to them (window_tokens, slide_window).
  const DecodeOptions o = family != nullptr ? options.resolved(family->name) : options;
  if (Refusal why = bidirectional_refusal(family, row != nullptr && row->samplers, o)) return why;
  if (steps_of(o) < 1) {
    return {"steps", c10::str("steps must be None (gen_length) or an integer in [1, gen_length = ", o.gen_length,
                              "] for policy 'window', got ", steps_of(o))};
  }
  if (o.factor) {
    return {"factor", "policy 'window' commits by its own schedule (steps); leave factor None"};
  }
  if (o.stop_on_eos.value_or(false)) {
    return {"stop_on_eos", "policy 'window' runs its steps to the end, as the authors' decoders do; leave "
                           "stop_on_eos false (the text is cut at the first EOS either way; on Dream checkpoints "
                           "early_stop is the authors' own rule)"};
  }
  return row != nullptr ? row->refusal(*family, o) : Refusal{};
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
                                            .logprobs = true,
                                            .make = make};

}  // namespace blockbatch
