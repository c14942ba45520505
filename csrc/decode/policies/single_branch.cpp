// Single-branch policies (ALGORITHMS.md section 3): vanilla, prefix cache, dual cache, as a step
// machine (decode/decoder.h). Blocks are aligned at the prompt end and decoded left to right; every
// block loops until it holds no mask (checked before each step). The python twin is
// reference/policies.py. The canvas lives on the model's device; a step = one H2D copy of its index
// buffer, forward, confidence, commit_ on the device, one D2H copy of the counts (on CUDA, alone, the
// step replays a recorded graph once its shape has been seen).
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/tensor.h>

#include <algorithm>
#include <string>

#include "decode/decoder.h"
#include "kernels/cpu/commit_rules.h"
#include "ops/ops.h"

namespace blockbatch {

namespace {

class SingleBranch final : public Decoder {
 public:
  SingleBranch(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o, const Stop& stop,
               at::Tensor kv)
      : model_(model), c_(model.config()), o_(o), stop_(stop), lp_(static_cast<int64_t>(prompt.size())),
        L_(lp_ + o.gen_length), b_(o.block_length), blocks_(o.gen_length / b_),
        steps_per_block_(o.commit() == CommitRule::kFixed ? *o.steps / blocks_ : 0), sampling_(o.temperature > 0),
        generator_(at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(o.seed))) {
    st_.branches.push_back(BranchStats{b_});
    if (o.policy != Policy::kVanilla) kv_ = kv.defined() ? std::move(kv) : model.new_kv(1, L_);
    std::vector<int64_t> init(L_, c_.mask_token_id);
    std::copy(prompt.begin(), prompt.end(), init.begin());
    canvas_ = at::from_blob(init.data(), {L_}, at::kLong).to(model.device(), false, /*copy=*/true);
    start_block();
  }

  bool done() const override { return block_ >= blocks_; }

  StepPlan plan() override {
    const int64_t s = lp_ + block_ * b_, e = s + b_;
    stop_.check(st_.nfe_full + st_.nfe_block, canvas_);
    // Bound: every step commits at least one token (or fails in absorb), so a block takes at most
    // b steps; the fixed schedule has exactly steps_per_block entries summing to b.
    const int64_t max_steps = schedule_.empty() ? b_ : static_cast<int64_t>(schedule_.size());
    if (step_ >= max_steps) {
      stop_.no_progress(static_cast<int64_t>(st_.steps.size()), where() + ": the fixed schedule's " +
                        std::to_string(max_steps) + " steps left " + std::to_string(masks_left_) + " masks");
    }
    StepPlan p;
    p.sampling = sampling_;
    if (o_.policy == Policy::kVanilla || step_ == 0) {  // whole canvas; at a cached block start its K/V fill the buffer
      p.q.add_positions(0, L_, 0);
      for (int64_t q = s; q < e; ++q) p.q.logit_index.push_back(q);
      p.mode = KvMode::kFull;
      p.kind = StepKind::kBlockStart;
      st_.nfe_full += 1;
    } else if (o_.policy == Policy::kDual) {  // the block against the whole cached canvas
      p.q.add_positions(s, e, 0);
      p.mode = KvMode::kDual;
      p.kind = StepKind::kWindow;
      st_.nfe_block += 1;
    } else {  // prefix: block + whole suffix against the frozen prefix [0, s)
      p.q.add_positions(s, L_, 0);
      p.q.prefix_lens.push_back(s);
      for (int64_t i = 0; i < b_; ++i) p.q.logit_index.push_back(i);
      p.mode = KvMode::kPrefix;
      p.kind = StepKind::kWindow;
      st_.nfe_block += 1;
    }
    if (o_.policy == Policy::kVanilla) p.kind = StepKind::kStep;
    // The policy's entries: the commit window, then the fixed rule's count for this step.
    for (int64_t q = s; q < e; ++q) p.extra.push_back(q);
    p.extra.push_back(schedule_.empty() ? 0 : schedule_.at(step_));
    return p;
  }

