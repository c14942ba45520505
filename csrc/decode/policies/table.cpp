// The policy table (decode/policies/policy.h): every policy's descriptor, in the options table's order,
// and the refusals every policy shares. A new policy is its file here plus one line below.
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include "decode/policies/policy.h"

namespace blockbatch {

extern const PolicyDescriptor kVanillaPolicy, kPrefixPolicy, kDualPolicy, kBlockBatchPolicy, kBlockPolicy,
    kWindowPolicy, kWavefrontPolicy;

const std::vector<const PolicyDescriptor*>& policy_table() {
  static const std::vector<const PolicyDescriptor*> table = [] {
    std::vector<const PolicyDescriptor*> t{&kVanillaPolicy, &kPrefixPolicy, &kDualPolicy,     &kBlockBatchPolicy,
                                           &kBlockPolicy,   &kWindowPolicy, &kWavefrontPolicy};
    for (size_t i = 0; i < t.size(); ++i) {
      TORCH_CHECK(static_cast<size_t>(t[i]->id) == i, "policy table: row ", i, " is policy '", policy_name(t[i]->id),
                  "' (rows must follow the options table's policy order)");
    }
    return t;
  }();
  return table;
}

const PolicyDescriptor& policy(Policy id) {
  const auto& t = policy_table();
  const auto i = static_cast<size_t>(id);
  TORCH_CHECK(i < t.size(), "policy: no descriptor for policy id ", i);
  return *t[i];
}

namespace {

// "policy='block'" or "policy='vanilla', 'prefix', 'dual' or 'blockbatch'": the policies that
// decode `family`'s checkpoints, as a remedy names them.
std::string policies_for(const FamilySpec& family) {
  std::vector<const char*> names;
  for (const PolicyDescriptor* d : policy_table()) {
    if (d->family_refusal(family).empty()) names.push_back(policy_name(d->id));
  }
  if (names.empty()) return "no policy decodes them";
  std::string out = "use policy='";
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += i + 1 == names.size() ? " or '" : ", '";
    out += names[i];
    out += "'";
  }
  return out;
}

// DUET's options (ALGORITHMS.md 18) are implemented by policy 'block' only: any other policy refuses
// them, naming the option, rather than decoding densely as if they were unset.
Refusal duet_refusal(const DecodeOptions& o) {
  if (o.policy == Policy::kBlock) return {};
  const DecodeOptions d{};
  const char* param = o.prefix_kv_budget != d.prefix_kv_budget             ? "prefix_kv_budget"
                      : o.query_keep_ratio != d.query_keep_ratio           ? "query_keep_ratio"
                      : o.prefix_kv_min_context != d.prefix_kv_min_context ? "prefix_kv_min_context"
                      : o.query_reuse_interval != d.query_reuse_interval   ? "query_reuse_interval"
                      : o.query_dense_masks != d.query_dense_masks         ? "query_dense_masks"
                      : o.query_min_context != d.query_min_context         ? "query_min_context"
                                                                           : nullptr;
  if (param == nullptr) return {};
  return {param, c10::str(param,
                          " is DUET's sparsity for the block-causal families' policy 'block' (ALGORITHMS.md 18); "
                          "policy '",
                          policy_name(o.policy), "' does not implement it")};
}

}  // namespace

Refusal refusal(const FamilySpec* family, const DecodeOptions& o) {
  const PolicyDescriptor& d = policy(o.policy);
  if (family != nullptr) {
    if (const std::string why = d.family_refusal(*family); !why.empty()) {
      return {"policy", c10::str("policy '", policy_name(o.policy), "' ", why, ": ", policies_for(*family))};
    }
  }
  if (o.logprobs && !d.logprobs) {
    std::string which;
    for (const PolicyDescriptor* r : policy_table()) {
      if (r->logprobs) which += std::string(which.empty() ? "'" : ", '") + policy_name(r->id) + "'";
    }
    return {"logprobs", c10::str("policy '", policy_name(o.policy), "' does not record logprobs yet (", which,
                                 " do): leave logprobs None or use one of those")};
  }
  if (Refusal why = duet_refusal(o)) return why;
  return d.option_refusal(family, o);
}

void check_supported(const FamilySpec* family, const DecodeOptions& o) {
  if (Refusal why = refusal(family, o)) refuse(ErrorKind::kUnsupported, why.param, why.message);
}

Refusal bidirectional_refusal(const FamilySpec* family, bool samplers, const DecodeOptions& o) {
  if (o.edit_threshold) return {"edit_threshold", "edit_threshold applies to policy 'block' (token editing) only"};
  if (o.unmasking) return {"unmasking", "unmasking applies to policy 'block' (SDAR checkpoints) only"};
  if (o.entropy_bound != DecodeOptions{}.entropy_bound) {
    return {"entropy_bound",
            "entropy_bound applies to policy 'block' (SDAR checkpoints, unmasking 'entropy_bounded') only"};
  }
  if (o.steps && *o.steps > o.gen_length) {
    return {"steps", c10::str("steps must be None or an integer in [0, gen_length = ", o.gen_length,
                              "] (a step commits at least one token), got ", *o.steps)};
  }
  if (family != nullptr && !samplers) {
    if (o.alg && *o.alg != Alg::kConfidence) {
      return {"alg", c10::str("alg = '", alg_name(*o.alg), "' is a sampler that the decoders of ", family->name,
                              " checkpoints do not implement: they rank by confidence (alg='confidence')")};
    }
    if (o.alg_temp != 0) {
      return {"alg_temp",
              c10::str("alg_temp applies to the samplers of other families; leave it 0 for ", family->name)};
    }
    if (o.top_p || o.top_k) {
      return {o.top_p ? "top_p" : "top_k",
              c10::str("top_p / top_k apply to the samplers of other families; leave them None for ", family->name)};
    }
  }
  return {};
}

}  // namespace blockbatch
