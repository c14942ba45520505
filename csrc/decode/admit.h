// Admission: the one place a request's options are resolved and checked and its sizes derived.
// decode() (decode/decode.cpp), Scheduler::add and decode_batch (decode/batch/scheduler.cpp) all
// admit a request here, and Python asks the same (torch.ops.blockbatch.admit) instead of deriving
// lengths itself.
#pragma once

#include <cstdint>
#include <vector>

#include "decode/options.h"
#include "model/network.h"

namespace blockbatch {

// What admitting a request yields: the options it decodes with and the space it takes.
struct Admitted {
  DecodeOptions options;      // decode_options_for: the table's per-policy / per-family defaults filled in
  int64_t prompt_length = 0;  // prompt tokens
  int64_t canvas_length = 0;  // positions of its canvas and KV rows (policy 'block': whole blocks)
  int64_t kv_rows = 0;        // KV rows it holds (kv_rows_needed)
};

// Resolves `options` for `model`, validates them against the prompt's length (c10::ValueError
// naming the option, or the length that does not fit max_sequence_length) and checks the prompt's
// ids (check_prompt). The scheduler's load-dependent branch budget (budgeted) is not applied here:
// it depends on the load when the request starts.
Admitted admit(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& options);

// The sizes only: `options` resolved for `config` and their ranges checked (check_option_ranges),
// canvas_length and kv_rows for a prompt of `prompt_length` tokens, without the checks relating
// the options to the model and the prompt (admit does those). canvas_length saturates at INT64_MAX.
Admitted admit_sizes(const ModelConfig& config, int64_t prompt_length, const DecodeOptions& options);

// Every prompt id in the vocabulary and none the mask id (throws c10::ValueError naming the index).
void check_prompt(const ModelConfig& config, const std::vector<int64_t>& prompt);

// The options a request decodes with on `config`'s model: the table's per-policy / per-family
// defaults filled in, an unset block_sizes cut to the family's sizes that divide gen_length.
DecodeOptions decode_options_for(const ModelConfig& config, const DecodeOptions& options);

// KV rows one request holds (options resolved): one per branch, none for vanilla.
int64_t kv_rows_needed(const DecodeOptions& resolved);

}  // namespace blockbatch
