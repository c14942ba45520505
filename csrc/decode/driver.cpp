// The step machines' shared pieces (decode/decoder.h): a plan's index buffer and shape key, the
// policy's decoder for a request, and the driver that runs one decoder alone.
#include <chrono>

#include "decode/decoder.h"
#include "decode/policies/policy.h"
#include "decode/step_runner.h"

namespace blockbatch {

std::vector<int64_t> StepPlan::buffer() {
  std::vector<int64_t> b = q.host_buffer(mode);
  base = static_cast<int64_t>(b.size());
  b.insert(b.end(), extra.begin(), extra.end());
  return b;
}

StepKey StepPlan::key(bool with_kv, int64_t buffer_size) const {
  return StepKey{kind,        mode,     q.size(), q.rows(), static_cast<int64_t>(q.logit_index.size()),
                 buffer_size, sampling, with_kv};
}

std::unique_ptr<Decoder> make_decoder(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o,
                                      const Stop& stop, KvRows kv) {
  return policy(o.policy).make(model, prompt, o, stop, std::move(kv));
}

DecodeResult drive(const Network& model, Decoder& d, StepRunner& runner) {
  const auto t0 = std::chrono::steady_clock::now();
  while (!d.done()) {
    StepPlan p = d.plan();
    const std::vector<int64_t> buffer = p.buffer();
    const StepKey key = p.key(d.kv().defined(), static_cast<int64_t>(buffer.size()));
    StepRunner::Output out = runner.run(buffer, key, [&](const at::Tensor& dev) {
      StepRunner::Body body;
      if (p.forward) body.logits = model.forward(p.q.batch(dev, d.kv(), p.mode, d.tokens_from(p, dev)));
      body.readout = d.after_forward(p, dev, body.logits);
      return body;
    });
    d.absorb(p, out.logits, out.host);
  }
  DecodeResult res = d.finish();
  res.stats.graph_captures = runner.captures();
  res.stats.graph_replays = runner.replays();
  res.stats.wall_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace blockbatch
