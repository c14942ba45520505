// torch.ops.blockbatch.decode (the whole generation of one request inside C++), options (the
// typed options object every entry point takes, built and checked once), check_options (the
// options' validator) and check_config (the model config's).
//
// The options are keyword-only and read by name from the boxed call (decode_args.h, generated
// from python/blockbatch/contract.py), so no C++ signature repeats the schema's argument order.
// decode.typed takes the Options object instead (Python's path: built once per DecodeOptions).
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/tensor.h>
#include <torch/library.h>

#include <string>

#include "decode/decode.h"
#include "decode/batch/scheduler.h"
#include "torch/decode_args.h"
#include "torch/model_handle.h"
#include "torch/options_handle.h"
#include "torch/results.h"

namespace blockbatch {

namespace {

const std::string& decode_schema() {
  // Defaults and types of every option come from the table; see docs/options.md.
  static const std::string s =
      std::string("decode(__torch__.torch.classes.blockbatch.Model model, Tensor prompt_ids, *, ") +
      kDecodeOptionsSchema +
      ", Tensor? cancel=None) -> (Tensor tokens, Tensor stats, Tensor step_log, Tensor branch_stats, Tensor logprobs)";
  return s;
}

const std::string& options_schema() {
  static const std::string s =
      std::string("options(*, ") + kDecodeOptionsSchema + ") -> __torch__.torch.classes.blockbatch.Options";
  return s;
}

// The call's arguments: the last `n` entries of the stack, in schema order.
const c10::IValue* call_args(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  return stack.data() + (stack.size() - op.schema().arguments().size());
}

// The cancel tensor's flag and, in a second element, where the StopReason is written.
struct CancelArg {
  at::Tensor keep;  // the flag's storage, alive while the decode runs
  const int64_t* flag = nullptr;
  int64_t* reason = nullptr;
};
CancelArg cancel_arg(const std::optional<at::Tensor>& cancel) {
  CancelArg c;
  if (!cancel) return c;
  c.keep = *cancel;
  TORCH_CHECK_TYPE(c.keep.scalar_type() == at::kLong, "cancel must be int64, got ", c.keep.scalar_type());
  TORCH_CHECK_VALUE(c.keep.device().is_cpu() && (c.keep.numel() == 1 || c.keep.numel() == 2) && c.keep.is_contiguous(),
                    "cancel must be a one- or two-element int64 CPU tensor (the flag, then where the stop reason is "
                    "written), got shape ",
                    c.keep.sizes(), " on ", c.keep.device());
  c.flag = c.keep.const_data_ptr<int64_t>();
  if (c.keep.numel() == 2) c.reason = c.keep.mutable_data_ptr<int64_t>() + 1;
  return c;
}

std::optional<at::Tensor> optional_tensor(const c10::IValue& v) {
  return v.isNone() ? std::nullopt : std::optional<at::Tensor>(v.toTensor());
}

void decode_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  const c10::IValue* args = call_args(op, *stack);
  auto arg = [&](const char* name) -> const c10::IValue& { return call_arg(schema, args, name); };
  const auto model = arg("model").toCustomClass<ModelHandle>();
  const std::vector<int64_t> prompt = prompt_ids(arg("prompt_ids").toTensor(), "prompt_ids");
  DecodeOptions o = decode_options_from_args(schema, args);
  // sorted: branch order never depends on the caller's
  if (o.block_sizes) std::sort(o.block_sizes->begin(), o.block_sizes->end());
  const CancelArg cancel = cancel_arg(optional_tensor(arg("cancel")));
  const DecodeResult r = decode(*model, prompt, o, cancel.flag, nullptr, cancel.reason);
  const std::vector<at::Tensor> out = result_tensors(r.tokens, r.stats, r.logprobs);
  torch::jit::drop(*stack, schema.arguments().size());
  torch::jit::push(*stack, out[0], out[1], out[2], out[3], out[4]);
}

// decode.typed: the options as one Options object; curve: the step-time curve of branch_budget =
// auto (empty: every branch).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> decode_typed(
    const c10::intrusive_ptr<ModelHandle>& model, const at::Tensor& prompt, const OptionsPtr& options,
    const std::optional<at::Tensor>& cancel, std::vector<int64_t> curve_tokens, std::vector<double> curve_seconds) {
  TORCH_CHECK_VALUE(curve_tokens.size() == curve_seconds.size(), "curve_tokens and curve_seconds differ in length");
  const CancelArg c = cancel_arg(cancel);
  const StepCurve curve{std::move(curve_tokens), std::move(curve_seconds)};
  const DecodeResult r = decode(*model, prompt_ids(prompt, "prompt_ids"), options->options, c.flag, nullptr, c.reason,
                                curve.empty() ? nullptr : &curve);
  const std::vector<at::Tensor> out = result_tensors(r.tokens, r.stats, r.logprobs);
  return {out[0], out[1], out[2], out[3], out[4]};
}

