// torch.ops.blockbatch.policy_table(): the C++ policy table (decode/policies/policy.h) as Python sees
// it, so the Python registry (python/blockbatch/policies/) is checked against it rather than
// trusted to agree (tests/tools/test_registries.py).
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

#include "decode/policies/policy.h"

namespace blockbatch {

namespace {

std::string joined(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : ",") + p;
  return out;
}

// Per policy, in id order: its name, its step kinds and its own counters (comma-separated), and its
// flags (steps_with_confidence).
std::tuple<std::vector<std::string>, std::vector<std::string>, std::vector<std::string>, c10::List<bool>>
policy_table_op() {
  std::vector<std::string> names, kinds, stats;
  c10::List<bool> steps_with_confidence;
  for (const PolicyDescriptor* d : policy_table()) {
    names.emplace_back(policy_name(d->id));
    std::vector<std::string> k;
    for (StepKind s : d->step_kinds) k.emplace_back(step_kind_name(s));
    kinds.push_back(joined(k));
    stats.push_back(joined(d->stats));
    steps_with_confidence.push_back(d->steps_with_confidence);
  }
  return {names, kinds, stats, steps_with_confidence};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(blockbatch, m) {
  m.def("policy_table() -> (str[] names, str[] step_kinds, str[] stats, bool[] steps_with_confidence)",
        &policy_table_op);
}

}  // namespace blockbatch
