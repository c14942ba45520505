// Single-branch policies (ALGORITHMS.md section 3): vanilla, prefix cache, dual cache.
// Blocks are aligned at the prompt end and decoded left to right; every block loops until it
// holds no mask (checked before each step). The python twin is reference/policies.py.
// The canvas lives on the model's device; a step = one H2D copy of its index buffer, forward,
// confidence, commit_ on the device, one D2H copy of the counts (StepRunner: on CUDA the step
// replays a recorded graph once its shape has been seen).
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/tensor.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <string>

#include "kernels/cpu/commit_rules.h"
#include "decode/decode.h"
#include "decode/step.h"
#include "decode/step_runner.h"
#include "ops/ops.h"

namespace blockbatch {

DecodeResult decode_single_branch(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o,
                                  const Stop& stop) {
  const auto t0 = std::chrono::steady_clock::now();
  const ModelConfig& c = model.config();
  const int64_t lp = static_cast<int64_t>(prompt.size()), L = lp + o.gen_length, b = o.block_length;
  const int64_t num_blocks = o.gen_length / b;
  const int64_t steps_per_block = o.commit() == CommitRule::kFixed ? *o.steps / num_blocks : 0;
  const bool sampling = o.temperature > 0;
  const char* rule = commit_rule_name(o.commit());
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(static_cast<uint64_t>(o.seed));

  DecodeResult res;
  DecodeStats& st = res.stats;
  st.branches.push_back(BranchStats{b});
  StepRunner runner(model, o.cuda_graphs);  // before any device tensor: the request's work runs on its stream
  at::Tensor kv = o.policy == Policy::kVanilla ? at::Tensor() : model.new_kv(1, L);
  // The canvas lives on the model's device: each step gathers its tokens there and commits there
  // (blockbatch::commit_), so the host only reads back the step's counts.
  std::vector<int64_t> init(L, c.mask_token_id);
  std::copy(prompt.begin(), prompt.end(), init.begin());
  const at::Tensor canvas = at::from_blob(init.data(), {L}, at::kLong).to(model.device(), false, /*copy=*/true);

  for (int64_t block = 0; block < num_blocks; ++block) {
    const int64_t s = lp + block * b, e = s + b;
    const std::vector<int64_t> schedule =
        o.commit() == CommitRule::kFixed ? fixed_schedule(b, steps_per_block) : std::vector<int64_t>();
    int64_t masks_left = b, eos_in_block = 0;  // a block starts all masks
    // Bound: every step commits at least one token (or fails below), so a block takes at most b
    // steps; the fixed schedule has exactly steps_per_block entries summing to b.
    const int64_t max_steps = schedule.empty() ? b : static_cast<int64_t>(schedule.size());
    for (int64_t step = 0; masks_left > 0; ++step) {
      stop.check(st.nfe_full + st.nfe_block, canvas);
      if (step >= max_steps) {
        Stop::no_progress(static_cast<int64_t>(st.steps.size()), "block " + std::to_string(block) + ", positions [" +
                          std::to_string(s) + ", " + std::to_string(e) + "): the fixed schedule's " +
                          std::to_string(max_steps) + " steps left " + std::to_string(masks_left) + " masks");
      }
      PackedQueries q;
      KvMode mode;
      const bool full = o.policy == Policy::kVanilla || step == 0;
      if (full) {  // whole canvas; at a cached block start its K/V fill the buffer
        q.add_positions(0, L, 0);
        for (int64_t p = s; p < e; ++p) q.logit_index.push_back(p);
        mode = KvMode::kFull;
        st.nfe_full += 1;
      } else if (o.policy == Policy::kDual) {  // the block against the whole cached canvas
        q.add_positions(s, e, 0);
        mode = KvMode::kDual;
        st.nfe_block += 1;
      } else {  // prefix: block + whole suffix against the frozen prefix [0, s)
        q.add_positions(s, L, 0);
        q.prefix_lens.push_back(s);
        for (int64_t i = 0; i < b; ++i) q.logit_index.push_back(i);
        mode = KvMode::kPrefix;
        st.nfe_block += 1;
      }
      // Index buffer: the forward's indices, then the commit window and the fixed rule's count.
      std::vector<int64_t> buffer = q.host_buffer(mode);
      const int64_t base = static_cast<int64_t>(buffer.size());
      for (int64_t p = s; p < e; ++p) buffer.push_back(p);
      buffer.push_back(schedule.empty() ? 0 : schedule.at(step));
      const StepRunner::Key key{static_cast<int64_t>(mode), q.size(), static_cast<int64_t>(q.logit_index.size()), b,
                                kv.defined() ? 1 : 0, sampling ? 1 : 0};
      auto commit = [&](const at::Tensor& dev, const at::Tensor& token, const at::Tensor& conf) {
        return ops::commit_(canvas, dev.narrow(0, base, b), token, conf, dev.narrow(0, base + b, 1), c.mask_token_id,
                            c.eos_token_id, rule, o.threshold.value_or(1.0), o.factor.value_or(1.0));
      };
      StepRunner::Output out = runner.run(buffer, key, [&](const at::Tensor& dev) {
        StepRunner::Body body;
        body.logits = model.forward(q.batch(dev, kv, mode, canvas));
        if (sampling) {  // proposals come from the seeded host generator (the reference's draws)
          body.readout = {body.logits.to(at::kDouble)};
        } else {
          auto [token, conf] = ops::confidence(body.logits.contiguous(), c.mask_token_id);
          body.readout = {commit(dev, token, conf)};
        }
        return body;
      });
      at::Tensor counts = sampling ? at::Tensor() : out.host[0];
      if (sampling) {  // commit the host proposals: window and count from the same index buffer
        const Proposals prop = sample_proposals(out.host[0], c.mask_token_id, o.temperature, generator);
        const at::Tensor dev = at::from_blob(buffer.data(), {base + b + 1}, at::kLong).to(model.device(), false, true);
        counts = commit(dev, at::tensor(prop.token, at::kLong).to(model.device()),
                        at::tensor(prop.conf, at::kDouble).to(model.device()))
                     .cpu();
      }
      const int64_t committed = counts.const_data_ptr<int64_t>()[0];
      masks_left = counts.const_data_ptr<int64_t>()[1];
      eos_in_block = counts.const_data_ptr<int64_t>()[2];
      st.steps.push_back({committed, q.size()});
      st.branches[0].committed += committed;
      if (committed == 0 && masks_left > 0) {
        Stop::no_progress(static_cast<int64_t>(st.steps.size()) - 1, "block " + std::to_string(block) +
                          ", positions [" + std::to_string(s) + ", " + std::to_string(e) + ")");
      }
    }
    // Earlier blocks held no EOS (the loop would have stopped), so an EOS in [lp, e) is in this block.
    if (*o.stop_on_eos && eos_in_block) {
      canvas.narrow(0, e, L - e).fill_(c.eos_token_id);
      break;
    }
  }
  const at::Tensor tokens = canvas.cpu();
  res.tokens.assign(tokens.const_data_ptr<int64_t>(), tokens.const_data_ptr<int64_t>() + L);
  st.nfe = st.nfe_full + st.nfe_block;
  st.nfe_paper = st.nfe;
  st.branches[0].forwards = st.nfe;
  st.winner_block_size = b;
  st.graph_captures = runner.captures();
  st.graph_replays = runner.replays();
  st.wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace blockbatch
