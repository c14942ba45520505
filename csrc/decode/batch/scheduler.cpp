#include "decode/batch/scheduler.h"

#include <ATen/ops/from_blob.h>
#include <c10/core/StreamGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "decode/decoder.h"
#include "decode/policies/branch_rows.h"  // shared_prompt_pages
#include "decode/policies/policy.h"
#include "decode/refused.h"
#include "decode/step.h"
#include "decode/stop.h"
#include "kernels/branches.h"  // kMaxBranches: the most KV rows a request holds

namespace blockbatch {

namespace {

RequestEvent cancelled_event(int64_t id, const std::string& why) {
  RequestEvent ev;
  ev.id = id;
  ev.kind = RequestEvent::kCancelled;
  ev.error_kind = ErrorKind::kCancelled;
  try {
    TORCH_CHECK(false, "blockbatch: request ", id, " cancelled ", why);
  } catch (const c10::Error& e) {
    ev.error = e.what_without_backtrace();
    ev.exception = std::current_exception();
  }
  return ev;
}

// The event of a request whose decode threw `error`: kCancelled when its cancel flag was set.
RequestEvent failed_event(int64_t id, std::exception_ptr error, const int64_t& cancel, int64_t reason) {
  RequestEvent ev;
  ev.id = id;
  ev.exception = error;
  ev.reason = reason;
  try {
    std::rethrow_exception(error);
  } catch (const Refused& e) {  // admitted when it started: the options at that load refused
    ev.error = e.what_without_backtrace();
    ev.error_kind = e.kind();
    ev.error_param = e.param();
  } catch (const c10::Error& e) {
    ev.error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    ev.error = e.what();
  } catch (...) {
    ev.error = "unknown error";
  }
  ev.kind = __atomic_load_n(&cancel, __ATOMIC_RELAXED) ? RequestEvent::kCancelled : RequestEvent::kFailed;
  if (reason == kCancelled || ev.kind == RequestEvent::kCancelled) ev.error_kind = ErrorKind::kCancelled;
  if (reason == kDeadline) ev.error_kind = ErrorKind::kTimeout;
  return ev;
}

}  // namespace

const char* RequestEvent::kind_name(Kind kind) {
  switch (kind) {
    case kTokens: return "tokens";
    case kFinished: return "finished";
    case kFailed: return "failed";
    case kCancelled: return "cancelled";
  }
  return "";
}

struct Scheduler::Live {
  std::shared_ptr<Request> r;
  Progress progress;
  std::unique_ptr<Stop> stop;
  std::optional<KvPool::Lease> kv;
  std::unique_ptr<Decoder> d;
  std::chrono::steady_clock::time_point t0;
  // This step's: the plan, its buffer on the device, its forward's inputs and results.
  StepPlan plan;
  at::Tensor buffer;
  ForwardBatch batch;
  at::Tensor logits;
  std::vector<at::Tensor> readout;
};

Scheduler::Scheduler(const Network& model, int64_t max_batch, int64_t max_length, int64_t kv_budget_bytes,
                     StepCurve curve, double calibrate_s, bool pad_packs, int64_t kv_page_len, bool prefix_cache)
    : model_(model), max_batch_(max_batch), max_length_(max_length), prefix_cache_(prefix_cache),
      page_len_(resolve_kv_page_len(model.device(), kv_page_len)),
      row_bytes_(kv_row_bytes(
          model.config(), model.dtype(),
          pool_row_length(std::clamp<int64_t>(max_length, 1, model.config().max_sequence_length), page_len_))),
      curve_(std::move(curve)) {
  const bool graphs = check_batching_device(model.device(), "the batching scheduler");
  TORCH_CHECK_VALUE(curve_.tokens.size() == curve_.seconds.size(), "the step curve has ", curve_.tokens.size(),
                    " token counts but ", curve_.seconds.size(), " times");
  for (size_t i = 0; i < curve_.tokens.size(); ++i) {
    TORCH_CHECK_VALUE(
        curve_.tokens[i] >= 1 && curve_.seconds[i] > 0 &&
            (i == 0 || (curve_.tokens[i] > curve_.tokens[i - 1] && curve_.seconds[i] >= curve_.seconds[i - 1])),
        "the step curve must have ascending token counts "
        "(>= 1) and non-decreasing positive times; point ",
        i, " is (", curve_.tokens[i], ", ", curve_.seconds[i], ")");
  }
  // The pool checked before the curve is measured (up to calibrate_s).
  const int64_t rows = scheduler_pool_rows(model, max_batch, max_length, kv_budget_bytes, pad_packs, page_len_);
  const c10::OptionalStreamGuard on(default_stream_of(model.device()));  // the step curve, the pool
  if (curve_.empty() && calibrate_s > 0) curve_ = measure_step_curve(model, calibrate_s);
  const bool pad = pad_packs || graphs;
  if (page_len_ > 0) {  // the budget's rows as pages; KV rows in the table for max_batch requests of any length
    const int64_t per_row = pool_row_length(max_length, page_len_) / page_len_;
    const int64_t table_rows = std::min(rows * per_row, std::max(rows, max_batch * branches::kMaxBranches));
    pool_ = std::make_unique<KvPool>(model, rows * per_row, max_length, page_len_, table_rows, pad);
  } else {
    pool_ = std::make_unique<KvPool>(model, rows, max_length, 0, 0, pad);
  }
  packed_ = std::make_unique<PackedForward>(model, *pool_, pad, graphs);
}

Scheduler::~Scheduler() {
  try {
    close();
  } catch (...) {  // a destructor does not throw
  }
}

int64_t Scheduler::add(const std::vector<int64_t>& prompt, const DecodeOptions& options, bool stream) {
  return add(prompt, blockbatch::admit(model_, prompt, options), stream);  // not the member admit()
}

int64_t Scheduler::add(const std::vector<int64_t>& prompt, const Admitted& a, bool stream) {
  const DecodeOptions& o = a.options;
  const int64_t lp = a.prompt_length, length = a.canvas_length, rows = a.kv_rows;
  if (length > max_length_) {
    refuse(ErrorKind::kContextLength, "gen_length", "the prompt (", lp, " tokens) plus gen_length (", o.gen_length,
           ") needs ", length, " positions but this scheduler's max_length is ", max_length_,
           " (shorten the prompt or gen_length, or raise max_length)");
  }
  if (const char* paged_option = policy(o.policy).needs_paged_pool(o); paged_option != nullptr && !pool_->paged()) {
    refuse(ErrorKind::kUnsupported, paged_option, paged_option,
           " needs a paged KV pool: this scheduler's pool is dense rows (kv_page_len = 0",
           model_.device().is_cpu() ? "" : "; the automatic layout on CUDA", "); give kv_page_len > 0");
  }
  const int64_t shared = shared_prompt_pages(model_, o, lp, page_len_);
  if (!pool_->fits(rows, length, shared)) {
    refuse(ErrorKind::kKvBudget, "block_sizes", "the request needs ", rows, " KV rows of ", length, " positions (",
           pool_->pages_for(rows, length, shared), pool_->paged() ? " pages of " : " rows of ",
           pool_->paged() ? pool_->page_len() : max_length_, " positions) but the KV budget holds ", pool_->capacity(),
           " (raise kv_budget_bytes, or decode it with fewer block sizes)");
  }
  auto r = std::make_shared<Request>();
  r->prompt = prompt;
  r->options = o;  // resolved once; admission budgets them at the load it starts under
  r->stream = stream;
  r->length = length;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    TORCH_CHECK(!closed_, "the scheduler is closed: it takes no new requests");
    r->id = next_id_++;
    queue_.push_back(r);
  }
  queue_cv_.notify_all();
  return r->id;
}

