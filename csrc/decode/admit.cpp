// admit(): the request's options resolved and validated, its prompt checked, its sizes derived
// (decode/admit.h).
#include "decode/admit.h"

#include "decode/policies/policy.h"
#include "decode/refused.h"

#include <c10/util/Exception.h>

#include <limits>
#include <string_view>

namespace blockbatch {

void check_prompt(const ModelConfig& c, const std::vector<int64_t>& prompt) {
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= c.vocab_size) {
      refuse(ErrorKind::kInvalidPrompt, "prompt_ids", "prompt_ids[", i, "] = ", prompt[i],
             " is outside the vocabulary [0, ", c.vocab_size, ")");
    }
    if (prompt[i] == c.mask_token_id) {
      refuse(ErrorKind::kInvalidPrompt, "prompt_ids", "prompt_ids[", i, "] is the mask id ", c.mask_token_id,
             "; prompts must not contain masks");
    }
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

int64_t kv_rows_needed(const DecodeOptions& o) { return policy(o.policy).kv_rows(o); }

Admitted admit_sizes(const ModelConfig& c, int64_t prompt_length, const DecodeOptions& options) {
  if (prompt_length < 0) {
    refuse(ErrorKind::kInvalidPrompt, "prompt_length", "prompt_length must be >= 0, got ", prompt_length);
  }
  Admitted a;
  a.options = decode_options_for(c, options);
  check_option_ranges(a.options);  // block_length >= 1 before canvas_length divides by it
  a.prompt_length = prompt_length;
  // Saturated: a canvas past INT64_MAX fits no model, and the sum must not overflow.
  const int64_t room = std::numeric_limits<int64_t>::max() - prompt_length;
  const int64_t slack = policy(a.options.policy).canvas_unit(a.options) - 1;
  a.canvas_length = a.options.gen_length <= room - slack ? canvas_length(a.options, prompt_length)
                                                         : std::numeric_limits<int64_t>::max();
  a.kv_rows = kv_rows_needed(a.options);
  return a;
}

Admitted admit(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& options) {
  const ModelConfig& c = model.config();
  const int64_t lp = static_cast<int64_t>(prompt.size());
  Admitted a;
  a.options = decode_options_for(c, options);
  a.options.validate(c, lp);  // canvas_length <= max_sequence_length from here on
  check_prompt(c, prompt);
  a.prompt_length = lp;
  a.canvas_length = canvas_length(a.options, lp);
  a.kv_rows = kv_rows_needed(a.options);
  return a;
}

}  // namespace blockbatch
