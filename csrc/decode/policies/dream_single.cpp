// Dream's single-branch decoders (docs/ALGORITHMS.md 5.2, 5.3) as step machines (decode/decoder.h):
// its own vanilla sampler over the whole canvas, and Fast-dLLM's prefix / dual cache with Dream's
// block-start rule. The python twin is python/blockbatch/reference/dream.py (dream_vanilla,
// dream_cached).
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/div.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/full.h>
#include <ATen/ops/gather.h>
#include <ATen/ops/linspace.h>
#include <ATen/ops/log.h>
#include <ATen/ops/max.h>
#include <ATen/ops/multinomial.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/zeros_like.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
#include <string>

#include "decode/policies/dream.h"

namespace blockbatch {
namespace dream {

namespace {
constexpr double kEntropyEps = 1e-10;  // Dream's entropy: sum(p * log(p + 1e-10))
constexpr double kInf = std::numeric_limits<double>::infinity();
}  // namespace

at::Tensor multinomial(const at::Tensor& probs, int64_t samples, at::Generator& generator) {
  if (probs.is_cpu()) return at::multinomial(probs, samples, /*replacement=*/false, generator);
  return at::multinomial(probs.cpu(), samples, false, generator).to(probs.device());
}

Proposal propose(at::Tensor logits, Alg alg, double temperature, at::Generator& generator,
                 std::optional<double> top_p, std::optional<int64_t> top_k, int64_t limit) {
  const double lowest = std::numeric_limits<float>::lowest();  // float32 logits (torch.finfo.min)
  if (temperature > 0) logits = at::div(logits, temperature);
  if (top_p && *top_p < 1) {  // keep the smallest prefix of the sorted vocabulary reaching top_p
    auto [ordered, order] = at::sort(logits, -1, /*descending=*/true);
    at::Tensor drop = at::cumsum(at::softmax(ordered, -1), -1) > *top_p;
    const int64_t V = logits.size(-1);
    drop.narrow(-1, 1, V - 1).copy_(drop.narrow(-1, 0, V - 1).clone());
    drop.narrow(-1, 0, 1).fill_(false);
    drop = at::zeros_like(logits, at::kBool).scatter_(-1, order, drop);
    logits = logits.masked_fill(drop, lowest);
  }
  if (top_k) {
    const at::Tensor kth = std::get<0>(at::topk(logits, std::min(*top_k, logits.size(-1)))).narrow(-1, -1, 1);
    logits = logits.masked_fill(logits < kth, lowest);
  }
  const at::Tensor probs = at::softmax(logits, -1);
  at::Tensor pick = probs;
  const int64_t V = probs.size(-1);
  if (limit < V) {  // ids the tokenizer cannot produce never win (nor are drawn)
    pick = probs.clone();
    pick.narrow(-1, limit, V - limit).fill_(temperature > 0 ? 0.0 : -1.0);
  }
  Proposal p;
  if (temperature > 0) {
    p.x0 = multinomial(pick.reshape({-1, V}), 1, generator).reshape(probs.sizes().slice(0, 1));
    p.conf = at::gather(probs, -1, p.x0.unsqueeze(-1)).squeeze(-1);
  } else {
    std::tie(p.conf, p.x0) = at::max(pick, -1);
  }
  if (alg == Alg::kMargin) {
    const at::Tensor top2 = std::get<0>(at::topk(probs, 2, -1));
    p.conf = top2.select(-1, 0) - top2.select(-1, 1);
  } else if (alg == Alg::kEntropy) {
    p.conf = at::sum(probs * at::log(probs + kEntropyEps), -1);
  }
  return p;
}

StepPlan HostCanvasDecoder::canvas_plan(PackedQueries q, KvMode mode, StepKind kind) const {
  StepPlan p;
  p.kind = kind;
  p.q = std::move(q);
  p.mode = mode;
  p.extra = x_;
  return p;
}

at::Tensor HostCanvasDecoder::tokens_from(const StepPlan& p, const at::Tensor& buffer) const {
  return buffer.narrow(0, p.base, static_cast<int64_t>(p.extra.size()));
}

std::vector<at::Tensor> to_host(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> wide;
  for (const at::Tensor& t : tensors) wide.push_back(t.to(at::isFloatingType(t.scalar_type()) ? at::kDouble : at::kLong));
  return read_back(wide);
}

void finish_stats(DecodeStats& st) {
  st.nfe = st.nfe_full + st.nfe_block + st.nfe_init + st.nfe_refresh;
  st.nfe_paper = st.nfe;  // the authors count every forward
}

}  // namespace dream

namespace {

at::Tensor long_tensor(const std::vector<int64_t>& v, c10::Device device) {
  return at::tensor(v, at::kLong).to(device);
}

// Dream's sampler: `steps` full forwards, t from 1 down to eps (float32 linspace); step i commits
// int(masks * (1 - t[i+1] / t[i])) masked positions (all of them at the last step), the top ones by
// confidence (torch.topk over the whole canvas, -inf off the masks) or drawn by alg_temp; origin
// unmasks each mask with probability 1 - t[i+1] / t[i]. The mask id is not excluded (as in Dream).
class DreamVanilla final : public dream::HostCanvasDecoder {
 public:
  DreamVanilla(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o, const Stop& stop)
      : HostCanvasDecoder(model, prompt, o, stop), steps_(o.steps.value_or(o.gen_length)),
        timesteps_(at::linspace(1, o.eps, steps_ + 1, at::kFloat)) {
    st_.branches.push_back(BranchStats{0});
  }

