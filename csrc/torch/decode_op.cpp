// torch.ops.blockbatch.decode (the whole generation of one request inside C++), check_options
// (the options' validator, for Python's DecodeOptions) and check_config (the model config's).
//
// The options are keyword-only and read by name from the boxed call (decode_args.h, generated
// from python/blockbatch/contract.py), so no C++ signature repeats the schema's argument order.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/tensor.h>
#include <torch/library.h>

#include <string>

#include "decode/decode.h"
#include "decode/batch/scheduler.h"
#include "torch/decode_args.h"
#include "torch/model_handle.h"
#include "torch/results.h"

namespace blockbatch {

namespace {

const std::string& decode_schema() {
  // Defaults and types of every option come from the table; see README "Decode options".
  static const std::string s =
      std::string("decode(__torch__.torch.classes.blockbatch.Model model, Tensor prompt_ids, *, ") +
      kDecodeOptionsSchema +
      ", Tensor? cancel=None) -> (Tensor tokens, Tensor stats, Tensor step_log, Tensor branch_stats)";
  return s;
}

const std::string& check_options_schema() {
  static const std::string s = std::string("check_options(*, ") + kDecodeOptionsSchema + ") -> ()";
  return s;
}

// The call's arguments: the last `n` entries of the stack, in schema order.
const c10::IValue* call_args(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  return stack.data() + (stack.size() - op.schema().arguments().size());
}

void decode_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const c10::IValue* args = call_args(op, *stack);
  auto arg = [&](const char* name) -> const c10::IValue& { return call_arg(schema, args, name); };
  const auto model = arg("model").toCustomClass<ModelHandle>();
  const std::vector<int64_t> prompt = prompt_ids(arg("prompt_ids").toTensor(), "prompt_ids");
  DecodeOptions o = decode_options_from_args(schema, args);
  if (o.block_sizes) std::sort(o.block_sizes->begin(), o.block_sizes->end());  // branch order never depends on the caller's
  const int64_t* cancel_flag = nullptr;
  at::Tensor cancel;  // keeps the flag's storage alive while the decode runs
  if (!arg("cancel").isNone()) {
    cancel = arg("cancel").toTensor();
    TORCH_CHECK_TYPE(cancel.scalar_type() == at::kLong, "cancel must be int64, got ", cancel.scalar_type());
    TORCH_CHECK_VALUE(cancel.device().is_cpu() && cancel.numel() == 1 && cancel.is_contiguous(),
                      "cancel must be a one-element int64 CPU tensor, got shape ", cancel.sizes(), " on ",
                      cancel.device());
    cancel_flag = cancel.const_data_ptr<int64_t>();
  }

  const DecodeResult r = decode(*model, prompt, o, cancel_flag);
  const std::vector<at::Tensor> out = result_tensors(r.tokens, r.stats);
  torch::jit::drop(*stack, schema.arguments().size());
  torch::jit::push(*stack, out[0], out[1], out[2], out[3]);
}

void check_options_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const DecodeOptions o = decode_options_from_args(op.schema(), call_args(op, *stack));
  torch::jit::drop(*stack, op.schema().arguments().size());
  o.check();
}

void check_config_op(const c10::Dict<std::string, int64_t>& ints, const c10::Dict<std::string, double>& floats) {
  config_from_dicts(ints, floats);  // validates
}

c10::Dict<std::string, int64_t> config_limits_op() {
  c10::Dict<std::string, int64_t> d;
  d.insert("max_sequence_length", kMaxSequenceLength);
  d.insert("layers", kMaxLayers);
  d.insert("dim", kMaxDim);
  d.insert("rope_elements", kMaxRopeElements);
  return d;
}

std::vector<std::string> decode_stat_names_op() { return decode_stat_names(); }

std::tuple<std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<at::Tensor>, std::vector<at::Tensor>,
           std::vector<int64_t>>
decode_batch_op(const c10::intrusive_ptr<ModelHandle>& model, const std::vector<at::Tensor>& prompts,
                const std::vector<std::string>& options, int64_t max_batch, int64_t kv_budget_bytes,
                const std::optional<at::Tensor>& cancel, std::vector<int64_t> curve_tokens,
                std::vector<double> curve_seconds, bool pad_packs) {
  std::vector<std::vector<int64_t>> ids;
  for (size_t i = 0; i < prompts.size(); ++i) ids.push_back(prompt_ids(prompts[i], "prompts[" + std::to_string(i) + "]"));
  std::vector<DecodeOptions> opts;
  for (size_t i = 0; i < options.size(); ++i) opts.push_back(options_from_text(options[i], static_cast<int64_t>(i)));
  const int64_t* cancel_flag = nullptr;
  if (cancel) {
    TORCH_CHECK_VALUE(cancel->scalar_type() == at::kLong && cancel->device().is_cpu() && cancel->numel() == 1 &&
                          cancel->is_contiguous(), "cancel must be a one-element int64 CPU tensor");
    cancel_flag = cancel->const_data_ptr<int64_t>();
  }
  BatchStats bs;
  std::vector<DecodeResult> results = decode_batch(*model, ids, opts, max_batch, kv_budget_bytes, cancel_flag, &bs,
                                                     StepCurve{std::move(curve_tokens), std::move(curve_seconds)},
                                                     pad_packs);
  std::vector<at::Tensor> tokens, stats, logs, branches;
  for (const DecodeResult& r : results) {
    const std::vector<at::Tensor> t = result_tensors(r.tokens, r.stats);
    tokens.push_back(t[0]);
    stats.push_back(t[1]);
    logs.push_back(t[2]);
    branches.push_back(t[3]);
  }
  return {tokens, stats, logs, branches,
          {bs.steps, bs.forwards, bs.pool_rows, bs.row_bytes, bs.padded, bs.graph_captures, bs.graph_replays}};
}

}  // namespace

