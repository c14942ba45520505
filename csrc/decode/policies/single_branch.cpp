// Single-branch policies for every family (ALGORITHMS.md 3, 5.2, 5.3): vanilla, prefix cache, dual
// cache, as a step machine (decode/decoder.h). The python twins are reference/policies.py (the
// device-readout rules) and reference/dream.py (dream_vanilla, dream_cached).
//
// The skeleton, the same for every family: blocks [s, e) left to right; a vanilla step and a cached
// block's first step run the whole canvas (at a cached block start its K/V fill the cache), the
// other steps the window (dual: the block against the whole cached canvas; prefix: block and
// suffix against the frozen prefix [0, s)). The family's row (kRules below) fills in:
//   VanillaSchedule  kBlockFixed: blocks of block_length; kTimestep: one block over the generation
//                    and `steps` forwards, step i committing int(masks * (1 - t[i+1] / t[i]))
//   SeedRule         what a cached block's full forward commits: by the commit rule like any step,
//                    or exactly the block's first mask (its argmax), a window step following always
//   logit_shift      canvas position p reads output p - shift (inside a window: at least output 0)
//   Readout          where the canvas lives and how a step's logits become commits: on the device
//                    (confidence + commit_, one readback of three counts), or on the host (the
//                    proposal and at::topk ranking in the reference's order; host_canvas.h)
// A block ends when it holds no mask, or (kTimestep) after its schedule's last step.
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

#include <algorithm>
#include <limits>
#include <string>

#include "decode/logprobs.h"
#include "decode/policies/host_canvas.h"
#include "decode/policies/policy.h"
#include "kernels/cpu/commit_rules.h"
#include "ops/ops.h"

namespace blockbatch {

namespace {

enum class VanillaSchedule {
  kBlockFixed,  // LLaDA: blocks of block_length, a fixed per-block schedule or a commit rule (section 3)
  kTimestep,    // Dream: no blocks, k = m * (1 - t[i+1] / t[i]) over linspace(1, eps, steps + 1) (5.3)
};

// The single-branch policies' rules for one family (docs/ALGORITHMS.md sections 3 and 5): the
// authors' LLaDA / Fast-dLLM code and the authors' Dream decoders.
struct SingleBranchRules {
  const char* family;
  VanillaSchedule vanilla;
  SeedRule seed;  // what a cached block's full forward commits
  Readout readout;
  bool samplers;                 // alg / alg_temp / top_p / top_k (Dream's sample_tokens)
  bool samples_outside_vanilla;  // temperature > 0 in prefix and dual too
  bool any_commit_rule;          // prefix / dual take the fixed schedule and factor, not only threshold
};

const std::vector<SingleBranchRules> kRules{
    {"llada", VanillaSchedule::kBlockFixed, SeedRule::kCommitByRule, Readout::kDevice, /*samplers=*/false,
     /*samples_outside_vanilla=*/true, /*any_commit_rule=*/true},
    {"dream", VanillaSchedule::kTimestep, SeedRule::kFirstMaskArgmax, Readout::kHostTopk, /*samplers=*/true,
     /*samples_outside_vanilla=*/false, /*any_commit_rule=*/false},
};

const SingleBranchRules& rules_of(const ModelConfig& c) {
  const SingleBranchRules* r = family_row(kRules, family_spec(c.family));
  TORCH_CHECK(r != nullptr, "the single-branch policies have no rules for ", family_spec(c.family).name,
              " checkpoints (refused at admission)");
  return *r;
}

constexpr double kInf = std::numeric_limits<double>::infinity();

// One step as the skeleton plans it.
struct Step {
  int64_t s = 0, e = 0;   // the block
  int64_t out0 = 0;       // the canvas position of the forward's first output
  int64_t outputs = 0;    // the forward's outputs
  bool seed = false;      // a cached block start under SeedRule::kFirstMaskArgmax
  int64_t count = 0;      // the fixed schedule's count for this step (0: another rule)
  bool timestep = false;  // a kTimestep step:
  float ratio = 0;        //   1 - t[i+1] / t[i] (float32, as the reference's tensors)
  bool last = false;      //   the schedule's last step (every mask is committed)
};

struct Commits {
  int64_t committed = 0, masks_left = 0;
  bool eos = false;  // the block holds an EOS (stop_on_eos)
};

// The family's readout (FamilyRules::readout): the canvas, and a step's logits turned into commits.
class Canvas {
 public:
  virtual ~Canvas() = default;
  virtual void check(const Stop& stop, int64_t forwards) const = 0;
  // The outputs the step reads (p.q.logit_index) and the readout's entries (p.extra).
  virtual void reads(StepPlan& p, const Step& s) = 0;
  virtual at::Tensor tokens_from(const StepPlan& p, const at::Tensor& buffer) const = 0;
  virtual std::vector<at::Tensor> after_forward(const StepPlan& p, const at::Tensor& buffer,
                                                const at::Tensor& logits) = 0;
  virtual Commits absorb(const StepPlan& p, const Step& s, const at::Tensor& logits,
                         const std::vector<at::Tensor>& host) = 0;
  virtual void fill_eos(int64_t from) = 0;
  virtual std::vector<int64_t> tokens() = 0;
  virtual const LogprobRecord& logprobs() const = 0;
};

// Output row of canvas position `pos` in a forward whose first output is position `out0`.
int64_t output_of(int64_t pos, int64_t shift, int64_t out0) { return std::max<int64_t>(pos - shift - out0, 0); }

// The device readout (Readout::kDevice): canvas [L] on the model's device; a step = confidence and
// commit_ on the device (or, sampling, host proposals from the seeded generator, the reference's
// draws), one readback of (committed, masks left, EOS in the block).
class DeviceReadout final : public Canvas {
 public:
  DeviceReadout(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o, int64_t b)
      : model_(model), c_(model.config()), o_(o), L_(static_cast<int64_t>(prompt.size()) + o.gen_length), b_(b),
        sampling_(o.temperature > 0),
        generator_(at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(o.seed))),
        logprobs_(o.logprobs, L_, model.device()) {
    std::vector<int64_t> init(L_, c_.mask_token_id);
    std::copy(prompt.begin(), prompt.end(), init.begin());
    canvas_ = at::from_blob(init.data(), {L_}, at::kLong).to(model.device(), false, /*copy=*/true);
  }

