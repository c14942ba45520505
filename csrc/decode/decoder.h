// A decode policy as a step machine over one request (docs/ALGORITHMS.md 9): plan() says what the
// next forward is (its packed queries, KV mode and the policy's own index-buffer entries), the
// caller runs it (alone: drive(), through a StepRunner and its CUDA graphs; many requests: the
// scheduler, which packs the plans of every live decoder into one forward per KV mode), and
// absorb() takes the result. Nothing in a decoder waits for, or knows of, another request.
//
// One step, as the caller runs it:
//   plan()            host: the next step (its stop check, before the forward, may throw)
//   buffer            the plan's index buffer (queries, then `extra`), copied to the device once
//   forward           the model over plan.q (tokens gathered from tokens_from(), KV rows of kv())
//   after_forward()   device work on the logits (one CUDA graph with the forward when alone): the
//                     tensors to read back, in one copy
//   absorb()          host: the readback (and the logits, on the device until the next step)
// until done(); then finish() gives the result.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "decode/decode.h"
#include "decode/step.h"

namespace blockbatch {

class StepRunner;

struct StepPlan {
  StepKind kind = StepKind::kStep;
  bool forward = true;  // false: device work without a forward (BlockBatch's coordination)
  PackedQueries q;
  KvMode mode = KvMode::kFull;
  std::vector<int64_t> extra;  // the policy's entries after the queries' indices
  bool sampling = false;
  int64_t base = 0;  // set by buffer(): where `extra` starts in the buffer

  // The index buffer: q.host_buffer(mode), then extra (sets base).
  std::vector<int64_t> buffer();
  StepKey key(bool with_kv, int64_t buffer_size) const;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual bool done() const = 0;
  virtual StepPlan plan() = 0;
  // The tensor the step's tokens are gathered from: a device canvas, or the host canvas the plan
  // put into its extra entries (then a view of `buffer`, the plan's buffer on the device).
  virtual at::Tensor tokens_from(const StepPlan& p, const at::Tensor& buffer) const = 0;
  // logits: undefined for a step without a forward.
  virtual std::vector<at::Tensor> after_forward(const StepPlan& p, const at::Tensor& buffer, const at::Tensor& logits) {
    (void)p, (void)buffer, (void)logits;
    return {};
  }
  virtual void absorb(const StepPlan& p, const at::Tensor& logits, const std::vector<at::Tensor>& host) = 0;
  // The result, once done(): every counter but the wall time and the graph counters (the caller's).
  virtual DecodeResult finish() = 0;
  // The `logprobs` option's rows (decode/logprobs.h) of generation positions [from, from + count) as
  // they stand (host float64; undefined when off): final for positions the decoder's stop check
  // shows as stable (a scheduler's stream events carry them with their tokens).
  virtual at::Tensor logprob_rows(int64_t from, int64_t count) const {
    (void)from, (void)count;
    return {};
  }
  // The request's KV rows (undefined: none, vanilla): kv_rows_needed(options) rows of at least the
  // canvas' length.
  const KvRows& kv() const { return kv_; }

 protected:
  KvRows kv_;
};

// The decoder of `o` (resolved and validated: admit) for `prompt` on `model`: its policy's
// (decode/policies/policy.h). kv: its KV rows (a scheduler's pool rows, dense or paged), or
// undefined to allocate dense rows with model.new_kv. `stop` is checked before every forward and must outlive it.
std::unique_ptr<Decoder> make_decoder(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o,
                                      const Stop& stop, KvRows kv = {});

// Runs `d` alone to the end, every step through `runner` (built before the decoder: on CUDA its
// stream holds the request's work). Fills the wall time and the graph counters.
DecodeResult drive(const Network& model, Decoder& d, StepRunner& runner);

}  // namespace blockbatch
