// The policy table's invariants (decode/policies/policy.h): what the rest of the engine assumes when
// it asks the table instead of naming a policy. Every check runs over the whole table and the whole
// family table, so a new policy or family is tested without a line here.
#include "unit.h"

#include <algorithm>
#include <set>
#include <string>

#include "decode/options.h"
#include "decode/policies/policy.h"
#include "decode/refused.h"
#include "model/families.h"

using namespace blockbatch;

namespace {

// A request of policy `id` on `family` with the table's defaults (gen_length 128: a multiple of every
// default block size).
DecodeOptions defaults_for(Policy id, const FamilySpec& family) {
  DecodeOptions o;
  o.policy = id;
  return o.resolved(family.name);
}

bool decodes(const PolicyDescriptor& d, const FamilySpec& f) { return d.family_refusal(f).empty(); }

}  // namespace

TEST_CASE("policy table: row i is policy i, every policy of the options table has a row") {
  const auto& table = policy_table();
  REQUIRE(!table.empty());
  std::string choices;  // parse_policy's refusal lists every policy name of the options table
  try {
    parse_policy("no such policy");
  } catch (const c10::Error& e) {
    choices = e.what_without_backtrace();
  }
  size_t named = 0;
  for (size_t i = 0; i < table.size(); ++i) {
    CAPTURE(i);
    REQUIRE(table[i] != nullptr);
    CHECK(static_cast<size_t>(table[i]->id) == i);
    CHECK(&policy(table[i]->id) == table[i]);
    const std::string name = policy_name(table[i]->id);
    CHECK(parse_policy(name) == table[i]->id);
    CHECK(choices.find("'" + name + "'") != std::string::npos);
    named += 1;
  }
  // the rejected name, then exactly the table's names
  CHECK(std::count(choices.begin(), choices.end(), '\'') == static_cast<std::ptrdiff_t>(2 * named + 2));
}

TEST_CASE("policy table: every descriptor is complete") {
  std::set<std::string> stat_names(decode_stat_names().begin(), decode_stat_names().end());
  for (const PolicyDescriptor* d : policy_table()) {
    const std::string policy_text = policy_name(d->id);
    CAPTURE(policy_text);
    CHECK(static_cast<bool>(d->family_refusal));
    CHECK(static_cast<bool>(d->option_refusal));
    CHECK(static_cast<bool>(d->kv_rows));
    CHECK(static_cast<bool>(d->canvas_unit));
    CHECK(static_cast<bool>(d->cached_prompt_block));
    CHECK(static_cast<bool>(d->graphs));
    CHECK(static_cast<bool>(d->needs_paged_pool));
    CHECK(static_cast<bool>(d->adapts_to_load));
    CHECK(static_cast<bool>(d->at_load));
    CHECK(static_cast<bool>(d->make));
    CHECK(!d->step_kinds.empty());
    CHECK(std::set<StepKind>(d->step_kinds.begin(), d->step_kinds.end()).size() == d->step_kinds.size());
    for (const std::string& s : d->stats) {
      CAPTURE(s);
      CHECK(stat_names.count(s) == 1);
    }
  }
}

TEST_CASE("policy table: every family is decoded by a policy, every policy decodes a family") {
  for (const FamilySpec& f : families()) {
    const std::string family_name = f.name;
    CAPTURE(family_name);
    CHECK(std::any_of(policy_table().begin(), policy_table().end(),
                      [&](const PolicyDescriptor* d) { return decodes(*d, f); }));
  }
  for (const PolicyDescriptor* d : policy_table()) {
    const std::string policy_text = policy_name(d->id);
    CAPTURE(policy_text);
    CHECK(std::any_of(families().begin(), families().end(), [&](const FamilySpec& f) { return decodes(*d, f); }));
  }
}

TEST_CASE("policy table: a family refusal names the family and the policies that decode it") {
  for (const FamilySpec& f : families()) {
    for (const PolicyDescriptor* d : policy_table()) {
      if (decodes(*d, f)) continue;
      const std::string family_name = f.name;
      CAPTURE(family_name);
      const std::string policy_text = policy_name(d->id);
      CAPTURE(policy_text);
      const Refusal refused = refusal(&f, defaults_for(d->id, f));
      CHECK(refused.param == "policy");
      const std::string& why = refused.message;
      CHECK(why.find(std::string("policy '") + policy_name(d->id) + "'") != std::string::npos);
      CHECK(why.find(f.name) != std::string::npos);
      for (const PolicyDescriptor* other : policy_table()) {
        if (decodes(*other, f)) CHECK(why.find(std::string("'") + policy_name(other->id) + "'") != std::string::npos);
      }
      CHECK_THROWS_AS(check_supported(&f, defaults_for(d->id, f)), Refused);
      try {
        check_supported(&f, defaults_for(d->id, f));
      } catch (const Refused& e) {
        CHECK(e.kind() == ErrorKind::kUnsupported);
        CHECK(e.param() == "policy");
      }
    }
  }
}

TEST_CASE("policy table: the default request of each policy on each family it decodes is admitted") {
  for (const FamilySpec& f : families()) {
    for (const PolicyDescriptor* d : policy_table()) {
      if (!decodes(*d, f)) continue;
      const std::string family_name = f.name;
      CAPTURE(family_name);
      const std::string policy_text = policy_name(d->id);
      CAPTURE(policy_text);
      DecodeOptions o = defaults_for(d->id, f);
      // wavefront repairs its drafts by editing: edit_threshold has no default and must be set
      // (tests/helpers/families.py REQUIRED_OPTIONS).
      if (d->id == Policy::kWavefront) o.edit_threshold = 0.5;
      CHECK(refusal(&f, o).message == "");
      CHECK(refusal(nullptr, o).message == "");
      CHECK(!refusal(&f, o));
      CHECK(d->kv_rows(o) >= 0);
      CHECK(d->canvas_unit(o) >= 1);
      CHECK(d->cached_prompt_block(o) >= 0);
      // The canvas spans prompt + gen_length rounded up to the policy's unit.
      for (int64_t lp : {1, 5, 16, 17}) {
        const int64_t L = canvas_length(o, lp);
        CHECK(L >= lp + o.gen_length);
        CHECK(L % d->canvas_unit(o) == 0);
        CHECK(L - (lp + o.gen_length) < d->canvas_unit(o));
      }
      // A policy that does not adapt to the load decodes with the same options at any load.
      if (!d->adapts_to_load(o)) {
        const DecodeOptions at = d->at_load(o, 4, StepCurve{});
        CHECK(at.block_sizes == o.block_sizes);
        CHECK(at.gen_length == o.gen_length);
      }
    }
  }
}