  void check(const Stop& stop, int64_t forwards) const override { stop.check(forwards, canvas_); }

  void reads(StepPlan& p, const Step& s) override {
    const int64_t shift = family_spec(c_.family).logit_shift;
    if (!(s.out0 == s.s && s.outputs == b_ && shift == 0)) {  // else the forward's outputs are the block
      for (int64_t q = s.s; q < s.e; ++q) p.q.logit_index.push_back(output_of(q, shift, s.out0));
    }
    p.sampling = sampling_;
    // The commit window, then the fixed rule's count for this step.
    for (int64_t q = s.s; q < s.e; ++q) p.extra.push_back(q);
    p.extra.push_back(s.count);
  }

  at::Tensor tokens_from(const StepPlan&, const at::Tensor&) const override { return canvas_; }

  std::vector<at::Tensor> after_forward(const StepPlan& p, const at::Tensor& buffer,
                                        const at::Tensor& logits) override {
    if (sampling_) return {logits.to(at::kDouble)};  // proposals from the seeded host generator
    auto [token, conf] = ops::confidence(logits.contiguous(), c_.mask_token_id);
    const at::Tensor extra = buffer.narrow(0, p.base, b_ + 1);
    const at::Tensor before = logprobs_.on() ? canvas_.index_select(0, extra.narrow(0, 0, b_)) : at::Tensor();
    at::Tensor counts = commit(extra, token, conf);
    record(extra, logits, before);
    return {counts};
  }

  Commits absorb(const StepPlan& p, const Step&, const at::Tensor& logits,
                 const std::vector<at::Tensor>& host) override {
    at::Tensor counts = host[0];
    if (sampling_) {  // commit the host proposals: window and count uploaded again
      const Proposals prop = sample_proposals(host[0], c_.mask_token_id, o_.temperature, generator_);
      std::vector<int64_t> extra = p.extra;
      const at::Tensor dev = at::from_blob(extra.data(), {b_ + 1}, at::kLong).to(model_.device(), false, true);
      const at::Tensor before = logprobs_.on() ? canvas_.index_select(0, dev.narrow(0, 0, b_)) : at::Tensor();
      counts = commit(dev, at::tensor(prop.token, at::kLong).to(model_.device()),
                      at::tensor(prop.conf, at::kDouble).to(model_.device()))
                   .cpu();
      record(dev, logits, before);
    }
    const int64_t* n = counts.const_data_ptr<int64_t>();
    return Commits{n[0], n[1], n[2] != 0};
  }