bool Scheduler::cancel(int64_t id) {
  std::unique_lock<std::mutex> lock(mutex_);
  auto q = std::find_if(queue_.begin(), queue_.end(), [&](const auto& r) { return r->id == id; });
  if (q != queue_.end()) {
    queue_.erase(q);
    lock.unlock();
    push(cancelled_event(id, "before it started"));
    return true;
  }
  auto it = running_.find(id);
  if (it == running_.end()) return false;
  __atomic_store_n(&it->second->cancel, 1, __ATOMIC_RELAXED);
  queue_cv_.notify_all();
  return true;
}

bool Scheduler::admit() {
  bool any = false;
  for (;;) {
    std::shared_ptr<Request> r;
    int64_t load = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (queue_.empty() || static_cast<int64_t>(live_.size()) >= max_batch_) return any;
      r = queue_.front();
      // The load it joins: the requests decoding and waiting, itself included, at most max_batch.
      load = std::min<int64_t>(max_batch_, static_cast<int64_t>(live_.size() + queue_.size()));
    }
    DecodeOptions o = policy(r->options.policy).at_load(r->options, load, curve_);
    o.cuda_graphs = false;  // the packed forward replays its own graphs (pack.h)
    auto l = std::make_unique<Live>();
    const int64_t rows = kv_rows_needed(o);
    if (rows > 0) {
      const int64_t lp = static_cast<int64_t>(r->prompt.size());
      // Block-causal (one row): its complete prompt blocks may come from the prefix cache.
      KvPool::Prefix prefix;
      const int64_t block = policy(o.policy).cached_prompt_block(o);
      if (prefix_cache_ && pool_->paged() && block > 0 && block % page_len_ == 0) {
        prefix = KvPool::Prefix{block, lp / block, &r->prompt};
      }
      l->kv = pool_->take(rows, r->length, shared_prompt_pages(model_, o, lp, page_len_),
                          prefix.block > 0 ? &prefix : nullptr);
      if (!l->kv) return any;  // in order: it waits for rows (the requests decoding free them)
    }
    l->r = r;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (queue_.empty() || queue_.front() != r) {  // cancelled meanwhile (its event is out)
        if (l->kv) pool_->give_back(*l->kv);
        continue;
      }
      queue_.pop_front();
      running_[r->id] = r;
    }
    r->options = o;
    l->t0 = std::chrono::steady_clock::now();
    // The stop check runs inside the decoder's plan(): the decoder exists whenever it reports.
    l->progress = [this, req = r.get(), live = l.get()](const int64_t* x, int64_t n) {
      report(*req, live->d.get(), x, n);
    };
    try {
      l->stop = std::make_unique<Stop>(o.timeout_s, &r->cancel, r->stream ? &l->progress : nullptr, &r->reason);
      l->d = make_decoder(model_, r->prompt, o, *l->stop, l->kv ? l->kv->kv : KvRows{});
    } catch (...) {
      retire(*l, failed_event(r->id, std::current_exception(), r->cancel, r->reason));
      continue;
    }
    live_.push_back(std::move(l));
    any = true;
  }
}

