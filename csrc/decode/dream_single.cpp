// Dream's single-branch decoders (docs/ALGORITHMS.md 5.2, 5.3): its own vanilla sampler over the
// whole canvas, and Fast-dLLM's prefix / dual cache with Dream's block-start rule. The python twin
// is python/blockbatch/reference/dream.py (dream_vanilla, dream_cached).
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
#include <chrono>
#include <limits>
#include <string>

#include "decode/dream.h"

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

at::Tensor Forwards::run(const PackedQueries& q, KvMode mode, const at::Tensor& kv, const std::vector<int64_t>& canvas,
                         int64_t kind) {
  std::vector<int64_t> buffer = q.host_buffer(mode);
  const int64_t base = static_cast<int64_t>(buffer.size()), n = static_cast<int64_t>(canvas.size());
  buffer.insert(buffer.end(), canvas.begin(), canvas.end());
  const StepRunner::Key key{static_cast<int64_t>(mode), q.size(), q.rows(), static_cast<int64_t>(q.logit_index.size()),
                            n, kind};
  return runner_
      .run(buffer, key,
           [&](const at::Tensor& dev) {
             StepRunner::Body body;
             body.logits = model_.forward(q.batch(dev, kv, mode, dev.narrow(0, base, n)));
             return body;
           })
      .logits;
}

std::vector<at::Tensor> to_host(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> wide;
  for (const at::Tensor& t : tensors) wide.push_back(t.to(at::isFloatingType(t.scalar_type()) ? at::kDouble : at::kLong));
  return read_back(wide);
}

void finish_stats(DecodeStats& st, const StepRunner& runner, double wall_ms) {
  st.nfe = st.nfe_full + st.nfe_block + st.nfe_init + st.nfe_refresh;
  st.nfe_paper = st.nfe;  // the authors count every forward
  st.graph_captures = runner.captures();
  st.graph_replays = runner.replays();
  st.wall_ms = wall_ms;
}

}  // namespace dream

namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<int64_t> initial_canvas(const std::vector<int64_t>& prompt, int64_t gen_length, int64_t mask) {
  std::vector<int64_t> x(prompt);
  x.resize(prompt.size() + gen_length, mask);
  return x;
}

at::Tensor long_tensor(const std::vector<int64_t>& v, c10::Device device) {
  return at::tensor(v, at::kLong).to(device);
}

}  // namespace