  void fill_eos(int64_t from) override { canvas_.narrow(0, from, L_ - from).fill_(c_.eos_token_id); }

  std::vector<int64_t> tokens() override {
    const at::Tensor t = canvas_.cpu();
    return std::vector<int64_t>(t.const_data_ptr<int64_t>(), t.const_data_ptr<int64_t>() + L_);
  }

  const LogprobRecord& logprobs() const override { return logprobs_; }

 private:
  // The step's commits into the logprob table: window = extra[0, b), the logits' rows in its order.
  void record(const at::Tensor& extra, const at::Tensor& logits, const at::Tensor& before) {
    if (!logprobs_.on()) return;
    const at::Tensor window = extra.narrow(0, 0, b_);
    logprobs_.record(window, logits, before, canvas_.index_select(0, window));
  }

  // commit_ on the device: window = extra[0, b), the fixed rule's count = extra[b].
  at::Tensor commit(const at::Tensor& extra, const at::Tensor& token, const at::Tensor& conf) const {
    return ops::commit_(canvas_, extra.narrow(0, 0, b_), token, conf, extra.narrow(0, b_, 1), c_.mask_token_id,
                        c_.eos_token_id, commit_rule_name(o_.commit()), o_.threshold.value_or(1.0),
                        o_.factor.value_or(1.0));
  }

  const Network& model_;
  const ModelConfig& c_;
  const DecodeOptions o_;
  const int64_t L_, b_;
  const bool sampling_;
  at::Generator generator_;
  at::Tensor canvas_;
  LogprobRecord logprobs_;
};

at::Tensor long_tensor(const std::vector<int64_t>& v, c10::Device device) {
  return at::tensor(v, at::kLong).to(device);
}

// The host readout (Readout::kHostTopk): the canvas on the host, uploaded with each forward; the
// step reads the outputs of the block's masks only and ranks with at::topk over a -inf-padded row,
// as the reference does. Rules: a seed commits the first mask's argmax; a timestep step commits
// int(masks * ratio) masks by alg (origin: each mask with probability ratio; alg_temp: drawn); a
// window step commits the most confident mask and every other one with confidence >= threshold.
// The mask id is not excluded from the proposals (as in Dream): a position may stay masked.
class HostReadout final : public Canvas {
 public:
  HostReadout(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o)
      : model_(model), o_(o), mask_(model.config().mask_token_id), eos_(model.config().eos_token_id),
        limit_(model.config().proposal_limit()), shift_(family_spec(model.config().family).logit_shift),
        L_(static_cast<int64_t>(prompt.size()) + o.gen_length),
        threshold_(static_cast<float>(o.threshold.value_or(1.0))),
        generator_(at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(o.seed))),
        logprobs_(o.logprobs, L_, model.device()) {
    x_ = prompt;
    x_.resize(L_, mask_);
  }

  void check(const Stop& stop, int64_t forwards) const override { stop.check(forwards, x_); }

  void reads(StepPlan& p, const Step& s) override {
    masked_.clear();  // the canvas positions the step reads, ascending
    if (s.seed) {
      masked_.push_back(s.s);
    } else {
      for (int64_t q = s.s; q < s.e; ++q) {
        if (x_[q] == mask_) masked_.push_back(q);
      }
    }
    for (int64_t q : masked_) p.q.logit_index.push_back(output_of(q, shift_, s.out0));
    if (masked_.empty()) p.q.logit_index.push_back(0);  // nothing to read; the step still runs
    p.extra = x_;
  }

  at::Tensor tokens_from(const StepPlan& p, const at::Tensor& buffer) const override {
    return host_canvas_tokens(p, buffer);
  }

  std::vector<at::Tensor> after_forward(const StepPlan&, const at::Tensor&, const at::Tensor&) override { return {}; }