  bool done() const override { return i_ >= steps_; }

  StepPlan plan() override {
    stop_.check(st_.nfe_full, x_);
    masked_.clear();  // canvas positions of the masks, ascending
    for (int64_t p = lp_; p < L_; ++p) {
      if (x_[p] == mask_) masked_.push_back(p);
    }
    PackedQueries q;
    q.add_positions(0, L_, 0);
    for (int64_t p : masked_) q.logit_index.push_back(p - 1);  // the shift: p reads output p - 1
    if (masked_.empty()) q.logit_index.push_back(0);            // nothing to read; the step still runs
    return canvas_plan(std::move(q), KvMode::kFull, StepKind::kStep);
  }

  void absorb(const StepPlan&, const at::Tensor& out, const std::vector<at::Tensor>&) override {
    const at::Tensor logits = out.to(at::kFloat);
    const c10::Device dev = model_.device();
    st_.nfe_full += 1;
    const float* ts = timesteps_.const_data_ptr<float>();
    const float t = ts[i_], s = ts[i_ + 1], ratio = 1.0f - s / t;  // float32, as the reference's tensors
    const bool last = i_ == steps_ - 1;
    const int64_t n = static_cast<int64_t>(masked_.size());
    const Alg alg = *o_.alg;
    int64_t committed = 0;
    if (alg == Alg::kOrigin) {
      // Each mask is unmasked with probability `ratio` (1 at the last step): uniform draws first,
      // then the proposals of the chosen rows (both from the seeded generator, in that order).
      const at::Tensor u = at::rand({n}, generator_, at::kFloat);
      const float* up = u.const_data_ptr<float>();
      std::vector<int64_t> rows, pos;
      for (int64_t j = 0; j < n; ++j) {
        if (last ? up[j] < 1.0f : up[j] < ratio) rows.push_back(j), pos.push_back(masked_[j]);
      }
      if (!rows.empty()) {
        const dream::Proposal p = dream::propose(logits.index_select(0, long_tensor(rows, dev)), alg, o_.temperature,
                                                 generator_, o_.top_p, o_.top_k, limit_);
        const at::Tensor x0 = dream::to_host({p.x0})[0];
        for (size_t j = 0; j < pos.size(); ++j) x_[pos[j]] = x0.const_data_ptr<int64_t>()[j];
        committed = static_cast<int64_t>(rows.size());
      }
    } else if (n > 0) {
      const dream::Proposal p = dream::propose(logits, alg, o_.temperature, generator_, o_.top_p, o_.top_k, limit_);
      const int64_t k = last ? n : static_cast<int64_t>(static_cast<float>(n) * ratio);
      if (k > 0) {
        at::Tensor full = at::full({1, L_}, -dream::kInf, logits.options());
        full.select(0, 0).index_put_({long_tensor(masked_, dev)}, p.conf);
        const at::Tensor picked = o_.alg_temp > 0
                                      ? dream::multinomial(at::softmax(at::div(full, o_.alg_temp), -1), k, generator_)
                                      : std::get<1>(at::topk(full, k));
        const std::vector<at::Tensor> host = dream::to_host({picked, p.x0});
        std::vector<int64_t> slot(L_, -1);  // canvas position -> its row among the masks
        for (int64_t j = 0; j < n; ++j) slot[masked_[j]] = j;
        for (int64_t j = 0; j < k; ++j) {
          const int64_t at_ = host[0].const_data_ptr<int64_t>()[j];
          TORCH_CHECK(at_ >= 0 && at_ < L_ && slot[at_] >= 0, "dream vanilla: internal error: step ", i_,
                      " picked position ", at_, ", which holds no mask");
          x_[at_] = host[1].const_data_ptr<int64_t>()[slot[at_]];
        }
        committed = k;
      }
    }
    st_.steps.push_back({committed, L_});
    st_.branches[0].committed += committed;
    ++i_;
  }