// Dream's sampler: `steps` full forwards, t from 1 down to eps (float32 linspace); step i commits
// int(masks * (1 - t[i+1] / t[i])) masked positions (all of them at the last step), the top ones by
// confidence (torch.topk over the whole canvas, -inf off the masks) or drawn by alg_temp; origin
// unmasks each mask with probability 1 - t[i+1] / t[i]. The mask id is not excluded (as in Dream).
DecodeResult decode_dream_vanilla(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o,
                                  const Stop& stop) {
  const auto t0 = std::chrono::steady_clock::now();
  const ModelConfig& c = model.config();
  const int64_t lp = static_cast<int64_t>(prompt.size()), L = lp + o.gen_length, mask = c.mask_token_id;
  const int64_t steps = o.steps.value_or(o.gen_length);
  const Alg alg = *o.alg;
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(o.seed));
  dream::Forwards fw(model, o.cuda_graphs);
  std::vector<int64_t> x = initial_canvas(prompt, o.gen_length, mask);
  const at::Tensor timesteps = at::linspace(1, o.eps, steps + 1, at::kFloat);
  const float* ts = timesteps.const_data_ptr<float>();
  const c10::Device dev = model.device();

  DecodeResult res;
  DecodeStats& st = res.stats;
  st.branches.push_back(BranchStats{0});
  for (int64_t i = 0; i < steps; ++i) {
    stop.check(st.nfe_full, x);
    std::vector<int64_t> masked;  // canvas positions of the masks, ascending
    for (int64_t p = lp; p < L; ++p) {
      if (x[p] == mask) masked.push_back(p);
    }
    const int64_t n = static_cast<int64_t>(masked.size());
    PackedQueries q;
    q.add_positions(0, L, 0);
    for (int64_t p : masked) q.logit_index.push_back(p - 1);  // the shift: p reads output p - 1
    if (masked.empty()) q.logit_index.push_back(0);            // nothing to read; the step still runs
    const at::Tensor logits = fw.run(q, KvMode::kFull, at::Tensor(), x, 0).to(at::kFloat);
    st.nfe_full += 1;
    const float t = ts[i], s = ts[i + 1], ratio = 1.0f - s / t;  // float32, as the reference's tensors
    const bool last = i == steps - 1;
    int64_t committed = 0;
    if (alg == Alg::kOrigin) {
      // Each mask is unmasked with probability `ratio` (1 at the last step): uniform draws first,
      // then the proposals of the chosen rows (both from the seeded generator, in that order).
      const at::Tensor u = at::rand({n}, generator, at::kFloat);
      const float* up = u.const_data_ptr<float>();
      std::vector<int64_t> rows, pos;
      for (int64_t j = 0; j < n; ++j) {
        if (last ? up[j] < 1.0f : up[j] < ratio) rows.push_back(j), pos.push_back(masked[j]);
      }
      if (!rows.empty()) {
        const dream::Proposal p = dream::propose(logits.index_select(0, long_tensor(rows, dev)), alg, o.temperature,
                                                 generator, o.top_p, o.top_k, c.proposal_limit());
        const at::Tensor x0 = dream::to_host({p.x0})[0];
        for (size_t j = 0; j < pos.size(); ++j) x[pos[j]] = x0.const_data_ptr<int64_t>()[j];
        committed = static_cast<int64_t>(rows.size());
      }
    } else if (n > 0) {
      const dream::Proposal p =
          dream::propose(logits, alg, o.temperature, generator, o.top_p, o.top_k, c.proposal_limit());
      const int64_t k = last ? n : static_cast<int64_t>(static_cast<float>(n) * ratio);
      if (k > 0) {
        at::Tensor full = at::full({1, L}, -dream::kInf, logits.options());
        full.select(0, 0).index_put_({long_tensor(masked, dev)}, p.conf);
        const at::Tensor picked = o.alg_temp > 0
                                      ? dream::multinomial(at::softmax(at::div(full, o.alg_temp), -1), k, generator)
                                      : std::get<1>(at::topk(full, k));
        const std::vector<at::Tensor> host = dream::to_host({picked, p.x0});
        std::vector<int64_t> slot(L, -1);  // canvas position -> its row among the masks
        for (int64_t j = 0; j < n; ++j) slot[masked[j]] = j;
        for (int64_t j = 0; j < k; ++j) {
          const int64_t at_ = host[0].const_data_ptr<int64_t>()[j];
          TORCH_CHECK(at_ >= 0 && at_ < L && slot[at_] >= 0, "dream vanilla: internal error: step ", i,
                      " picked position ", at_, ", which holds no mask");
          x[at_] = host[1].const_data_ptr<int64_t>()[slot[at_]];
        }
        committed = k;
      }
    }
    st.steps.push_back({committed, L});
    st.branches[0].committed += committed;
  }
  res.tokens = std::move(x);
  dream::finish_stats(st, fw.runner(), ms_since(t0));
  st.branches[0].forwards = st.nfe;
  return res;
}