std::vector<at::Tensor> result_tensors(const std::vector<int64_t>& tokens, const DecodeStats& stats) {
  std::vector<int64_t> log, branches;
  for (const auto& s : stats.steps) log.insert(log.end(), s.begin(), s.end());
  for (const auto& b : stats.branches) {
    branches.insert(branches.end(), {b.block_size, b.committed, b.merged, b.copied, b.forwards});
  }
  return {at::tensor(tokens, at::kLong), at::tensor(decode_stat_values(stats), at::kDouble),
          at::tensor(log, at::kLong).view({-1, 2}), at::tensor(branches, at::kLong).view({-1, 5})};
}

std::vector<int64_t> prompt_ids(const at::Tensor& prompt, const std::string& what) {
  TORCH_CHECK_TYPE(prompt.scalar_type() == at::kLong, what, " must be int64, got ", prompt.scalar_type());
  TORCH_CHECK_VALUE(prompt.dim() == 1, what, " must be 1-D [prompt_length], got shape ", prompt.sizes());
  const at::Tensor h = prompt.cpu().contiguous();
  return std::vector<int64_t>(h.const_data_ptr<int64_t>(), h.const_data_ptr<int64_t>() + h.numel());
}

// One request's options from "name=value" lines (set_option's text forms; "none" for None).
DecodeOptions options_from_text(const std::string& text, int64_t request) {
  DecodeOptions o;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(at, end - at);
    at = end + 1;
    if (line.empty()) continue;
    const size_t eq = line.find('=');
    TORCH_CHECK_VALUE(eq != std::string::npos, "options[", request, "]: expected name=value lines, got '", line, "'");
    const std::string name = line.substr(0, eq);
    TORCH_CHECK_VALUE(set_option(o, name, line.substr(eq + 1)), "options[", request, "]: unknown option '", name, "'");
  }
  return o;
}

TORCH_LIBRARY_FRAGMENT(blockbatch, m) {
  // Decode one request (docs/ALGORITHMS.md 1-4) entirely in C++; the options (keyword-only) are
  // the table of python/blockbatch/contract.py. timeout_s > 0: fail once that many seconds pass;
  // cancel: a one-element int64 CPU tensor another thread sets to nonzero to stop the decode
  // within one forward (both checked before every forward). Returns the canvas
  // [prompt | generation], the scalar counters (names: decode_stat_names), a per-forward log
  // [forwards, 2] (tokens committed, packed query tokens) and per-branch stats [branches, 5]
  // (block size, committed, merged, copied, forwards).
  m.def(decode_schema().c_str());
  // The options' checks that need no model (DecodeOptions::check): raises ValueError naming the
  // option; Python's DecodeOptions calls it, so both languages give the same message.
  m.def(check_options_schema().c_str(), torch::CppFunction::makeFromBoxedFunction<&check_options_boxed>());
  // The model config's validator (ModelConfig::validate), for Python's ModelConfig.validate.
  m.def("check_config(Dict(str, int) ints, Dict(str, float) floats) -> ()", &check_config_op);
  // Its bounds (csrc/model/config.h), for Python's ModelConfig module constants.
  m.def("config_limits() -> Dict(str, int)", &config_limits_op);
  // Names of decode's scalar counters, in order.
  m.def("decode_stat_names() -> str[]", &decode_stat_names_op);
  // Many requests at once (csrc/decode/batching.h): prompts[i] decodes with options[i] ("name=value"
  // lines, the same names and text forms as bb_bench_decode's flags; unset: the table's default);
  // up to max_batch decode together, their forwards packed into one per step; each result equals
  // decode() of that request alone. kv_budget_bytes: the shared KV pool (0: room for the max_batch
  // largest requests). curve_*: the step-time curve for branch_budget = auto requests (points of
  // measure_step_curve; empty: measured). Returns per request what decode returns, and the batch's counters
  // [packed forwards, request forwards, pool rows, bytes per row].
  m.def("decode_batch(__torch__.torch.classes.blockbatch.Model model, Tensor[] prompts, str[] options, "
        "int max_batch=8, int kv_budget_bytes=0, Tensor? cancel=None, int[] curve_tokens=[], "
        "float[] curve_seconds=[], bool pad_packs=False) -> (Tensor[] tokens, Tensor[] stats, "
        "Tensor[] step_logs, Tensor[] branch_stats, int[] batch_stats)",
        &decode_batch_op);
}

TORCH_LIBRARY_IMPL(blockbatch, CPU, m) { m.impl("decode", torch::CppFunction::makeFromBoxedFunction<&decode_boxed>()); }
TORCH_LIBRARY_IMPL(blockbatch, CUDA, m) { m.impl("decode", torch::CppFunction::makeFromBoxedFunction<&decode_boxed>()); }

}  // namespace blockbatch