  Commits absorb(const StepPlan&, const Step& s, const at::Tensor& out, const std::vector<at::Tensor>&) override {
    const at::Tensor logits = out.to(at::kFloat);
    std::vector<int64_t> read, before;  // logprobs: the positions the step read and what they held
    if (logprobs_.on()) {
      read = s.seed ? std::vector<int64_t>{s.s} : masked_;
      for (int64_t q : read) before.push_back(x_[q]);
    }
    Commits c;
    if (s.seed) {
      const host::Proposal p = host::propose(logits, Alg::kConfidence, 0.0, generator_, o_.top_p, o_.top_k, limit_);
      x_[s.s] = host::to_host({p.x0})[0].const_data_ptr<int64_t>()[0];
      c.committed = 1;
    } else if (s.timestep) {
      c.committed = timestep(logits, s);
    } else {
      c.committed = by_threshold(logits, s);
    }
    if (!read.empty()) {  // the rows the step read are the masks' (a seed: its one row)
      std::vector<int64_t> after;
      for (int64_t q : read) after.push_back(x_[q]);
      logprobs_.record(read, logits.narrow(0, 0, static_cast<int64_t>(read.size())), before, after);
    }
    c.masks_left = std::count(x_.begin() + s.s, x_.begin() + s.e, mask_);
    c.eos = std::find(x_.begin() + s.s, x_.begin() + s.e, eos_) != x_.begin() + s.e;
    return c;
  }

  void fill_eos(int64_t from) override { std::fill(x_.begin() + from, x_.end(), eos_); }

  std::vector<int64_t> tokens() override { return std::move(x_); }

  const LogprobRecord& logprobs() const override { return logprobs_; }

 private:
  // Commits the step's masks by the timestep rule; returns how many it wrote.
  int64_t timestep(const at::Tensor& logits, const Step& s) {
    const c10::Device dev = model_.device();
    const int64_t n = static_cast<int64_t>(masked_.size());
    const Alg alg = *o_.alg;
    if (alg == Alg::kOrigin) {
      // Each mask is unmasked with probability `ratio` (1 at the last step): uniform draws first,
      // then the proposals of the chosen rows (both from the seeded generator, in that order).
      const at::Tensor u = at::rand({n}, generator_, at::kFloat);
      const float* up = u.const_data_ptr<float>();
      std::vector<int64_t> rows, pos;
      for (int64_t j = 0; j < n; ++j) {
        if (s.last ? up[j] < 1.0f : up[j] < s.ratio) rows.push_back(j), pos.push_back(masked_[j]);
      }
      if (rows.empty()) return 0;
      const host::Proposal p = host::propose(logits.index_select(0, long_tensor(rows, dev)), alg, o_.temperature,
                                             generator_, o_.top_p, o_.top_k, limit_);
      const at::Tensor x0 = host::to_host({p.x0})[0];
      for (size_t j = 0; j < pos.size(); ++j) x_[pos[j]] = x0.const_data_ptr<int64_t>()[j];
      return static_cast<int64_t>(rows.size());
    }
    if (n == 0) return 0;
    const host::Proposal p = host::propose(logits, alg, o_.temperature, generator_, o_.top_p, o_.top_k, limit_);
    const int64_t k = host::timestep_count(s.ratio, s.last, n);
    if (k == 0) return 0;
    at::Tensor full = at::full({1, L_}, -kInf, logits.options());
    full.select(0, 0).index_put_({long_tensor(masked_, dev)}, p.conf);
    const at::Tensor picked = o_.alg_temp > 0
                                  ? host::multinomial(at::softmax(at::div(full, o_.alg_temp), -1), k, generator_)
                                  : std::get<1>(at::topk(full, k));
    const std::vector<at::Tensor> host = host::to_host({picked, p.x0});
    std::vector<int64_t> slot(L_, -1);  // canvas position -> its row among the masks
    for (int64_t j = 0; j < n; ++j) slot[masked_[j]] = j;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t at_ = host[0].const_data_ptr<int64_t>()[j];
      TORCH_CHECK(at_ >= 0 && at_ < L_ && slot[at_] >= 0,
                  "vanilla (timestep schedule): internal error: picked "
                  "position ",
                  at_, ", which holds no mask");
      x_[at_] = host[1].const_data_ptr<int64_t>()[slot[at_]];
    }
    return k;
  }

  // Commits the most confident mask of the window and every other one rated >= threshold (ranked
  // over the forward's outputs, as the authors' row of end - s confidences); returns how many
  // positions it unmasked.
  int64_t by_threshold(const at::Tensor& logits, const Step& s) {
    const int64_t n = static_cast<int64_t>(masked_.size());
    if (n == 0) return 0;
    const host::Proposal p = host::propose(logits, Alg::kConfidence, 0.0, generator_, o_.top_p, o_.top_k, limit_);
    std::vector<int64_t> rel;
    for (int64_t q : masked_) rel.push_back(q - s.s);
    at::Tensor full = at::full({1, s.outputs}, -kInf, logits.options());
    full.select(0, 0).index_put_({long_tensor(rel, model_.device())}, p.conf);
    auto [top_conf, top_idx] = at::topk(full, n);
    const std::vector<at::Tensor> host = host::to_host({top_conf.to(at::kFloat), top_idx, p.x0});
    const int64_t b = s.e - s.s;
    std::vector<int64_t> slot(b, -1);
    for (int64_t j = 0; j < n; ++j) slot[rel[j]] = j;
    int64_t committed = 0;
    for (int64_t r = 0; r < n; ++r) {
      if (r > 0 && static_cast<float>(host[0].const_data_ptr<double>()[r]) < threshold_) continue;
      const int64_t j = host[1].const_data_ptr<int64_t>()[r];
      TORCH_CHECK(j >= 0 && j < b && slot[j] >= 0, "cached decode: internal error: ranked position ", s.s + j,
                  ", which holds no mask");
      x_[s.s + j] = host[2].const_data_ptr<int64_t>()[slot[j]];
      committed += x_[s.s + j] != mask_;
    }
    return committed;
  }

  const Network& model_;
  const DecodeOptions o_;
  const int64_t mask_, eos_, limit_, shift_, L_;
  const float threshold_;  // compared with float32 confidences
  at::Generator generator_;
  std::vector<int64_t> x_, masked_;
  LogprobRecord logprobs_;
};

