// decode(): the entry point declared in decode/decode.h. Admits the request (decode/admit.h), then
// drives its policy's decoder (decode/decoder.h, decode/policies/policy.h) to the end.
#include <cstdint>
#include <vector>

#include "decode/decode.h"

#include "decode/admit.h"
#include "decode/decoder.h"
#include "decode/policies/policy.h"
#include "decode/step_runner.h"

namespace blockbatch {

DecodeResult decode(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& options,
                    const int64_t* cancel, const Progress* progress, int64_t* reason, const StepCurve* curve) {
  // The policies see every option set: the table's per-policy / per-family defaults filled in.
  DecodeOptions o = admit(model, prompt, options).options;
  if (curve != nullptr) o = policy(o.policy).at_load(o, 1, *curve);
  const Stop stop(o.timeout_s, cancel, progress, reason);
  const bool graphs = o.cuda_graphs && policy(o.policy).graphs(o);
  StepRunner runner(model, graphs);  // before any device tensor: the request's work runs on its stream
  const std::unique_ptr<Decoder> d = make_decoder(model, prompt, o, stop);
  return drive(model, *d, runner);
}

}  // namespace blockbatch
