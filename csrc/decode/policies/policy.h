// A decode policy as data (docs/adding-a-policy.md). Each file of csrc/decode/policies/ declares its
// policy's descriptor: what the rest of the engine asks about a policy (admission, the KV pool, the
// scheduler, decode()) and how to make its decoder; and its own per-family rules, a small table with a
// row per family it decodes (a family without a row is refused by the policy, naming the policies
// that decode it). policies/table.cpp collects the descriptors; nothing outside csrc/decode/policies/
// names a policy (`Policy::k...`) or asks which family a model is.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "decode/budget.h"
#include "decode/decoder.h"
#include "decode/refused.h"
#include "model/families.h"

namespace blockbatch {

struct PolicyDescriptor {
  Policy id;
  // Why the policy has no decoder for `family`'s checkpoints ("" when it has one): a reason naming
  // the family; refusal() adds the policies that do decode it.
  std::string (*family_refusal)(const FamilySpec& family);
  // Why `o` (table ranges checked, the family's decoder exists) cannot decode: the first reason (the
  // option to change and an error message naming it), or an empty Refusal when it can. family
  // nullptr: the family is not known yet, so only the rules that hold on every family.
  Refusal (*option_refusal)(const FamilySpec* family, const DecodeOptions& o);
  // KV rows one request holds (o resolved): 0 for none.
  int64_t (*kv_rows)(const DecodeOptions& o);
  // The canvas (and its KV rows) spans prompt + gen_length rounded up to a multiple of this.
  int64_t (*canvas_unit)(const DecodeOptions& o);
  // Complete prompt blocks of this many positions hold final K/V after the prefill (block-causal:
  // a prefix cache may serve them); 0: none do.
  int64_t (*cached_prompt_block)(const DecodeOptions& o);
  // A decode alone may capture and replay CUDA graphs (o.cuda_graphs set).
  bool (*graphs)(const DecodeOptions& o);
  // The option that needs a paged KV pool (nullptr: none does).
  const char* (*needs_paged_pool)(const DecodeOptions& o);
  // The request adapts to the load it joins (the scheduler measures a step-time curve for it) ...
  bool (*adapts_to_load)(const DecodeOptions& o);
  // ... and decodes with these options when admitted while `load` requests decode, itself included.
  DecodeOptions (*at_load)(const DecodeOptions& o, int64_t load, const StepCurve& curve);
  // `steps` still counts with a confidence commit rule (else only the fixed schedule reads it).
  bool steps_with_confidence = false;
  // The kinds of step its plans run (StepKey::kind: one CUDA graph family each).
  std::vector<StepKind> step_kinds;
  // Its counters beyond those every policy fills (nfe, steps, branches, wall_ms, graph counters).
  std::vector<std::string> stats;
  // Its decoder records the `logprobs` option (decode/logprobs.h); false: the option is refused.
  bool logprobs = false;
  std::unique_ptr<Decoder> (*make)(const Network& model, const std::vector<int64_t>& prompt, const DecodeOptions& o,
                                   const Stop& stop, KvRows kv);
};

// Every policy, in the options table's order (policy id i is row i).
const std::vector<const PolicyDescriptor*>& policy_table();
// The descriptor of `id`.
const PolicyDescriptor& policy(Policy id);

// Why `o` cannot decode on a model of `family` (nullptr: not known yet): the first reason, or none.
Refusal refusal(const FamilySpec* family, const DecodeOptions& o);
// refusal() thrown (Refused, kind unsupported).
void check_supported(const FamilySpec* family, const DecodeOptions& o);

// The row of a policy's per-family rules for `family` (rows have a `family` name), nullptr if none.
template <typename Row>
const Row* family_row(const std::vector<Row>& rows, const FamilySpec& family) {
  for (const Row& r : rows) {
    if (std::strcmp(r.family, family.name) == 0) return &r;
  }
  return nullptr;
}

// The tokens of a step whose plan put the host canvas into its extra entries (p.extra = the canvas):
// that part of the step's index buffer, on the model's device (Decoder::tokens_from).
inline at::Tensor host_canvas_tokens(const StepPlan& p, const at::Tensor& buffer) {
  return buffer.narrow(0, p.base, static_cast<int64_t>(p.extra.size()));
}

// The descriptor defaults most policies share.
namespace policy_defaults {
inline int64_t one(const DecodeOptions&) { return 1; }
inline int64_t block_length(const DecodeOptions& o) { return o.block_length; }  // whole blocks, aligned at 0
inline int64_t none(const DecodeOptions&) { return 0; }
inline bool yes(const DecodeOptions&) { return true; }
inline bool no(const DecodeOptions&) { return false; }
inline const char* no_option(const DecodeOptions&) { return nullptr; }
inline DecodeOptions as_is(const DecodeOptions& o, int64_t, const StepCurve&) { return o; }
}  // namespace policy_defaults

// The rules the single-branch and BlockBatch policies' family rows share.
enum class SeedRule {
  kCommitByRule,     // LLaDA: a full forward commits by the commit rule, like any step (3, 4.2)
  kFirstMaskArgmax,  // Dream: a full forward writes exactly one token, the window's first mask (5.3, 5.4)
};
enum class Readout {
  kDevice,    // proposals and bookkeeping on the device, ties to the earliest position (section 2)
  kHostTopk,  // the canvas on the host, ranking by at::topk's own order for equal values (5.2, 5.5)
};

// Refusals the bidirectional policies (vanilla, prefix, dual, blockbatch) share: the options of the
// block policy, steps beyond gen_length, and the samplers of families whose rows have none.
// `samplers`: whether the family's row implements alg / alg_temp / top_p / top_k.
Refusal bidirectional_refusal(const FamilySpec* family, bool samplers, const DecodeOptions& o);

}  // namespace blockbatch
