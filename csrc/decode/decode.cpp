// decode(): the entry point declared in decode/decode.h. Validates the options and the prompt,
// then drives the request's decoder (decode/decoder.h; made by make_decoder, decode/driver.cpp) to
// the end: one of policies/single_branch.cpp, blockbatch.cpp (its device or host executor, as the
// family's rules say: decode/family.h) or block.cpp.
#include <c10/util/Exception.h>

#include <cstdint>
#include <vector>

#include "decode/decode.h"
#include "decode/decoder.h"
#include "decode/step_runner.h"

namespace blockbatch {

void check_prompt(const ModelConfig& c, const std::vector<int64_t>& prompt) {
  for (size_t i = 0; i < prompt.size(); ++i) {
    TORCH_CHECK_VALUE(prompt[i] >= 0 && prompt[i] < c.vocab_size, "prompt_ids[", i, "] = ", prompt[i],
                      " is outside the vocabulary [0, ", c.vocab_size, ")");
    TORCH_CHECK_VALUE(prompt[i] != c.mask_token_id, "prompt_ids[", i, "] is the mask id ", c.mask_token_id,
                      "; prompts must not contain masks");
  }
}

DecodeOptions decode_options_for(const ModelConfig& c, const DecodeOptions& options) {
  DecodeOptions o = options.resolved(family_name(c.family));
  if (!options.block_sizes) {  // the family's default branches: the sizes that divide gen_length
    std::vector<int64_t> fit;
    for (int64_t b : *o.block_sizes) {
      if (o.gen_length % b == 0) fit.push_back(b);
    }
    if (!fit.empty()) o.block_sizes = fit;  // else validate() names the first that does not divide
  }
  return o;
}

DecodeResult decode(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& options,
                    const int64_t* cancel, const Progress* progress, int64_t* reason, const StepCurve* curve) {
  const ModelConfig& c = model.config();
  // The policies see every option set: the table's per-policy / per-family defaults filled in.
  DecodeOptions o = decode_options_for(c, options);
  o.validate(c, static_cast<int64_t>(prompt.size()));
  check_prompt(c, prompt);
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
