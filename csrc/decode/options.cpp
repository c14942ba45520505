#include "decode/options.h"

#include <c10/util/Exception.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>
#include <string>

#include "decode/policies/policy.h"
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

void DecodeOptions::check() const {
  check_option_ranges(*this);
  check_supported(nullptr, *this);  // the family is not known yet: the rules every family shares
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
  check_supported(&family_spec(c.family), *this);
  const int64_t canvas = canvas_length(*this, prompt_length);
  TORCH_CHECK_VALUE(canvas <= c.max_sequence_length, "prompt length ", prompt_length, " + gen_length ", gen_length,
                    " rounded up to a whole block (block_length = ", block_length,
                    ", blocks aligned at position 0) = ", canvas,
                    " exceeds max_sequence_length = ", c.max_sequence_length);
}

int64_t canvas_length(const DecodeOptions& o, int64_t prompt_length) {
  const int64_t length = prompt_length + o.gen_length;
  const int64_t unit = policy(o.policy).canvas_unit(o);
  return (length + unit - 1) / unit * unit;
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
  TORCH_CHECK_VALUE(std::isfinite(v) && in_range(v, lo, lo_open, hi, hi_open), name, " must be ", range, ", got ", v);
}

void check_count(const char* name, size_t n, int64_t max_items) {
  TORCH_CHECK_VALUE(static_cast<int64_t>(n) <= max_items, name, " may hold at most ", max_items, " entries, got ", n);
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
  static const std::vector<std::string> names = {"nfe",
                                                 "nfe_full",
                                                 "nfe_block",
                                                 "nfe_init",
                                                 "nfe_refresh",
                                                 "nfe_paper",
                                                 "winner",
                                                 "winner_block_size",
                                                 "early_exit",
                                                 "wall_ms",
                                                 "steps",
                                                 "graph_captures",
                                                 "graph_replays",
                                                 "edits",
                                                 "folded_rows",
                                                 "folded_tokens",
                                                 "prefix_cache_hit_tokens",
                                                 "kv_pages_copied",
                                                 "nfe_prefill",
                                                 "nfe_store"};
  return names;
}

std::vector<double> decode_stat_values(const DecodeStats& s) {
  return {static_cast<double>(s.nfe),
          static_cast<double>(s.nfe_full),
          static_cast<double>(s.nfe_block),
          static_cast<double>(s.nfe_init),
          static_cast<double>(s.nfe_refresh),
          static_cast<double>(s.nfe_paper),
          static_cast<double>(s.winner),
          static_cast<double>(s.winner_block_size),
          s.early_exit ? 1.0 : 0.0,
          s.wall_ms,
          static_cast<double>(s.steps.size()),
          static_cast<double>(s.graph_captures),
          static_cast<double>(s.graph_replays),
          static_cast<double>(s.edits),
          static_cast<double>(s.folded_rows),
          static_cast<double>(s.folded_tokens),
          static_cast<double>(s.prefix_cache_hit_tokens),
          static_cast<double>(s.kv_pages_copied),
          static_cast<double>(s.nfe_prefill),
          static_cast<double>(s.nfe_store)};
}

}  // namespace blockbatch