// Fast-dLLM's prefix / dual cache for Dream: per block [s, e) one full forward (fills the cache)
// whose output at s - 1 writes position s (argmax, unconditionally); then, at least once and until
// the block holds no mask, a window forward (dual: [s, e) over the whole cached canvas; prefix:
// [s, L) over the frozen [0, s)) read out shifted inside the window; the block's most confident
// mask is committed, and every other one with confidence >= threshold.
DecodeResult decode_dream_cached(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o,
                                 const Stop& stop) {
  const auto t0 = std::chrono::steady_clock::now();
  const ModelConfig& c = model.config();
  const int64_t lp = static_cast<int64_t>(prompt.size()), L = lp + o.gen_length, mask = c.mask_token_id;
  const int64_t b = o.block_length, blocks = o.gen_length / b;
  const bool dual = o.policy == Policy::kDual;
  const float threshold = static_cast<float>(*o.threshold);  // compared with float32 confidences
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(o.seed));
  dream::Forwards fw(model, o.cuda_graphs);
  const c10::Device dev = model.device();
  const at::Tensor kv = model.new_kv(1, L);
  std::vector<int64_t> x = initial_canvas(prompt, o.gen_length, mask);

  DecodeResult res;
  DecodeStats& st = res.stats;
  st.branches.push_back(BranchStats{b});
  enum Kind : int64_t { kBlockStart = 1, kWindow };
  for (int64_t block = 0; block < blocks; ++block) {
    const int64_t s = lp + block * b, e = s + b, end = dual ? e : L;
    stop.check(st.nfe_full + st.nfe_block, x);
    {
      PackedQueries q;
      q.add_positions(0, L, 0);
      q.logit_index.push_back(s - 1);
      const at::Tensor logits = fw.run(q, KvMode::kFull, kv, x, kBlockStart).to(at::kFloat);
      st.nfe_full += 1;
      const dream::Proposal p =
          dream::propose(logits, Alg::kConfidence, 0.0, generator, o.top_p, o.top_k, c.proposal_limit());
      x[s] = dream::to_host({p.x0})[0].const_data_ptr<int64_t>()[0];
      st.steps.push_back({1, L});
      st.branches[0].committed += 1;
    }
    for (int64_t step = 0;; ++step) {
      stop.check(st.nfe_full + st.nfe_block, x);
      std::vector<int64_t> rel, out_row;  // the block's masks (relative to s) and the output each reads
      for (int64_t j = 0; j < b; ++j) {
        if (x[s + j] == mask) rel.push_back(j), out_row.push_back(std::max<int64_t>(j - 1, 0));
      }
      const int64_t n = static_cast<int64_t>(rel.size());
      PackedQueries q;
      q.add_positions(s, end, 0);
      if (!dual) q.prefix_lens.push_back(s);
      q.logit_index = out_row;
      if (rel.empty()) q.logit_index.push_back(0);  // a block without masks still takes its window step
      const at::Tensor logits = fw.run(q, dual ? KvMode::kDual : KvMode::kPrefix, kv, x, kWindow).to(at::kFloat);
      st.nfe_block += 1;
      int64_t committed = 0;
      if (n > 0) {
        const dream::Proposal p =
            dream::propose(logits, Alg::kConfidence, 0.0, generator, o.top_p, o.top_k, c.proposal_limit());
        at::Tensor full = at::full({1, end - s}, -dream::kInf, logits.options());
        full.select(0, 0).index_put_({long_tensor(rel, dev)}, p.conf);
        auto [top_conf, top_idx] = at::topk(full, n);
        const std::vector<at::Tensor> host = dream::to_host({top_conf.to(at::kFloat), top_idx, p.x0});
        std::vector<int64_t> slot(b, -1);
        for (int64_t j = 0; j < n; ++j) slot[rel[j]] = j;
        for (int64_t r = 0; r < n; ++r) {
          if (r > 0 && static_cast<float>(host[0].const_data_ptr<double>()[r]) < threshold) continue;
          const int64_t j = host[1].const_data_ptr<int64_t>()[r];
          TORCH_CHECK(j >= 0 && j < b && slot[j] >= 0, "dream cache: internal error: block ", block,
                      " ranked position ", s + j, ", which holds no mask");
          x[s + j] = host[2].const_data_ptr<int64_t>()[slot[j]];
          committed += x[s + j] != mask;
        }
      }
      st.steps.push_back({committed, q.size()});
      st.branches[0].committed += committed;
      const int64_t left = std::count(x.begin() + s, x.begin() + e, mask);
      if (left == 0) break;
      if (left == n) {  // the authors' loop would never end: the model proposes the mask id itself
        Stop::no_progress(static_cast<int64_t>(st.steps.size()) - 1,
                          "block " + std::to_string(block) + ", positions [" + std::to_string(s) + ", " +
                              std::to_string(e) + "): the model proposes the mask id for every mask left");
      }
    }
  }
  res.tokens = std::move(x);
  dream::finish_stats(st, fw.runner(), ms_since(t0));
  st.branches[0].forwards = st.nfe;
  st.winner_block_size = b;
  return res;
}

}  // namespace blockbatch