void Scheduler::run_step() {
  // 1. Every live decoder's next step (a finished or failed one leaves, freeing its KV rows).
  std::vector<Live*> stepping;
  for (auto& up : live_) {
    Live& l = *up;
    if (finish_if_done(l)) continue;
    try {
      l.plan = l.d->plan();
      stepping.push_back(&l);
    } catch (...) {
      retire(l, failed_event(l.r->id, std::current_exception(), l.r->cancel, l.r->reason));
    }
  }
  // 2. Their index buffers in one host-to-device copy; each forward's inputs from its own part.
  std::vector<int64_t> host;
  std::vector<std::pair<int64_t, int64_t>> parts;
  for (Live* l : stepping) {
    const std::vector<int64_t> b = l->plan.buffer();
    parts.emplace_back(static_cast<int64_t>(host.size()), static_cast<int64_t>(b.size()));
    host.insert(host.end(), b.begin(), b.end());
  }
  const at::Tensor dev = at::from_blob(host.data(), {static_cast<int64_t>(host.size())}, at::kLong)
                             .to(model_.device(), false, /*copy=*/true);
  std::vector<PackedForward::Entry> entries;
  std::vector<Live*> forwarding;
  for (size_t i = 0; i < stepping.size(); ++i) {
    Live& l = *stepping[i];
    l.buffer = dev.narrow(0, parts[i].first, parts[i].second);
    l.logits = at::Tensor();
    if (!l.plan.forward) continue;
    try {
      l.batch = l.plan.q.batch(l.buffer, l.d->kv(), l.plan.mode, l.d->tokens_from(l.plan, l.buffer));
      entries.push_back({&l.batch, l.kv ? l.kv->first : 0, l.r->length});
      forwarding.push_back(&l);
    } catch (...) {
      retire(l, failed_event(l.r->id, std::current_exception(), l.r->cancel, l.r->reason));
    }
  }
  // 3. One packed forward per KV mode.
  if (!entries.empty()) {
    packed_->run(entries);
    steps_ += 1;
    forwards_ += static_cast<int64_t>(entries.size());
  }
  for (size_t i = 0; i < forwarding.size(); ++i) {
    if (entries[i].error) {
      retire(*forwarding[i],
             failed_event(forwarding[i]->r->id, entries[i].error, forwarding[i]->r->cancel, forwarding[i]->r->reason));
    } else {
      forwarding[i]->logits = entries[i].logits;
      // Its first forward wrote its complete prompt blocks' final K/V: later requests may read them.
      if (forwarding[i]->kv) pool_->publish(*forwarding[i]->kv);
    }
  }
  // 4. Each decoder's device work on its rows, every readout back in one copy, then its host work.
  std::vector<Live*> reading;
  std::vector<at::Tensor> all;
  for (Live* l : stepping) {
    if (!l->d || (l->plan.forward && !l->logits.defined())) continue;  // retired above
    try {
      l->readout = l->d->after_forward(l->plan, l->buffer, l->logits);
      all.insert(all.end(), l->readout.begin(), l->readout.end());
      reading.push_back(l);
    } catch (...) {
      retire(*l, failed_event(l->r->id, std::current_exception(), l->r->cancel, l->r->reason));
    }
  }
  const std::vector<at::Tensor> back = read_back(all);
  size_t at = 0;
  for (Live* l : reading) {
    const std::vector<at::Tensor> mine(back.begin() + static_cast<int64_t>(at),
                                       back.begin() + static_cast<int64_t>(at + l->readout.size()));
    at += l->readout.size();
    try {
      l->d->absorb(l->plan, l->logits, mine);
    } catch (...) {
      retire(*l, failed_event(l->r->id, std::current_exception(), l->r->cancel, l->r->reason));
    }
    l->logits = at::Tensor();
    l->readout.clear();
    if (l->d) finish_if_done(*l);  // its KV rows free for the next step's admissions
  }
  live_.erase(std::remove_if(live_.begin(), live_.end(), [](const auto& l) { return !l->d; }), live_.end());
}

