// decode(): the entry point declared in decode/decode.h. Validates the options and the prompt,
// then drives the request's decoder (decode/decoder.h; made by make_decoder, decode/driver.cpp) to
// the end: one of policies/single_branch.cpp, blockbatch.cpp (its device or host executor, as the
// family's rules say: decode/family.h) or block.cpp.
#include <cstdint>
#include <vector>

#include "decode/decode.h"

#include "decode/admit.h"
#include "decode/decoder.h"
#include "decode/step_runner.h"

namespace blockbatch {

DecodeResult decode(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& options,
                    const int64_t* cancel, const Progress* progress, int64_t* reason, const StepCurve* curve) {
  // The policies see every option set: the table's per-policy / per-family defaults filled in.
  DecodeOptions o = admit(model, prompt, options).options;
  if (curve != nullptr) o = budgeted(o, 1, *curve);
  const Stop stop(o.timeout_s, cancel, progress, reason);
  // share_prompt_kv's copies after a full forward depend on the row that owns the prompt pages that
  // time (decode/policies/branch_rows.h): not a graph's fixed work, so such decodes run eagerly.
  const bool graphs = o.cuda_graphs && !(o.policy == Policy::kBlockBatch && o.share_prompt_kv);
  StepRunner runner(model, graphs);  // before any device tensor: the request's work runs on its stream
  const std::unique_ptr<Decoder> d = make_decoder(model, prompt, o, stop);
  return drive(model, *d, runner);
}

}  // namespace blockbatch
