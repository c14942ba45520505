// torch.classes.blockbatch.Scheduler: the step-wise scheduler (decode/scheduler.h) for Python's
// blockbatch.scheduler driver. Every method is called from Python with the GIL released (TorchBind
// methods run without it), so step() blocks only the driver thread.
#include <ATen/ops/tensor.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "decode/batch/scheduler.h"
#include "decode/refused.h"
#include "torch/model_handle.h"
#include "torch/options_handle.h"
#include "torch/results.h"

namespace blockbatch {

namespace {

class SchedulerHandle : public torch::CustomClassHolder {
 public:
  SchedulerHandle(c10::intrusive_ptr<ModelHandle> model, int64_t max_batch, int64_t max_length, int64_t kv_budget_bytes,
                  std::vector<int64_t> curve_tokens, std::vector<double> curve_seconds, double calibrate_s,
                  int64_t kv_page_len, bool prefix_cache)
      : model_(std::move(model)),
        scheduler_(std::make_unique<Scheduler>(model_->network(), max_batch, max_length, kv_budget_bytes,
                                               StepCurve{std::move(curve_tokens), std::move(curve_seconds)},
                                               calibrate_s, false, kv_page_len, prefix_cache)) {}

  int64_t add(const at::Tensor& prompt, const OptionsPtr& options, bool stream) {
    return scheduler_->add(prompt_ids(prompt, "prompt"), options->options, stream);
  }
  bool cancel(int64_t id) { return scheduler_->cancel(id); }
  int64_t step(double timeout_s) { return scheduler_->step(timeout_s); }

  // One record per event (Python: blockbatch.scheduler.EventRecord): id, kind ("tokens",
  // "finished", "failed", "cancelled"), offset (tokens: generation positions streamed before),
  // tokens (tokens: the new stable ids; finished: [prompt | generation]), error (the message),
  // error_kind (failed / cancelled: a name of the ERROR_KINDS table: timeout, cancelled, a
  // refusal's kind, decode_failed; "" otherwise), error_param (the argument a refusal names), and
  // for finished events the counters, step log, branch stats and logprobs as the decode op returns them
  // (tokens events with the logprobs option: the rows of their tokens).
  using Record = std::tuple<int64_t, std::string, int64_t, at::Tensor, std::string, std::string, std::string,
                            std::vector<at::Tensor>>;
  std::vector<Record> events() {
    std::vector<Record> out;
    for (const RequestEvent& ev : scheduler_->events()) {
      const bool final = ev.kind == RequestEvent::kFailed || ev.kind == RequestEvent::kCancelled;
      std::vector<at::Tensor> result;
      at::Tensor tokens;
      if (ev.kind == RequestEvent::kFinished) {
        result = result_tensors(ev.tokens, ev.stats, ev.logprobs);
        tokens = result[0];
        result.erase(result.begin());
      } else {
        tokens = at::tensor(ev.tokens, at::kLong);
        if (ev.logprobs.defined()) result.push_back(ev.logprobs);  // tokens: their logprob rows
      }
      out.emplace_back(ev.id, RequestEvent::kind_name(ev.kind), ev.offset, tokens, ev.error,
                       final ? error_kind_name(ev.error_kind) : "", ev.error_param, std::move(result));
    }
    return out;
  }

  c10::Dict<std::string, int64_t> counters() const {
    const Scheduler::Counters k = scheduler_->counters();
    c10::Dict<std::string, int64_t> d;
    d.insert("queued", k.queued);
    d.insert("running", k.running);
    d.insert("packed_forwards", k.steps);
    d.insert("request_forwards", k.forwards);
    d.insert("kv_pool_rows", k.pool_rows);
    d.insert("kv_rows_in_use", k.rows_in_use);
    d.insert("kv_row_bytes", k.row_bytes);
    d.insert("max_length", k.max_length);
    d.insert("max_batch", k.max_batch);
    d.insert("padded_forwards", k.padded);
    d.insert("graph_captures", k.graph_captures);
    d.insert("graph_replays", k.graph_replays);
    d.insert("kv_pages", k.kv_pages);
    d.insert("kv_pages_in_use", k.kv_pages_in_use);
    d.insert("kv_page_len", k.kv_page_len);
    d.insert("kv_paged", k.kv_paged);
    d.insert("prefix_cache_blocks", k.prefix_cache_blocks);
    d.insert("prefix_cache_pages", k.prefix_cache_pages);
    d.insert("prefix_cache_evictions", k.prefix_cache_evictions);
    d.insert("prefix_cache_hit_tokens", k.prefix_cache_hit_tokens);
    return d;
  }
  void close() { scheduler_->close(); }
  std::tuple<std::vector<int64_t>, std::vector<double>> step_curve() const {
    return {scheduler_->step_curve().tokens, scheduler_->step_curve().seconds};
  }