bool Scheduler::finish_if_done(Live& l) {
  try {
    if (!l.d->done()) return false;
    RequestEvent ev;
    ev.id = l.r->id;
    ev.kind = RequestEvent::kFinished;
    DecodeResult res = l.d->finish();
    res.stats.wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - l.t0).count();
    ev.tokens = std::move(res.tokens);
    ev.stats = std::move(res.stats);
    ev.logprobs = std::move(res.logprobs);
    retire(l, std::move(ev));
  } catch (...) {
    retire(l, failed_event(l.r->id, std::current_exception(), l.r->cancel, l.r->reason));
  }
  return true;
}

void Scheduler::retire(Live& l, RequestEvent ev) {
  l.d.reset();  // its device state first; then its KV rows are free before anyone hears it finished
  if (l.kv) pool_->give_back(*l.kv);
  l.kv.reset();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    running_.erase(l.r->id);
  }
  push(std::move(ev));
}

int64_t Scheduler::step(double timeout_s) {
  std::unique_lock<std::mutex> guard(stepping_, std::try_to_lock);
  TORCH_CHECK(guard.owns_lock(), "Scheduler.step is already running on another thread (one driver thread steps)");
  // nullopt: a timeout beyond the clock's range, none (deadline_after)
  const auto deadline = deadline_after(std::chrono::steady_clock::now(), std::max(timeout_s, 0.0));
  const c10::OptionalStreamGuard on(default_stream_of(model_.device()));
  int64_t ran = 0;
  while (pending_.load() == 0) {
    admit();
    if (live_.empty()) {
      std::unique_lock<std::mutex> lock(mutex_);
      if (closed_ && queue_.empty()) break;
      const auto wakes = [&] { return closed_ || !queue_.empty() || pending_.load() > 0; };
      if (deadline) {
        if (!queue_cv_.wait_until(lock, *deadline, wakes)) break;
      } else {
        queue_cv_.wait(lock, wakes);
      }
      continue;
    }
    const int64_t before = steps_.load();
    run_step();
    ran += steps_.load() - before;
    if (deadline && std::chrono::steady_clock::now() >= *deadline) break;
  }
  return ran;
}