  at::Tensor tokens_from(const StepPlan&, const at::Tensor&) const override { return canvas_; }

  std::vector<at::Tensor> after_forward(const StepPlan& p, const at::Tensor& buffer, const at::Tensor& logits) override {
    if (sampling_) return {logits.to(at::kDouble)};  // proposals from the seeded host generator (the reference's draws)
    auto [token, conf] = ops::confidence(logits.contiguous(), c_.mask_token_id);
    return {commit(buffer.narrow(0, p.base, b_ + 1), token, conf)};
  }

  void absorb(const StepPlan& p, const at::Tensor&, const std::vector<at::Tensor>& host) override {
    at::Tensor counts = sampling_ ? at::Tensor() : host[0];
    if (sampling_) {  // commit the host proposals: window and count uploaded again
      const Proposals prop = sample_proposals(host[0], c_.mask_token_id, o_.temperature, generator_);
      std::vector<int64_t> extra = p.extra;
      const at::Tensor dev = at::from_blob(extra.data(), {b_ + 1}, at::kLong).to(model_.device(), false, true);
      counts = commit(dev, at::tensor(prop.token, at::kLong).to(model_.device()),
                      at::tensor(prop.conf, at::kDouble).to(model_.device()))
                   .cpu();
    }
    const int64_t committed = counts.const_data_ptr<int64_t>()[0];
    masks_left_ = counts.const_data_ptr<int64_t>()[1];
    const int64_t eos_in_block = counts.const_data_ptr<int64_t>()[2];
    st_.steps.push_back({committed, p.q.size()});
    st_.branches[0].committed += committed;
    if (committed == 0 && masks_left_ > 0) stop_.no_progress(static_cast<int64_t>(st_.steps.size()) - 1, where());
    ++step_;
    if (masks_left_ > 0) return;
    // Earlier blocks held no EOS (the decode would have stopped), so an EOS in [lp, e) is in this block.
    const int64_t e = lp_ + (block_ + 1) * b_;
    if (*o_.stop_on_eos && eos_in_block) {
      canvas_.narrow(0, e, L_ - e).fill_(c_.eos_token_id);
      block_ = blocks_;
      return;
    }
    ++block_;
    if (!done()) start_block();
  }

  DecodeResult finish() override {
    DecodeResult res;
    const at::Tensor tokens = canvas_.cpu();
    res.tokens.assign(tokens.const_data_ptr<int64_t>(), tokens.const_data_ptr<int64_t>() + L_);
    st_.nfe = st_.nfe_full + st_.nfe_block;
    st_.nfe_paper = st_.nfe;
    st_.branches[0].forwards = st_.nfe;
    st_.winner_block_size = b_;
    res.stats = std::move(st_);
    return res;
  }

 private:
  void start_block() {
    step_ = 0;
    masks_left_ = b_;  // a block starts all masks
    schedule_ = o_.commit() == CommitRule::kFixed ? fixed_schedule(b_, steps_per_block_) : std::vector<int64_t>();
  }
  std::string where() const {
    const int64_t s = lp_ + block_ * b_;
    return "block " + std::to_string(block_) + ", positions [" + std::to_string(s) + ", " + std::to_string(s + b_) + ")";
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
  const Stop& stop_;
  const int64_t lp_, L_, b_, blocks_, steps_per_block_;
  const bool sampling_;
  at::Generator generator_;
  at::Tensor canvas_;
  int64_t block_ = 0, step_ = 0, masks_left_ = 0;
  std::vector<int64_t> schedule_;
  DecodeStats st_;
};

}  // namespace

std::unique_ptr<Decoder> single_branch_decoder(const Network& model, const std::vector<int64_t>& prompt,
                                               const DecodeOptions& o, const Stop& stop, at::Tensor kv) {
  return std::make_unique<SingleBranch>(model, prompt, o, stop, std::move(kv));
}

}  // namespace blockbatch
