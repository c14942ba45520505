// Single-branch policies (ALGORITHMS.md section 3): vanilla, prefix cache, dual cache.
// Blocks are aligned at the prompt end and decoded left to right; every block loops until it
// holds no mask (checked before each step). The python twin is reference/policies.py.
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <limits>

#include "decode/commit.h"
#include "decode/decode.h"
#include "decode/step.h"
#include "decode/step_runner.h"

namespace blockbatch {

DecodeResult decode_single_branch(const Model& model, const std::vector<int64_t>& prompt, const DecodeOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  const ModelConfig& c = model.config();
  const int64_t lp = static_cast<int64_t>(prompt.size()), L = lp + o.gen_length, b = o.block_length;
  const int64_t num_blocks = o.gen_length / b;
  const int64_t steps_per_block = o.commit == CommitRule::kFixed ? o.steps / num_blocks : 0;
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(o.seed));

  DecodeResult res;
  std::vector<int64_t>& x = res.tokens;
  x.assign(L, c.mask_token_id);
  std::copy(prompt.begin(), prompt.end(), x.begin());
  DecodeStats& st = res.stats;
  st.branches.push_back(BranchStats{b});
  StepRunner runner(model, o.cuda_graphs);  // before kv: the request's device work runs on its stream
  at::Tensor kv = o.policy == Policy::kVanilla ? at::Tensor() : model.new_kv(1, L);

  for (int64_t block = 0; block < num_blocks; ++block) {
    const int64_t s = lp + block * b, e = s + b;
    auto masks_left = [&] { return std::count(x.begin() + s, x.begin() + e, c.mask_token_id); };
    const std::vector<int64_t> schedule =
        o.commit == CommitRule::kFixed ? fixed_schedule(masks_left(), steps_per_block) : std::vector<int64_t>();
    for (int64_t step = 0; masks_left() > 0; ++step) {
      PackedQueries q;
      KvMode mode;
      const bool full = o.policy == Policy::kVanilla || step == 0;
      if (full) {  // whole canvas; at a cached block start its K/V fill the buffer
        q.add_row(x.data(), 0, L, 0);
        for (int64_t p = s; p < e; ++p) q.logit_index.push_back(p);
        mode = KvMode::kFull;
        st.nfe_full += 1;
      } else if (o.policy == Policy::kDual) {  // the block against the whole cached canvas
        q.add_row(x.data(), s, e, 0);
        mode = KvMode::kDual;
        st.nfe_block += 1;
      } else {  // prefix: block + whole suffix against the frozen prefix [0, s)
        q.add_row(x.data(), s, L, 0);
        q.prefix_lens.push_back(s);
        for (int64_t i = 0; i < b; ++i) q.logit_index.push_back(i);
        mode = KvMode::kPrefix;
        st.nfe_block += 1;
      }
      const bool sampling = o.temperature > 0;
      const StepRunner::Output out = runner.run(q, kv, mode, sampling ? 1 : 0, [&](const at::Tensor& logits) {
        return sampling ? sampling_readout(logits) : greedy_readout(logits, c.mask_token_id);
      });
      const Proposals prop = sampling ? sample_proposals(out.host[0], c.mask_token_id, o.temperature, generator)
                                      : to_proposals(out.host[0], out.host[1]);
      std::vector<double> conf(b);
      for (int64_t i = 0; i < b; ++i) {
        conf[i] = x[s + i] == c.mask_token_id ? prop.conf[i] : -std::numeric_limits<double>::infinity();
      }
      std::vector<char> chosen;
      switch (o.commit) {
        case CommitRule::kThreshold: chosen = select_threshold(conf.data(), b, o.threshold); break;
        case CommitRule::kFactor: chosen = select_factor(conf.data(), b, o.factor); break;
        case CommitRule::kFixed: chosen = select_fixed(conf.data(), b, schedule.at(step)); break;
      }
      int64_t committed = 0;
      for (int64_t i = 0; i < b; ++i) {
        if (chosen[i]) {
          x[s + i] = prop.token[i];
          ++committed;
        }
      }
      st.steps.push_back({committed, q.size()});
      st.branches[0].committed += committed;
    }
    if (o.stop_on_eos && std::find(x.begin() + lp, x.begin() + e, c.eos_token_id) != x.begin() + e) {
      std::fill(x.begin() + e, x.end(), c.eos_token_id);
      break;
    }
  }
  st.nfe = st.nfe_full + st.nfe_block;
  st.nfe_paper = st.nfe;
  st.branches[0].forwards = st.nfe;
  st.winner_block_size = b;
  st.graph_captures = runner.captures();
  st.graph_replays = runner.replays();
  st.wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

DecodeResult decode(const Model& model, const std::vector<int64_t>& prompt, const DecodeOptions& o) {
  const ModelConfig& c = model.config();
  o.validate(c, static_cast<int64_t>(prompt.size()));
  for (size_t i = 0; i < prompt.size(); ++i) {
    TORCH_CHECK_VALUE(prompt[i] >= 0 && prompt[i] < c.vocab_size, "prompt_ids[", i, "] = ", prompt[i],
                      " is outside the vocabulary [0, ", c.vocab_size, ")");
    TORCH_CHECK_VALUE(prompt[i] != c.mask_token_id, "prompt_ids[", i, "] is the mask id ", c.mask_token_id,
                      "; prompts must not contain masks");
  }
  return o.policy == Policy::kBlockBatch ? decode_blockbatch(model, prompt, o) : decode_single_branch(model, prompt, o);
}

}  // namespace blockbatch