  DecodeResult finish() override {
    DecodeResult res;
    res.tokens = std::move(x_);
    dream::finish_stats(st_);
    st_.branches[0].forwards = st_.nfe;
    res.stats = std::move(st_);
    return res;
  }

 private:
  const int64_t steps_;
  const at::Tensor timesteps_;
  int64_t i_ = 0;
  std::vector<int64_t> masked_;
};

// Fast-dLLM's prefix / dual cache for Dream: per block [s, e) one full forward (fills the cache)
// whose output at s - 1 writes position s (argmax, unconditionally); then, at least once and until
// the block holds no mask, a window forward (dual: [s, e) over the whole cached canvas; prefix:
// [s, L) over the frozen [0, s)) read out shifted inside the window; the block's most confident
// mask is committed, and every other one with confidence >= threshold.
class DreamCached final : public dream::HostCanvasDecoder {
 public:
  DreamCached(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o, const Stop& stop,
              at::Tensor kv)
      : HostCanvasDecoder(model, prompt, o, stop), b_(o.block_length), blocks_(o.gen_length / b_),
        dual_(o.policy == Policy::kDual), threshold_(static_cast<float>(*o.threshold)) {
    kv_ = kv.defined() ? std::move(kv) : model.new_kv(1, L_);
    st_.branches.push_back(BranchStats{b_});
  }

  bool done() const override { return block_ >= blocks_; }

  StepPlan plan() override {
    const int64_t s = lp_ + block_ * b_, end = dual_ ? s + b_ : L_;
    stop_.check(st_.nfe_full + st_.nfe_block, x_);
    PackedQueries q;
    if (start_) {
      q.add_positions(0, L_, 0);
      q.logit_index.push_back(s - 1);
      return canvas_plan(std::move(q), KvMode::kFull, StepKind::kBlockStart);
    }
    rel_.clear();  // the block's masks (relative to s); the output each reads
    for (int64_t j = 0; j < b_; ++j) {
      if (x_[s + j] == mask_) rel_.push_back(j), q.logit_index.push_back(std::max<int64_t>(j - 1, 0));
    }
    q.add_positions(s, end, 0);
    if (!dual_) q.prefix_lens.push_back(s);
    if (rel_.empty()) q.logit_index.push_back(0);  // a block without masks still takes its window step
    return canvas_plan(std::move(q), dual_ ? KvMode::kDual : KvMode::kPrefix, StepKind::kWindow);
  }

