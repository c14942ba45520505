#include "decode/options.h"

#include <c10/util/Exception.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <set>
#include <sstream>
#include <string>

#include "decode/options_parse.h"
#include "kernels/branches.h"

namespace blockbatch {

static_assert(kMaxBranchesOption == branches::kMaxBranches,
              "python/blockbatch/contract.py: block_sizes max_items must equal branches::kMaxBranches");

CommitRule parse_commit_rule(const std::string& name) {
  if (name == "threshold") return CommitRule::kThreshold;
  if (name == "fixed") return CommitRule::kFixed;
  if (name == "factor") return CommitRule::kFactor;
  TORCH_CHECK_VALUE(false, "commit must be one of 'threshold', 'fixed', 'factor', got '", name, "'");
}

const char* commit_rule_name(CommitRule rule) {
  switch (rule) {
    case CommitRule::kThreshold: return "threshold";
    case CommitRule::kFixed: return "fixed";
    case CommitRule::kFactor: return "factor";
  }
  return "";
}

CommitRule DecodeOptions::commit() const {
  if (factor) return CommitRule::kFactor;
  return threshold ? CommitRule::kThreshold : CommitRule::kFixed;
}

namespace {

// The rules that relate options to each other (after the table's ranges have passed). `family`:
// the model family the options will decode, or nullptr while it is not known (DecodeOptions::check,
// before a model is chosen): then only the rules every family shares, on the options as given (a
// nullopt the table resolves is checked once resolved, by validate()).
void check_relations(const DecodeOptions& o, const char* family) {
  const std::string fam = family ? family : "";
  const bool dream = fam == "dream", llada = fam == "llada";
  if (o.steps) {
    TORCH_CHECK_VALUE(*o.steps <= o.gen_length, "steps must be None or an integer in [0, gen_length = ",
                      o.gen_length, "] (a step commits at least one token), got ", *o.steps);
  }
  if (llada) {  // Dream's samplers: LLaDA's vanilla ranks by confidence and proposes the argmax
    TORCH_CHECK_VALUE(!o.alg || *o.alg == Alg::kConfidence, "alg = '", alg_name(o.alg.value_or(Alg::kConfidence)),
                      "' is a Dream-family sampler; LLaDA checkpoints rank by confidence (alg='confidence')");
    TORCH_CHECK_VALUE(o.alg_temp == 0, "alg_temp applies to Dream checkpoints only; leave it 0 for LLaDA");
    TORCH_CHECK_VALUE(!o.top_p && !o.top_k, "top_p / top_k apply to Dream checkpoints only; leave them None for "
                      "LLaDA");
  }
  if (dream && o.policy != Policy::kVanilla) {
    TORCH_CHECK_VALUE(o.temperature == 0, "temperature > 0 samples only in Dream's vanilla decoder; policy '",
                      policy_name(o.policy), "' decodes Dream checkpoints greedily (as the authors' decoders do)");
  }
  if (o.policy == Policy::kVanilla && !llada) {
    // Dream's vanilla sampler has no blocks (block_length unused) and its own schedule over `steps`;
    // LLaDA's block and schedule rules are checked once the family is known to be LLaDA.
    if (dream) {
      TORCH_CHECK_VALUE(o.steps.value_or(o.gen_length) >= 1, "steps must be >= 1 for Dream's vanilla sampler "
                        "(None: gen_length steps), got ", o.steps.value_or(0));
    }
    return;
  }
  if (o.policy != Policy::kBlockBatch) {
    TORCH_CHECK_VALUE(o.block_length <= o.gen_length, "block_length must be an integer in [1, gen_length = ",
                      o.gen_length, "], got ", o.block_length);
    TORCH_CHECK_VALUE(o.gen_length % o.block_length == 0, "block_length = ", o.block_length,
                      " must divide gen_length = ", o.gen_length);
    if (dream) {
      TORCH_CHECK_VALUE(o.commit() == CommitRule::kThreshold, "policy '", policy_name(o.policy), "' commits by "
                        "threshold on Dream checkpoints (Fast-dLLM's Dream decoder): set threshold and leave "
                        "factor None");
    }
    if (o.commit() == CommitRule::kFixed) {
      const int64_t blocks = o.gen_length / o.block_length;
      TORCH_CHECK_VALUE(o.steps.value_or(0) > 0 && *o.steps % blocks == 0, "steps must be a positive multiple of the "
                        "number of blocks (", blocks, " = gen_length / block_length) for the fixed schedule, got ",
                        o.steps ? std::to_string(*o.steps) : std::string("None"));
    }
    return;
  }
  TORCH_CHECK_VALUE(o.commit() == CommitRule::kThreshold,
                    "policy 'blockbatch' commits by threshold: set threshold and leave factor None");
  if (dream) {
    TORCH_CHECK_VALUE(o.refresh_mode == RefreshMode::kPeriodic, "refresh_mode 'divergence' is LLaDA-only; Dream's "
                      "BlockBatch refreshes every refresh_tokens tokens (refresh_mode='periodic')");
    TORCH_CHECK_VALUE(!o.top_p && !o.top_k, "top_p / top_k apply to Dream's single-branch decoders; BlockBatch "
                      "proposes the argmax");
  }
  if (!o.block_sizes) return;  // the family's default, checked once resolved
  TORCH_CHECK_VALUE(!o.block_sizes->empty(), "block_sizes must be a non-empty list of block sizes");
  std::set<int64_t> seen;
  for (int64_t b : *o.block_sizes) {
    TORCH_CHECK_VALUE(o.gen_length % b == 0, "block size ", b, " in block_sizes must be a positive divisor of "
                      "gen_length = ", o.gen_length);
    TORCH_CHECK_VALUE(seen.insert(b).second, "block_sizes must not repeat a size, got ", b, " twice");
  }
}

}  // namespace

void DecodeOptions::check() const {
  check_option_ranges(*this);
  check_relations(*this, nullptr);
}

void DecodeOptions::validate(const ModelConfig& c, int64_t prompt_length) const {
  TORCH_CHECK_VALUE(prompt_length > 0, "prompt_ids must not be empty");
  check_option_ranges(*this);
  // Before the rules relating options: a canvas that cannot fit is the error to report first.
  // Written without the sum: the comparison must not overflow.
  if (prompt_length > c.max_sequence_length || gen_length > c.max_sequence_length - prompt_length) {
    const bool fits = gen_length <= std::numeric_limits<int64_t>::max() - prompt_length;
    TORCH_CHECK_VALUE(false, "prompt length ", prompt_length, " + gen_length ", gen_length,
                      fits ? " = " + std::to_string(prompt_length + gen_length) : std::string(),
                      " exceeds max_sequence_length = ", c.max_sequence_length);
  }
  check_relations(*this, family_name(c.family));
}

// ---------------------------------------------------------------- helpers of the generated code

namespace {

template <typename T>
bool in_range(T v, std::optional<T> lo, bool lo_open, std::optional<T> hi, bool hi_open) {
  if (lo && (lo_open ? !(v > *lo) : !(v >= *lo))) return false;
  if (hi && (hi_open ? !(v < *hi) : !(v <= *hi))) return false;
  return true;
}

}  // namespace

void check_range(const char* name, int64_t v, std::optional<int64_t> lo, bool lo_open, std::optional<int64_t> hi,
                 bool hi_open, const char* range) {
  TORCH_CHECK_VALUE(in_range(v, lo, lo_open, hi, hi_open), name, " must be ", range, ", got ", v);
}

void check_range(const char* name, double v, std::optional<double> lo, bool lo_open, std::optional<double> hi,
                 bool hi_open, const char* range) {
  TORCH_CHECK_VALUE(std::isfinite(v) && in_range(v, lo, lo_open, hi, hi_open), name, " must be ", range, ", got ",
                    v);
}

void check_count(const char* name, size_t n, int64_t max_items) {
  TORCH_CHECK_VALUE(static_cast<int64_t>(n) <= max_items, name, " may hold at most ", max_items, " entries, got ",
                    n);
}

void bad_choice(const char* name, std::string_view value, const char* range) {
  TORCH_CHECK_VALUE(false, name, " must be ", range, ", got '", std::string(value), "'");
  std::abort();  // unreachable: TORCH_CHECK_VALUE(false, ...) throws
}

bool is_none(const std::string& text) { return text == "none" || text == "None"; }

int64_t parse_int(const char* name, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  TORCH_CHECK_VALUE(!text.empty() && end == text.c_str() + text.size() && errno == 0, name,
                    ": expected an integer, got '", text, "'");
  return v;
}

double parse_float(const char* name, const std::string& text) {
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  TORCH_CHECK_VALUE(!text.empty() && end == text.c_str() + text.size() && errno == 0, name,
                    ": expected a number, got '", text, "'");
  return v;
}

bool parse_bool(const char* name, const std::string& text) {
  if (text == "1" || text == "true" || text == "on" || text == "yes") return true;
  if (text == "0" || text == "false" || text == "off" || text == "no") return false;
  TORCH_CHECK_VALUE(false, name, ": expected true or false, got '", text, "'");
}

std::vector<int64_t> parse_int_list(const char* name, const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(parse_int(name, item));
  }
  return out;
}

// ---------------------------------------------------------------- statistics

const std::vector<std::string>& decode_stat_names() {
  static const std::vector<std::string> names = {
      "nfe", "nfe_full", "nfe_block", "nfe_init", "nfe_refresh", "nfe_paper",
      "winner", "winner_block_size", "early_exit", "wall_ms", "steps", "graph_captures", "graph_replays"};
  return names;
}

std::vector<double> decode_stat_values(const DecodeStats& s) {
  return {static_cast<double>(s.nfe),        static_cast<double>(s.nfe_full),
          static_cast<double>(s.nfe_block),  static_cast<double>(s.nfe_init),
          static_cast<double>(s.nfe_refresh), static_cast<double>(s.nfe_paper),
          static_cast<double>(s.winner),     static_cast<double>(s.winner_block_size),
          s.early_exit ? 1.0 : 0.0,          s.wall_ms,
          static_cast<double>(s.steps.size()), static_cast<double>(s.graph_captures),
          static_cast<double>(s.graph_replays)};
}

}  // namespace blockbatch