std::vector<RequestEvent> Scheduler::events() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<RequestEvent> out;
  out.swap(events_);
  pending_ = 0;
  return out;
}

void Scheduler::close() {
  std::vector<std::shared_ptr<Request>> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return;
    closed_ = true;
    dropped.assign(queue_.begin(), queue_.end());
    queue_.clear();
    for (auto& [id, r] : running_) __atomic_store_n(&r->cancel, 1, __ATOMIC_RELAXED);
  }
  queue_cv_.notify_all();
  for (const auto& r : dropped) push(cancelled_event(r->id, "before it started: the scheduler closed"));
  // The live requests stop at their next check (a stop check precedes every forward).
  std::lock_guard<std::mutex> guard(stepping_);
  const c10::OptionalStreamGuard on(default_stream_of(model_.device()));
  while (!live_.empty()) run_step();
}

Scheduler::Counters Scheduler::counters() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return Counters{static_cast<int64_t>(queue_.size()),
                  static_cast<int64_t>(running_.size()),
                  steps_.load(),
                  forwards_.load(),
                  pool_->capacity() / pool_->per_row(),
                  pool_->rows_in_use(),
                  row_bytes_,
                  max_length_,
                  max_batch_,
                  packed_->padded(),
                  packed_->graph_captures(),
                  packed_->graph_replays(),
                  pool_->capacity(),
                  pool_->in_use(),
                  pool_->page_len(),
                  pool_->paged(),
                  pool_->cached_blocks(),
                  pool_->cached_pages(),
                  pool_->evicted_blocks(),
                  pool_->hit_tokens()};
}

void Scheduler::push(RequestEvent ev) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.push_back(std::move(ev));
    pending_ += 1;
  }
  queue_cv_.notify_all();  // a step() waiting for work returns to hand the event over
}

void Scheduler::report(Request& r, const Decoder* d, const int64_t* x, int64_t numel) {
  const int64_t L = r.length, rows = numel / L, lp = static_cast<int64_t>(r.prompt.size());
  const int64_t mask = model_.config().mask_token_id;
  const int64_t end = std::min(L, lp + r.options.gen_length);  // a block canvas runs past the generation
  int64_t p = lp + r.stable;
  for (; p < end; ++p) {
    const int64_t t = x[p];
    bool stable = t != mask;
    for (int64_t row = 1; row < rows && stable; ++row) stable = x[row * L + p] == t;
    if (!stable) break;
  }
  if (p - lp <= r.stable) return;
  RequestEvent ev;
  if (d != nullptr && r.options.logprobs) {
    ev.logprobs = d->logprob_rows(r.stable, p - lp - r.stable);
    // A decoder may hand fewer rows: those of the rest can still change (blockbatch: until every
    // branch holds the same record); their tokens wait for them.
    if (ev.logprobs.defined()) p = std::min(p, lp + r.stable + ev.logprobs.size(0));
    if (p - lp <= r.stable) return;
  }
  ev.id = r.id;
  ev.kind = RequestEvent::kTokens;
  ev.offset = r.stable;
  ev.tokens.assign(x + lp + r.stable, x + p);
  r.stable = p - lp;
  push(std::move(ev));
}