 private:
  c10::intrusive_ptr<ModelHandle> model_;  // outlives the scheduler, which holds a reference to it
  std::unique_ptr<Scheduler> scheduler_;
};

// KV rows a request holds and the bytes of one row: the memory report's arithmetic.
std::tuple<int64_t, int64_t> kv_request_rows(const c10::intrusive_ptr<ModelHandle>& model, const OptionsPtr& options,
                                             int64_t length) {
  const Network& net = model->network();
  const DecodeOptions o = decode_options_for(net.config(), options->options);
  return {kv_rows_needed(o), kv_row_bytes(net.config(), net.dtype(), length)};
}

// The positions and KV rows a prompt of prompt_length tokens takes with `options` on `model`
// (decode/admit.h admit_sizes: the options resolved, their ranges checked, nothing else):
// (canvas_length, kv_rows). Python's length checks ask it instead of adding prompt and gen_length.
std::tuple<int64_t, int64_t> admit_op(const c10::intrusive_ptr<ModelHandle>& model, int64_t prompt_length,
                                      const OptionsPtr& options) {
  const Admitted a = admit_sizes(model->network().config(), prompt_length, options->options);
  return {a.canvas_length, a.kv_rows};
}

// The pool a Scheduler with these arguments would take, checked without allocating it
// (decode/scheduler.h scheduler_pool_rows): (KV rows, bytes per row).
std::tuple<int64_t, int64_t> check_kv_pool(const c10::intrusive_ptr<ModelHandle>& model, int64_t max_batch,
                                           int64_t max_length, int64_t kv_budget_bytes, int64_t kv_page_len) {
  const Network& net = model->network();
  const int64_t rows = scheduler_pool_rows(net, max_batch, max_length, kv_budget_bytes, false, kv_page_len);
  const int64_t page_len = resolve_kv_page_len(net.device(), kv_page_len);
  return {rows, kv_row_bytes(net.config(), net.dtype(), pool_row_length(max_length, page_len))};
}

std::tuple<std::vector<int64_t>, std::vector<double>> measure_step_curve_op(
    const c10::intrusive_ptr<ModelHandle>& model, double limit_s) {
  TORCH_CHECK_VALUE(limit_s > 0, "limit_s must be > 0, got ", limit_s);
  const StepCurve c = measure_step_curve(model->network(), limit_s);
  return {c.tokens, c.seconds};
}

std::vector<int64_t> budget_branches_op(const std::vector<int64_t>& sizes, int64_t block_length, int64_t load,
                                        std::vector<int64_t> curve_tokens, std::vector<double> curve_seconds) {
  TORCH_CHECK_VALUE(curve_tokens.size() == curve_seconds.size(), "curve_tokens and curve_seconds differ in length");
  return budget_branches(sizes, block_length, load, StepCurve{std::move(curve_tokens), std::move(curve_seconds)});
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(blockbatch, m) {
  using Handle = c10::intrusive_ptr<SchedulerHandle>;
  m.class_<SchedulerHandle>("Scheduler")
      .def(torch::init<c10::intrusive_ptr<ModelHandle>, int64_t, int64_t, int64_t, std::vector<int64_t>,
                       std::vector<double>, double, int64_t, bool>())
      .def("add", &SchedulerHandle::add)
      .def("cancel", &SchedulerHandle::cancel)
      .def("step", &SchedulerHandle::step)
      .def("events", &SchedulerHandle::events)
      .def("counters", &SchedulerHandle::counters)
      .def("close", &SchedulerHandle::close)
      .def("step_curve", &SchedulerHandle::step_curve)
      .def("__len__",
           [](const Handle&) -> int64_t { TORCH_CHECK_TYPE(false, "object of type Scheduler has no len()"); });
  // The last refusal (decode/refused.h) raised on the calling thread, then forgotten: (kind, param,
  // message), empty strings when none. Python asks it right after catching a ValueError from an op
  // (blockbatch.errors.RequestError).
  m.def("last_refusal() -> (str, str, str)", []() -> std::tuple<std::string, std::string, std::string> {
    RefusalRecord r = take_last_refusal();
    return {std::move(r.kind), std::move(r.param), std::move(r.message)};
  });
  // (KV rows one request with these options holds, bytes per row of `length` positions).
  m.def("kv_request_rows(__torch__.torch.classes.blockbatch.Model model, "
        "__torch__.torch.classes.blockbatch.Options options, int length) -> (int, int)",
        &kv_request_rows);
  // (canvas_length, kv_rows) of a prompt of prompt_length tokens with these options: its positions
  // (policy block: rounded up to whole blocks) and KV rows, as decode and the scheduler admit it.
  m.def("admit(__torch__.torch.classes.blockbatch.Model model, int prompt_length, "
        "__torch__.torch.classes.blockbatch.Options options) -> (int, int)",
        &admit_op);
  // (KV rows, bytes per row) of the pool a Scheduler(model, max_batch, max_length, kv_budget_bytes,
  // kv_page_len) takes (paged: rows of max_length rounded up to whole pages, as pages); ValueError
  // when it cannot (an argument out of range, more than the device's memory).
  m.def("check_kv_pool(__torch__.torch.classes.blockbatch.Model model, int max_batch, int max_length, "
        "int kv_budget_bytes, int kv_page_len=-1) -> (int, int)",
        &check_kv_pool);
  // The step-time curve (seconds of one packed forward by query tokens; decode/scheduler.h).
  m.def("measure_step_curve(__torch__.torch.classes.blockbatch.Model model, float limit_s=1.0) -> (int[], float[])",
        &measure_step_curve_op);
  // The block sizes branch_budget = auto keeps at a load (decode/scheduler.h budget_branches).
  m.def("budget_branches(int[] sizes, int block_length, int load, int[] curve_tokens, float[] curve_seconds) -> int[]",
        &budget_branches_op);
}

}  // namespace blockbatch
