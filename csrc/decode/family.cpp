#include "decode/family.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <set>

namespace blockbatch {

namespace {

// docs/ALGORITHMS.md sections 2-4 (LLaDA, the authors' BlockBatch and Fast-dLLM code) and 5 (Dream,
// the authors' Dream decoders).
constexpr FamilyRules kLLaDA{"llada",
                             /*logit_shift=*/0,
                             VanillaSchedule::kBlockFixed,
                             SeedRule::kCommitByRule,
                             MapRule::kReplace,
                             /*gate_inclusive=*/false,
                             ExitRule::kEosProbabilityTie,
                             RefreshClock::kBlocks,
                             NfeCount::kWinnerParticipation,
                             AttnPattern::kBidirectional,
                             Readout::kDevice,
                             /*samplers=*/false,
                             /*samples_outside_vanilla=*/true,
                             /*cached_any_commit_rule=*/true,
                             /*blockbatch_divergence=*/true,
                             /*blockbatch_filters=*/false};

constexpr FamilyRules kDream{"dream",
                             /*logit_shift=*/1,
                             VanillaSchedule::kTimestep,
                             SeedRule::kFirstMaskArgmax,
                             MapRule::kAccumulateSinceSeed,
                             /*gate_inclusive=*/true,
                             ExitRule::kDecodedProgressBlock,
                             RefreshClock::kFrontierTokens,
                             NfeCount::kEveryForward,
                             AttnPattern::kBidirectional,
                             Readout::kHostTopk,
                             /*samplers=*/true,
                             /*samples_outside_vanilla=*/false,
                             /*cached_any_commit_rule=*/false,
                             /*blockbatch_divergence=*/false,
                             /*blockbatch_filters=*/false};

// docs/ALGORITHMS.md section 11 (the authors' LLaDA2.0 / 2.1 generate): block-causal attention, one
// decoder (policy 'block', decode/policies/block.cpp); the rules the other policies read do not apply.
constexpr FamilyRules kLLaDA2{"llada2",
                              /*logit_shift=*/0,
                              VanillaSchedule::kBlockFixed,
                              SeedRule::kCommitByRule,
                              MapRule::kReplace,
                              /*gate_inclusive=*/false,
                              ExitRule::kEosProbabilityTie,
                              RefreshClock::kBlocks,
                              NfeCount::kEveryForward,
                              AttnPattern::kBlockCausal,
                              Readout::kHostTopk,
                              /*samplers=*/false,
                              /*samples_outside_vanilla=*/false,
                              /*cached_any_commit_rule=*/false,
                              /*blockbatch_divergence=*/false,
                              /*blockbatch_filters=*/false};

}  // namespace

const FamilyRules& rules_for(Family family) {
  switch (family) {
    case Family::kLLaDA: return kLLaDA;
    case Family::kDream: return kDream;
    case Family::kLLaDA2: return kLLaDA2;
  }
  TORCH_CHECK(false, "rules_for: no rules for family ", static_cast<int>(family));
}

std::string refusal(const FamilyRules* rules, const DecodeOptions& o) {
  const bool block_causal = rules != nullptr && rules->attention == AttnPattern::kBlockCausal;
  if (o.policy == Policy::kBlock) {
    if (rules != nullptr && !block_causal) {
      return c10::str("policy 'block' is the decoder of block-causal checkpoints (LLaDA2); ", rules->name,
                      " checkpoints decode with policy 'vanilla', 'prefix', 'dual' or 'blockbatch'");
    }
    if (o.steps && *o.steps < 1) {
      return c10::str("steps must be None (block_length steps per block) or >= 1 for policy 'block', got ", *o.steps);
    }
    if (o.factor) return "policy 'block' commits by threshold (LLaDA2's rule): leave factor None";
    if (o.temperature != 0) {
      return "policy 'block' decodes greedily (the argmax, as LLaDA2.1's greedy decoder): leave temperature 0";
    }
    if (o.top_p || o.top_k || o.alg_temp != 0 || (o.alg && *o.alg != Alg::kConfidence)) {
      return "alg / alg_temp / top_p / top_k are Dream-family samplers; policy 'block' proposes the argmax";
    }
    return "";
  }
  if (block_causal) {
    return c10::str("policy '", policy_name(o.policy), "' is not defined on ", rules->name,
                    " checkpoints (block-causal attention: a block sees only itself and earlier blocks, so their "
                    "exact cache is the block policy's): use policy='block' (docs/ALGORITHMS.md 11)");
  }
  if (o.edit_threshold) return "edit_threshold applies to policy 'block' (LLaDA2.1 token editing) only";
  if (o.steps && *o.steps > o.gen_length) {
    return c10::str("steps must be None or an integer in [0, gen_length = ", o.gen_length,
                    "] (a step commits at least one token), got ", *o.steps);
  }
  if (rules != nullptr && !rules->samplers) {
    if (o.alg && *o.alg != Alg::kConfidence) {
      return c10::str("alg = '", alg_name(*o.alg),
                      "' is a Dream-family sampler; LLaDA checkpoints rank by "
                      "confidence (alg='confidence')");
    }
    if (o.alg_temp != 0) return "alg_temp applies to Dream checkpoints only; leave it 0 for LLaDA";
    if (o.top_p || o.top_k) return "top_p / top_k apply to Dream checkpoints only; leave them None for LLaDA";
  }
  if (rules != nullptr && !rules->samples_outside_vanilla && o.policy != Policy::kVanilla && o.temperature != 0) {
    return c10::str("temperature > 0 samples only in Dream's vanilla decoder; policy '", policy_name(o.policy),
                    "' decodes Dream checkpoints greedily (as the authors' decoders do)");
  }
  if (o.policy == Policy::kVanilla && (rules == nullptr || rules->vanilla == VanillaSchedule::kTimestep)) {
    // A timestep schedule has no blocks (block_length unused) and runs over `steps`; the block
    // and schedule rules of kBlockFixed are checked once the family is known.
    if (rules != nullptr && o.steps.value_or(o.gen_length) < 1) {
      return c10::str("steps must be >= 1 for Dream's vanilla sampler (None: gen_length steps), got ",
                      o.steps.value_or(0));
    }
    return "";
  }
  if (o.policy != Policy::kBlockBatch) {
    if (o.block_length > o.gen_length) {
      return c10::str("block_length must be an integer in [1, gen_length = ", o.gen_length, "], got ", o.block_length);
    }
    if (o.gen_length % o.block_length != 0) {
      return c10::str("block_length = ", o.block_length, " must divide gen_length = ", o.gen_length);
    }
    if (rules != nullptr && !rules->cached_any_commit_rule && o.commit() != CommitRule::kThreshold) {
      return c10::str("policy '", policy_name(o.policy),
                      "' commits by threshold on Dream checkpoints (Fast-dLLM's "
                      "Dream decoder): set threshold and leave factor None");
    }
    if (o.commit() == CommitRule::kFixed) {
      const int64_t blocks = o.gen_length / o.block_length;
      if (!(o.steps.value_or(0) > 0 && *o.steps % blocks == 0)) {
        return c10::str("steps must be a positive multiple of the number of blocks (", blocks,
                        " = gen_length / block_length) for the fixed schedule, got ",
                        o.steps ? std::to_string(*o.steps) : std::string("None"));
      }
    }
    return "";
  }
  if (o.commit() != CommitRule::kThreshold) {
    return "policy 'blockbatch' commits by threshold: set threshold and leave factor None";
  }
  if (rules != nullptr && !rules->blockbatch_divergence && o.refresh_mode != RefreshMode::kPeriodic) {
    return "refresh_mode 'divergence' is LLaDA-only; Dream's BlockBatch refreshes every refresh_tokens tokens "
           "(refresh_mode='periodic')";
  }
  if (rules != nullptr && rules->samplers && !rules->blockbatch_filters && (o.top_p || o.top_k)) {
    return "top_p / top_k apply to Dream's single-branch decoders; BlockBatch proposes the argmax";
  }
  if (!o.block_sizes) return "";  // the family's default, checked once resolved
  if (o.block_sizes->empty()) return "block_sizes must be a non-empty list of block sizes";
  std::set<int64_t> seen;
  for (int64_t b : *o.block_sizes) {
    if (o.gen_length % b != 0) {
      return c10::str("block size ", b, " in block_sizes must be a positive divisor of gen_length = ", o.gen_length);
    }
    if (!seen.insert(b).second) return c10::str("block_sizes must not repeat a size, got ", b, " twice");
  }
  return "";
}

void check_supported(const FamilyRules* rules, const DecodeOptions& o) {
  const std::string why = refusal(rules, o);
  TORCH_CHECK_VALUE(why.empty(), why);
}

}  // namespace blockbatch
