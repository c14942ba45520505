// The commit rules of the block-causal decoders (LLaDA2.0 / 2.1, ALGORITHMS.md 11), shared by policy
// 'block' (block.cpp) and policy 'wavefront' (wavefront.cpp): the proposals of a block's logits, the
// threshold commit of its masks and LLaDA2.1's token edits. Both policies decide a step on the blocks
// as the step found them, then write commits and edits together.
#pragma once

#include <ATen/TensorOperators.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/topk.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

namespace blockbatch::block_rules {

// The authors' proposals of logits rows [n, vocab]: the argmax of the float32 logits (the first index of
// the maximum; ids at or past `proposal_limit` are never proposed; the mask id is not excluded) and its
// float32 softmax probability, both on the host ([n] int64, [n] float32).
struct Proposals {
  at::Tensor token, conf;
};
inline Proposals proposals(const at::Tensor& logits, int64_t proposal_limit) {
  const at::Tensor l = logits.to(at::kFloat);
  const at::Tensor x0 = l.narrow(1, 0, proposal_limit).argmax(-1);
  const at::Tensor conf = at::softmax(l, -1).gather(-1, x0.unsqueeze(-1)).squeeze(-1).cpu().contiguous();
  return {x0.cpu().contiguous(), conf};
}

// The masks (active[i]) of a block of active.size() positions to commit: those rated > threshold if at
// least `at_least` are, else the `at_least` most confident (at::topk over the block, -inf where no mask:
// the authors' torch.topk order on ties). `conf`: the block's confidences.
inline std::vector<int64_t> commit_masks(const std::vector<bool>& active, const float* conf, float threshold,
                                         int64_t at_least) {
  const int64_t n = static_cast<int64_t>(active.size());
  std::vector<int64_t> high;
  int64_t masks = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!active[i]) continue;
    ++masks;
    if (conf[i] > threshold) high.push_back(i);
  }
  if (static_cast<int64_t>(high.size()) >= at_least) return high;
  std::vector<float> ranked(n, -std::numeric_limits<float>::infinity());
  for (int64_t i = 0; i < n; ++i) {
    if (active[i]) ranked[i] = conf[i];
  }
  const at::Tensor row = at::from_blob(ranked.data(), {n}, at::kFloat);
  const at::Tensor idx = std::get<1>(at::topk(row, std::min(at_least, masks))).contiguous();
  const int64_t* ip = idx.const_data_ptr<int64_t>();
  return std::vector<int64_t>(ip, ip + idx.numel());
}

// LLaDA2.1's edits of a block starting at canvas position `start`: every decided (not active), generated
// (position >= prompt_length) position whose proposal differs from its token with confidence above
// `edit_threshold`. Offsets in the block.
inline std::vector<int64_t> edits(const std::vector<bool>& active, const std::vector<int64_t>& canvas, int64_t start,
                                  int64_t prompt_length, const int64_t* token, const float* conf,
                                  float edit_threshold) {
  std::vector<int64_t> out;
  const int64_t n = static_cast<int64_t>(active.size());
  for (int64_t i = 0; i < n; ++i) {
    if (!active[i] && start + i >= prompt_length && conf[i] > edit_threshold && token[i] != canvas[start + i]) {
      out.push_back(i);
    }
  }
  return out;
}

// LLaDA2.1 under stop_on_eos: the decode ends at a finished block ending at `end` when the generation up
// to it holds EOS and no mask.
inline bool eos_ends_generation(const std::vector<int64_t>& canvas, int64_t prompt_length, int64_t end, int64_t eos,
                                int64_t mask) {
  const auto gen = canvas.begin() + std::min(prompt_length, end), stop = canvas.begin() + end;
  return std::find(gen, stop, eos) != stop && std::find(gen, stop, mask) == stop;
}

}  // namespace blockbatch::block_rules