class SingleBranch final : public Decoder {
 public:
  SingleBranch(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o, const Stop& stop,
               KvRows kv)
      : rules_(rules_of(model.config())), o_(o), stop_(stop), lp_(static_cast<int64_t>(prompt.size())),
        L_(lp_ + o.gen_length), timestep_(o.policy == Policy::kVanilla && rules_.vanilla == VanillaSchedule::kTimestep),
        seeded_(o.policy != Policy::kVanilla && rules_.seed == SeedRule::kFirstMaskArgmax),
        b_(timestep_ ? o.gen_length : o.block_length), blocks_(o.gen_length / b_),
        steps_per_block_(timestep_                          ? o.steps.value_or(o.gen_length)
                         : o.commit() == CommitRule::kFixed ? *o.steps / blocks_
                                                            : 0) {
    if (rules_.readout == Readout::kHostTopk) {
      readout_ = std::make_unique<HostReadout>(model, prompt, o);
    } else {
      readout_ = std::make_unique<DeviceReadout>(model, prompt, o, b_);
    }
    if (timestep_) timesteps_ = host::timesteps(o.eps, steps_per_block_);
    st_.branches.push_back(BranchStats{timestep_ ? 0 : b_});
    if (o.policy != Policy::kVanilla) kv_ = kv.defined() ? std::move(kv) : KvRows{model.new_kv(1, L_), {}};
    start_block();
  }

  bool done() const override { return block_ >= blocks_; }

  StepPlan plan() override {
    readout_->check(stop_, st_.nfe_full + st_.nfe_block);
    // Bound: every step commits at least one token (or fails in absorb), so a block takes at most
    // b steps (and its seed); a schedule has exactly its steps.
    const int64_t max_steps = !schedule_.empty() ? static_cast<int64_t>(schedule_.size())
                              : timestep_        ? steps_per_block_
                                                 : b_ + seeded_;
    if (step_ >= max_steps) {
      stop_.no_progress(static_cast<int64_t>(st_.steps.size()), where() + ": the schedule's " +
                                                                    std::to_string(max_steps) + " steps left " +
                                                                    std::to_string(masks_left_) + " masks");
    }
    s_ = Step{};
    s_.s = lp_ + block_ * b_;
    s_.e = s_.s + b_;
    StepPlan p;
    if (o_.policy == Policy::kVanilla || step_ == 0) {  // whole canvas; at a cached block start its K/V fill the cache
      p.q.add_positions(0, L_, 0);
      p.mode = KvMode::kFull;
      p.kind = o_.policy == Policy::kVanilla ? StepKind::kStep : StepKind::kBlockStart;
      s_.seed = seeded_;
      st_.nfe_full += 1;
    } else {  // dual: the block against the whole cached canvas; prefix: block + suffix against [0, s)
      const bool dual = o_.policy == Policy::kDual;
      p.q.add_positions(s_.s, dual ? s_.e : L_, 0);
      if (!dual) p.q.prefix_lens.push_back(s_.s);
      p.mode = dual ? KvMode::kDual : KvMode::kPrefix;
      p.kind = StepKind::kWindow;
      s_.out0 = s_.s;
      st_.nfe_block += 1;
    }
    s_.outputs = p.q.size();
    if (!schedule_.empty()) s_.count = schedule_.at(step_);
    if (timestep_) {
      s_.timestep = true;
      s_.ratio = host::timestep_ratio(timesteps_, step_);
      s_.last = step_ == steps_per_block_ - 1;
    }
    readout_->reads(p, s_);
    return p;
  }