void options_boxed(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  DecodeOptions o = decode_options_from_args(op.schema(), call_args(op, *stack));
  torch::jit::drop(*stack, op.schema().arguments().size());
  // sorted: branch order never depends on the caller's
  if (o.block_sizes) std::sort(o.block_sizes->begin(), o.block_sizes->end());
  o.check();
  torch::jit::push(*stack, c10::IValue(c10::make_intrusive<OptionsHandle>(std::move(o))));
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
           std::vector<at::Tensor>, std::vector<int64_t>>
decode_batch_op(const c10::intrusive_ptr<ModelHandle>& model, const std::vector<at::Tensor>& prompts,
                const std::vector<OptionsPtr>& options, int64_t max_batch, int64_t kv_budget_bytes,
                const std::optional<at::Tensor>& cancel, std::vector<int64_t> curve_tokens,
                std::vector<double> curve_seconds, bool pad_packs, bool prefix_cache) {
  std::vector<std::vector<int64_t>> ids;
  for (size_t i = 0; i < prompts.size(); ++i)
    ids.push_back(prompt_ids(prompts[i], "prompts[" + std::to_string(i) + "]"));
  std::vector<DecodeOptions> opts;
  for (const OptionsPtr& o : options) opts.push_back(o->options);
  const CancelArg c = cancel_arg(cancel);
  BatchStats bs;
  std::vector<DecodeResult> results =
      decode_batch(*model, ids, opts, max_batch, kv_budget_bytes, c.flag, c.reason, &bs,
                   StepCurve{std::move(curve_tokens), std::move(curve_seconds)}, pad_packs, prefix_cache);
  std::vector<at::Tensor> tokens, stats, logs, branches, logprobs;
  for (const DecodeResult& r : results) {
    const std::vector<at::Tensor> t = result_tensors(r.tokens, r.stats, r.logprobs);
    tokens.push_back(t[0]);
    stats.push_back(t[1]);
    logs.push_back(t[2]);
    branches.push_back(t[3]);
    logprobs.push_back(t[4]);
  }
  return {
      tokens,   stats,
      logs,     branches,
      logprobs, {bs.steps, bs.forwards, bs.pool_rows, bs.row_bytes, bs.padded, bs.graph_captures, bs.graph_replays}};
}

}  // namespace

std::vector<at::Tensor> result_tensors(const std::vector<int64_t>& tokens, const DecodeStats& stats,
                                       const at::Tensor& logprobs) {
  std::vector<int64_t> log, branches;
  for (const auto& s : stats.steps) log.insert(log.end(), s.begin(), s.end());
  for (const auto& b : stats.branches) {
    branches.insert(branches.end(), {b.block_size, b.committed, b.merged, b.copied, b.forwards});
  }
  return {at::tensor(tokens, at::kLong), at::tensor(decode_stat_values(stats), at::kDouble),
          at::tensor(log, at::kLong).view({-1, 4}), at::tensor(branches, at::kLong).view({-1, 5}),
          logprobs.defined() ? logprobs : at::empty({0, 0}, at::kDouble)};
}

std::vector<int64_t> prompt_ids(const at::Tensor& prompt, const std::string& what) {
  TORCH_CHECK_TYPE(prompt.scalar_type() == at::kLong, what, " must be int64, got ", prompt.scalar_type());
  TORCH_CHECK_VALUE(prompt.dim() == 1, what, " must be 1-D [prompt_length], got shape ", prompt.sizes());
  const at::Tensor h = prompt.cpu().contiguous();
  return std::vector<int64_t>(h.const_data_ptr<int64_t>(), h.const_data_ptr<int64_t>() + h.numel());
}