  void absorb(const StepPlan& plan, const at::Tensor& out, const std::vector<at::Tensor>&) override {
    const at::Tensor logits = out.to(at::kFloat);
    const int64_t s = lp_ + block_ * b_, e = s + b_, end = dual_ ? e : L_;
    if (start_) {
      st_.nfe_full += 1;
      const dream::Proposal p =
          dream::propose(logits, Alg::kConfidence, 0.0, generator_, o_.top_p, o_.top_k, limit_);
      x_[s] = dream::to_host({p.x0})[0].const_data_ptr<int64_t>()[0];
      st_.steps.push_back({1, L_});
      st_.branches[0].committed += 1;
      start_ = false;
      return;
    }
    st_.nfe_block += 1;
    const int64_t n = static_cast<int64_t>(rel_.size());
    int64_t committed = 0;
    if (n > 0) {
      const dream::Proposal p =
          dream::propose(logits, Alg::kConfidence, 0.0, generator_, o_.top_p, o_.top_k, limit_);
      at::Tensor full = at::full({1, end - s}, -dream::kInf, logits.options());
      full.select(0, 0).index_put_({long_tensor(rel_, model_.device())}, p.conf);
      auto [top_conf, top_idx] = at::topk(full, n);
      const std::vector<at::Tensor> host = dream::to_host({top_conf.to(at::kFloat), top_idx, p.x0});
      std::vector<int64_t> slot(b_, -1);
      for (int64_t j = 0; j < n; ++j) slot[rel_[j]] = j;
      for (int64_t r = 0; r < n; ++r) {
        if (r > 0 && static_cast<float>(host[0].const_data_ptr<double>()[r]) < threshold_) continue;
        const int64_t j = host[1].const_data_ptr<int64_t>()[r];
        TORCH_CHECK(j >= 0 && j < b_ && slot[j] >= 0, "dream cache: internal error: block ", block_,
                    " ranked position ", s + j, ", which holds no mask");
        x_[s + j] = host[2].const_data_ptr<int64_t>()[slot[j]];
        committed += x_[s + j] != mask_;
      }
    }
    st_.steps.push_back({committed, plan.q.size()});
    st_.branches[0].committed += committed;
    const int64_t left = std::count(x_.begin() + s, x_.begin() + e, mask_);
    if (left == 0) {
      ++block_;
      start_ = true;
    } else if (left == n) {  // the authors' loop would never end: the model proposes the mask id itself
      stop_.no_progress(static_cast<int64_t>(st_.steps.size()) - 1,
                        "block " + std::to_string(block_) + ", positions [" + std::to_string(s) + ", " +
                            std::to_string(e) + "): the model proposes the mask id for every mask left");
    }
  }

  DecodeResult finish() override {
    DecodeResult res;
    res.tokens = std::move(x_);
    dream::finish_stats(st_);
    st_.branches[0].forwards = st_.nfe;
    st_.winner_block_size = b_;
    res.stats = std::move(st_);
    return res;
  }

 private:
  const int64_t b_, blocks_;
  const bool dual_;
  const float threshold_;  // compared with float32 confidences
  int64_t block_ = 0;
  bool start_ = true;       // the block's full forward comes next
  std::vector<int64_t> rel_;
};

}  // namespace

std::unique_ptr<Decoder> dream_vanilla_decoder(const Network& model, const std::vector<int64_t>& prompt,
                                               const DecodeOptions& o, const Stop& stop) {
  return std::make_unique<DreamVanilla>(model, prompt, o, stop);
}

std::unique_ptr<Decoder> dream_cached_decoder(const Network& model, const std::vector<int64_t>& prompt,
                                              const DecodeOptions& o, const Stop& stop, at::Tensor kv) {
  return std::make_unique<DreamCached>(model, prompt, o, stop, std::move(kv));
}

}  // namespace blockbatch