  at::Tensor tokens_from(const StepPlan& p, const at::Tensor& buffer) const override {
    return readout_->tokens_from(p, buffer);
  }

  std::vector<at::Tensor> after_forward(const StepPlan& p, const at::Tensor& buffer,
                                        const at::Tensor& logits) override {
    return readout_->after_forward(p, buffer, logits);
  }

  void absorb(const StepPlan& p, const at::Tensor& logits, const std::vector<at::Tensor>& host) override {
    const Commits c = readout_->absorb(p, s_, logits, host);
    masks_left_ = c.masks_left;
    st_.steps.push_back({c.committed, p.q.size(), p.q.key_tokens(p.mode, L_)});
    st_.branches[0].committed += c.committed;
    if (!timestep_ && c.committed == 0 && masks_left_ > 0) {
      stop_.no_progress(
          static_cast<int64_t>(st_.steps.size()) - 1,
          where() +
              (rules_.readout == Readout::kHostTopk ? ": the model proposes the mask id for every mask left" : ""));
    }
    ++step_;
    if (timestep_ ? step_ < steps_per_block_ : masks_left_ > 0 || s_.seed) return;
    // Earlier blocks held no EOS (the decode would have stopped), so an EOS in [lp, e) is in this block.
    if (*o_.stop_on_eos && c.eos) {
      readout_->fill_eos(s_.e);
      block_ = blocks_;
      return;
    }
    ++block_;
    if (!done()) start_block();
  }

  at::Tensor logprob_rows(int64_t from, int64_t count) const override {
    return readout_->logprobs().rows(lp_ + from, count);
  }

  DecodeResult finish() override {
    DecodeResult res;
    res.logprobs = readout_->logprobs().rows(lp_, o_.gen_length);
    res.tokens = readout_->tokens();
    st_.nfe = st_.nfe_full + st_.nfe_block;
    st_.nfe_paper = st_.nfe;
    st_.branches[0].forwards = st_.nfe;
    if (!timestep_) st_.winner_block_size = b_;
    res.stats = std::move(st_);
    return res;
  }

 private:
  void start_block() {
    step_ = 0;
    masks_left_ = b_;  // a block starts all masks
    schedule_ =
        !timestep_ && o_.commit() == CommitRule::kFixed ? fixed_schedule(b_, steps_per_block_) : std::vector<int64_t>();
  }
  std::string where() const {
    const int64_t s = lp_ + block_ * b_;
    return "block " + std::to_string(block_) + ", positions [" + std::to_string(s) + ", " + std::to_string(s + b_) +
           ")";
  }

  const SingleBranchRules& rules_;
  const DecodeOptions o_;
  const Stop& stop_;
  const int64_t lp_, L_;
  const bool timestep_, seeded_;
  const int64_t b_, blocks_, steps_per_block_;
  std::unique_ptr<Canvas> readout_;
  at::Tensor timesteps_;
  int64_t block_ = 0, step_ = 0, masks_left_ = 0;
  std::vector<int64_t> schedule_;
  Step s_;
  DecodeStats st_;
};

}  // namespace