std::vector<DecodeResult> decode_batch(const Network& model, const std::vector<std::vector<int64_t>>& prompts,
                                       const std::vector<DecodeOptions>& options, int64_t max_batch,
                                       int64_t kv_budget_bytes, const int64_t* cancel, int64_t* reason,
                                       BatchStats* stats, const StepCurve& curve, bool pad_packs, bool prefix_cache) {
  const int64_t n = static_cast<int64_t>(prompts.size());
  TORCH_CHECK_VALUE(static_cast<int64_t>(options.size()) == n, "decode_batch: ", n, " prompts but ", options.size(),
                    " option sets (give one per prompt)");
  TORCH_CHECK_VALUE(max_batch >= 1, "max_batch must be >= 1, got ", max_batch);
  TORCH_CHECK_VALUE(kv_budget_bytes >= 0, "kv_budget_bytes must be >= 0 (0: room for max_batch requests), got ",
                    kv_budget_bytes);
  const bool pad = check_batching_device(model.device(), "decode_batch") || pad_packs;
  // Every request checked before any runs: an error names the request.
  std::vector<Admitted> admitted;
  admitted.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    try {
      admitted.push_back(admit(model, prompts[i], options[i]));
    } catch (c10::Error& e) {
      e.add_context("request " + std::to_string(i));
      throw;
    }
  }
  const int64_t workers = std::min(max_batch, std::max<int64_t>(n, 1));
  const BatchPool pool = batch_pool(model, prompts, admitted, workers, kv_budget_bytes, pad, pad_packs, prefix_cache);
  std::vector<DecodeResult> results(n);
  std::vector<std::exception_ptr> errors(n);
  std::vector<int64_t> reasons(n, 0);
  {
    // branch_budget = auto without a curve: measured now (at most a second).
    const bool adaptive = std::any_of(admitted.begin(), admitted.end(), [](const Admitted& a) {
      return policy(a.options.policy).adapts_to_load(a.options);
    });
    const int64_t budget = (std::max<int64_t>(pool.rows, 1) + (pad ? 1 : 0)) * pool.row_bytes;
    Scheduler scheduler(model, workers, pool.max_length, budget, curve, adaptive ? 1.0 : 0.0, pad_packs, -1,
                        prefix_cache);
    std::map<int64_t, int64_t> index;  // scheduler id -> request
    for (int64_t i = 0; i < n; ++i) index[scheduler.add(prompts[i], admitted[i], false)] = i;
    bool cancelled = false;
    for (int64_t done = 0; done < n;) {
      scheduler.step(0.05);
      if (!cancelled && cancel != nullptr && __atomic_load_n(cancel, __ATOMIC_RELAXED) != 0) {
        cancelled = true;
        for (const auto& [id, i] : index) scheduler.cancel(id);
      }
      for (RequestEvent& ev : scheduler.events()) {
        const int64_t i = index.at(ev.id);
        if (ev.kind == RequestEvent::kTokens) continue;
        ++done;
        if (ev.kind == RequestEvent::kFinished) {
          results[i].tokens = std::move(ev.tokens);
          results[i].stats = std::move(ev.stats);
          results[i].logprobs = std::move(ev.logprobs);
        } else {
          errors[i] = ev.exception;
          reasons[i] = ev.reason;
        }
      }
    }
    if (stats) {
      const Scheduler::Counters k = scheduler.counters();
      stats->steps = k.steps;
      stats->forwards = k.forwards;
      stats->pool_rows = k.pool_rows;
      stats->row_bytes = k.row_bytes;
      stats->padded = k.padded;
      stats->graph_captures = k.graph_captures;
      stats->graph_replays = k.graph_replays;
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    if (!errors[i]) continue;
    if (reason != nullptr) *reason = reasons[i];
    try {
      std::rethrow_exception(errors[i]);
    } catch (c10::Error& e) {
      e.add_context("request " + std::to_string(i));
      throw;
    }
  }
  return results;
}

}  // namespace blockbatch
