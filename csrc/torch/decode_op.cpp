// torch.ops.blockbatch.decode: the whole generation of one request inside C++.
#include <ATen/ops/from_blob.h>
#include <ATen/ops/tensor.h>
#include <torch/library.h>

#include "decode/decode.h"
#include "torch/model_handle.h"

namespace blockbatch {

namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> decode_op(
    const c10::intrusive_ptr<ModelHandle>& model, const at::Tensor& prompt_ids, const std::string& policy,
    int64_t gen_length, int64_t block_length, int64_t steps, const std::string& commit, double threshold,
    double factor, double temperature, int64_t seed, bool stop_on_eos, c10::IntArrayRef block_sizes,
    double merge_gate, int64_t sync_gap, int64_t refresh_tokens, const std::string& refresh_mode,
    double prob_floor, bool merge, bool sync, bool cuda_graphs, double timeout_s,
    const std::optional<at::Tensor>& cancel) {
  TORCH_CHECK_TYPE(prompt_ids.scalar_type() == at::kLong, "prompt_ids must be int64, got ", prompt_ids.scalar_type());
  TORCH_CHECK_VALUE(prompt_ids.dim() == 1, "prompt_ids must be 1-D [prompt_length], got shape ", prompt_ids.sizes());
  at::Tensor prompt_cpu = prompt_ids.cpu().contiguous();
  std::vector<int64_t> prompt(prompt_cpu.const_data_ptr<int64_t>(),
                              prompt_cpu.const_data_ptr<int64_t>() + prompt_cpu.numel());
  DecodeOptions o;
  o.policy = parse_policy(policy);
  o.gen_length = gen_length;
  o.block_length = block_length;
  o.steps = steps;
  o.commit = parse_commit_rule(commit);
  o.threshold = threshold;
  o.factor = factor;
  o.temperature = temperature;
  o.seed = seed;
  o.stop_on_eos = stop_on_eos;
  o.block_sizes.assign(block_sizes.begin(), block_sizes.end());
  std::sort(o.block_sizes.begin(), o.block_sizes.end());  // branch order never depends on the caller's
  o.merge_gate = merge_gate;
  o.sync_gap = sync_gap;
  o.refresh_tokens = refresh_tokens;
  o.refresh_mode = parse_refresh_mode(refresh_mode);
  o.prob_floor = prob_floor;
  o.merge = merge;
  o.sync = sync;
  o.cuda_graphs = cuda_graphs;
  o.timeout_s = timeout_s;
  const int64_t* cancel_flag = nullptr;
  if (cancel.has_value()) {
    TORCH_CHECK_TYPE(cancel->scalar_type() == at::kLong, "cancel must be int64, got ", cancel->scalar_type());
    TORCH_CHECK_VALUE(cancel->device().is_cpu() && cancel->numel() == 1 && cancel->is_contiguous(),
                      "cancel must be a one-element int64 CPU tensor, got shape ", cancel->sizes(), " on ",
                      cancel->device());
    cancel_flag = cancel->const_data_ptr<int64_t>();
  }

  DecodeResult r = decode(*model, prompt, o, cancel_flag);
  at::Tensor tokens = at::tensor(r.tokens, at::kLong);
  at::Tensor stats = at::tensor(decode_stat_values(r.stats), at::kDouble);
  std::vector<int64_t> log;
  for (const auto& s : r.stats.steps) log.insert(log.end(), s.begin(), s.end());
  at::Tensor step_log = at::tensor(log, at::kLong).view({-1, 2});
  std::vector<int64_t> branches;
  for (const auto& b : r.stats.branches) {
    branches.insert(branches.end(), {b.block_size, b.committed, b.merged, b.copied, b.forwards});
  }
  at::Tensor branch_stats = at::tensor(branches, at::kLong).view({-1, 5});
  return {tokens, stats, step_log, branch_stats};
}

std::vector<std::string> decode_stat_names_op() { return decode_stat_names(); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(blockbatch, m) {
  // Decode one request (ALGORITHMS.md 1-4) entirely in C++: policy vanilla | prefix | dual |
  // blockbatch; commit threshold | fixed | factor. timeout_s > 0: fail once that many seconds
  // pass; cancel: a one-element int64 CPU tensor another thread sets to nonzero to stop the
  // decode within one forward (both checked before every forward). Returns the canvas [prompt | generation],
  // the scalar counters (names: decode_stat_names), a per-forward log [forwards, 2] (tokens
  // committed, packed query tokens) and per-branch stats [branches, 5] (block size, committed,
  // merged, copied, forwards).
  m.def("decode(__torch__.torch.classes.blockbatch.Model model, Tensor prompt_ids, str policy=\"dual\", "
        "int gen_length=128, int block_length=32, int steps=0, str commit=\"threshold\", float threshold=0.9, "
        "float factor=1.0, float temperature=0.0, int seed=0, bool stop_on_eos=False, "
        "int[] block_sizes=[4, 8, 16, 32, 64, 128], float merge_gate=0.5, int sync_gap=8, "
        "int refresh_tokens=32, str refresh_mode=\"periodic\", float prob_floor=0.1, bool merge=True, "
        "bool sync=True, bool cuda_graphs=True, float timeout_s=0.0, Tensor? cancel=None) "
        "-> (Tensor tokens, Tensor stats, Tensor step_log, Tensor branch_stats)");
  // Names of decode's scalar counters, in order.
  m.def("decode_stat_names() -> str[]", &decode_stat_names_op);
}

TORCH_LIBRARY_IMPL(blockbatch, CPU, m) { m.impl("decode", &decode_op); }
TORCH_LIBRARY_IMPL(blockbatch, CUDA, m) { m.impl("decode", &decode_op); }

}  // namespace blockbatch