TORCH_LIBRARY_FRAGMENT(blockbatch, m) {
  // Decode one request (docs/ALGORITHMS.md 1-4) entirely in C++; the options (keyword-only) are
  // the table of python/blockbatch/contract.py. timeout_s > 0: fail once that many seconds pass;
  // cancel: a one-element int64 CPU tensor another thread sets to nonzero to stop the decode
  // within one forward (both checked before every forward). Returns the canvas
  // [prompt | generation], the scalar counters (names: decode_stat_names), a per-forward log
  // [forwards, 2] (tokens committed, packed query tokens) and per-branch stats [branches, 5]
  // (block size, committed, merged, copied, forwards), and the logprobs option's table
  // [gen_length, 1 + 2 k] float64 (the token's log-prob, k ids, their log-probs; [0, 0] when off).
  m.def(decode_schema().c_str());
  // decode with the options as one Options object (below; Python's path), and the step-time curve
  // branch_budget = auto reads (empty: every branch). cancel may have a second element: where the
  // stop reason is written before the op throws (1 cancelled, 2 deadline, 3 no progress).
  m.def("decode.typed(__torch__.torch.classes.blockbatch.Model model, Tensor prompt_ids, "
        "__torch__.torch.classes.blockbatch.Options options, Tensor? cancel=None, int[] curve_tokens=[], "
        "float[] curve_seconds=[]) -> (Tensor tokens, Tensor stats, Tensor step_log, Tensor branch_stats, "
        "Tensor logprobs)",
        &decode_typed);
  // One request's options (keyword-only, the table's) checked once (DecodeOptions::check: ValueError
  // naming the option) into the Options object decode.typed, decode_batch and the Scheduler take.
  m.def(options_schema().c_str(), torch::CppFunction::makeFromBoxedFunction<&options_boxed>());
  // The model config's validator (ModelConfig::validate), for Python's ModelConfig.validate.
  m.def("check_config(Dict(str, int) ints, Dict(str, float) floats) -> ()", &check_config_op);
  // Its bounds (csrc/model/config.h), for Python's ModelConfig module constants.
  m.def("config_limits() -> Dict(str, int)", &config_limits_op);
  // Names of decode's scalar counters, in order.
  m.def("decode_stat_names() -> str[]", &decode_stat_names_op);
  // Many requests at once (csrc/decode/batch/scheduler.h): prompts[i] decodes with options[i];
  // up to max_batch decode together, their forwards packed into one per step; each result equals
  // decode() of that request alone. kv_budget_bytes: the shared KV pool (0: room for the max_batch
  // largest requests). curve_*: the step-time curve for branch_budget = auto requests (points of
  // measure_step_curve; empty: measured); prefix_cache: block-causal requests share their prompts' complete
  // blocks' K/V (decode/batch/prefix_cache.h). Returns per request what decode returns, and the batch's counters
  // [packed forwards, request forwards, pool rows, bytes per row].
  m.def("decode_batch(__torch__.torch.classes.blockbatch.Model model, Tensor[] prompts, "
        "__torch__.torch.classes.blockbatch.Options[] options, "
        "int max_batch=8, int kv_budget_bytes=0, Tensor? cancel=None, int[] curve_tokens=[], "
        "float[] curve_seconds=[], bool pad_packs=False, bool prefix_cache=False) -> (Tensor[] tokens, Tensor[] stats, "
        "Tensor[] step_logs, Tensor[] branch_stats, Tensor[] logprobs, int[] batch_stats)",
        &decode_batch_op);
}

TORCH_LIBRARY_IMPL(blockbatch, CPU, m) { m.impl("decode", torch::CppFunction::makeFromBoxedFunction<&decode_boxed>()); }
TORCH_LIBRARY_IMPL(blockbatch, CUDA, m) {
  m.impl("decode", torch::CppFunction::makeFromBoxedFunction<&decode_boxed>());
}

}  // namespace blockbatch