namespace {

std::unique_ptr<Decoder> make(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o,
                              const Stop& stop, KvRows kv) {
  return std::make_unique<SingleBranch>(model, prompt, o, stop, std::move(kv));
}

std::string family_refusal(const FamilySpec& f) {
  if (f.attention == AttentionPattern::kBlockCausal) {
    return c10::str("is not defined on ", f.name,
                    " checkpoints (block-causal attention: a block sees only itself and earlier blocks, so "
                    "their exact cache is decoding block by block)");
  }
  if (family_row(kRules, f) == nullptr) return c10::str("has no rules for ", f.name, " checkpoints");
  return "";
}

Refusal option_refusal(const FamilySpec* family, const DecodeOptions& o) {
  const SingleBranchRules* rules = family != nullptr ? family_row(kRules, *family) : nullptr;
  if (Refusal why = bidirectional_refusal(family, rules == nullptr || rules->samplers, o)) return why;
  if (rules != nullptr && !rules->samples_outside_vanilla && o.policy != Policy::kVanilla && o.temperature != 0) {
    return {"temperature",
            c10::str("temperature > 0 samples only in policy 'vanilla' on ", family->name, " checkpoints; policy '",
                     policy_name(o.policy), "' decodes them greedily (as the authors' decoders do)")};
  }
  if (o.policy == Policy::kVanilla && (rules == nullptr || rules->vanilla == VanillaSchedule::kTimestep)) {
    // A timestep schedule has no blocks (block_length unused) and runs over `steps`; the block
    // and schedule rules of kBlockFixed are checked once the family is known.
    if (rules != nullptr && o.steps.value_or(o.gen_length) < 1) {
      return {"steps", c10::str("steps must be >= 1 for the timestep sampler of ", family->name,
                                " checkpoints (None: gen_length steps), got ", o.steps.value_or(0))};
    }
    return {};
  }
  if (o.block_length > o.gen_length) {
    return {"block_length",
            c10::str("block_length must be an integer in [1, gen_length = ", o.gen_length, "], got ", o.block_length)};
  }
  if (o.gen_length % o.block_length != 0) {
    return {"block_length", c10::str("block_length = ", o.block_length, " must divide gen_length = ", o.gen_length)};
  }
  if (rules != nullptr && !rules->any_commit_rule && o.commit() != CommitRule::kThreshold) {
    return {o.factor ? "factor" : "threshold",
            c10::str("policy '", policy_name(o.policy), "' commits by threshold on ", family->name,
                     " checkpoints (the authors' cached decoder): set threshold and leave factor None")};
  }
  if (o.commit() == CommitRule::kFixed) {
    const int64_t blocks = o.gen_length / o.block_length;
    if (!(o.steps.value_or(0) > 0 && *o.steps % blocks == 0)) {
      return {"steps", c10::str("steps must be a positive multiple of the number of blocks (", blocks,
                                " = gen_length / block_length) for the fixed schedule, got ",
                                o.steps ? std::to_string(*o.steps) : std::string("None"))};
    }
  }
  return {};
}

int64_t cache_rows(const DecodeOptions&) { return 1; }

}  // namespace

namespace pd = policy_defaults;

// vanilla: every step a full forward over the canvas, no KV cache (ALGORITHMS.md 3, 5.3).
extern const PolicyDescriptor kVanillaPolicy{.id = Policy::kVanilla,
                                             .family_refusal = family_refusal,
                                             .option_refusal = option_refusal,
                                             .kv_rows = pd::none,
                                             .canvas_unit = pd::one,
                                             .cached_prompt_block = pd::none,
                                             .graphs = pd::yes,
                                             .needs_paged_pool = pd::no_option,
                                             .adapts_to_load = pd::no,
                                             .at_load = pd::as_is,
                                             .steps_with_confidence = false,
                                             .step_kinds = {StepKind::kStep},
                                             .stats = {"nfe_full"},
                                             .logprobs = true,
                                             .make = make};

// prefix and dual share every rule but the key range a block step attends (the decoder reads
// o.policy): a block's first step fills the cache, the others run against it.
namespace {
PolicyDescriptor cached_policy(Policy id) {
  return {.id = id,
          .family_refusal = family_refusal,
          .option_refusal = option_refusal,
          .kv_rows = cache_rows,
          .canvas_unit = pd::one,
          .cached_prompt_block = pd::none,
          .graphs = pd::yes,
          .needs_paged_pool = pd::no_option,
          .adapts_to_load = pd::no,
          .at_load = pd::as_is,
          .steps_with_confidence = false,
          .step_kinds = {StepKind::kBlockStart, StepKind::kWindow},
          .stats = {"nfe_full", "nfe_block"},
          .logprobs = true,
          .make = make};
}
}  // namespace

// prefix: the block and the suffix against the frozen prefix.
extern const PolicyDescriptor kPrefixPolicy = cached_policy(Policy::kPrefix);
// dual: the block against the whole cached canvas.
extern const PolicyDescriptor kDualPolicy = cached_policy(Policy::kDual);

}  // namespace blockbatch
