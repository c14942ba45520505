// The rules in which two model families' decoders differ (docs/ALGORITHMS.md sections 4 and 5),
// one row per family (family.cpp): the only place a decoder or an option check may ask which
// family it runs. A new family is a row here (and its weight names in model/), not a new decoder.
#pragma once

#include <string>

#include "decode/options.h"
#include "model/config.h"

namespace blockbatch {

enum class VanillaSchedule {
  kBlockFixed,  // LLaDA: blocks of block_length, a fixed per-block schedule or a commit rule (section 3)
  kTimestep,    // Dream: no blocks, k = m * (1 - t[i+1] / t[i]) over linspace(1, eps, steps + 1) (5.3)
};
enum class SeedRule {
  kCommitByRule,     // LLaDA: a full forward commits by the commit rule, like any step (3, 4.2)
  kFirstMaskArgmax,  // Dream: a full forward writes exactly one token, the window's first mask (5.3, 5.4)
};
enum class MapRule {
  kReplace,              // LLaDA: a block step's map replaces the window's entries (probabilities > floor)
  kAccumulateSinceSeed,  // Dream: entries accumulate (> floor) until the next seed clears them (5.4)
};
enum class ExitRule {
  kEosProbabilityTie,     // LLaDA: the highest EOS probability within the tie tolerance, after block steps (4.6)
  kDecodedProgressBlock,  // Dream: the largest (decoded, progress, block), checked after every phase (5.4)
};
enum class RefreshClock {
  kBlocks,          // LLaDA: completed blocks since the branch's last refresh
  kFrontierTokens,  // Dream: tokens of frontier progress since the last seed
};
enum class NfeCount {
  kWinnerParticipation,  // LLaDA: the paper's NFE is the winner's forwards
  kEveryForward,         // Dream: every forward executed (the authors' harness counts model calls)
};
enum class AttnPattern {
  kBidirectional,  // every position sees the whole canvas (LLaDA, Dream)
  kBlockCausal,    // a position sees its own block and every earlier one (block-diffusion families)
};
enum class Readout {
  kDevice,    // proposals and bookkeeping on the device, ties to the earliest position (section 2)
  kHostTopk,  // the canvas on the host, ranking by at::topk's own order for equal values (5.2, 5.5)
};

struct FamilyRules {
  const char* name;     // "llada" | "dream" | "llada2": the options table's family column
  int64_t logit_shift;  // canvas position p reads model output p - logit_shift
  VanillaSchedule vanilla;
  SeedRule full_forward;
  MapRule map;
  bool gate_inclusive;  // a merge writes a token rated >= merge_threshold (else >)
  ExitRule exit;
  RefreshClock refresh_clock;
  NfeCount nfe;
  AttnPattern attention;
  Readout readout;
  // The options a family's decoders implement (supports() below).
  bool samplers;                 // alg / alg_temp / top_p / top_k (Dream's sample_tokens)
  bool samples_outside_vanilla;  // temperature > 0 in the cached and BlockBatch decoders too
  bool cached_any_commit_rule;   // prefix / dual take the fixed schedule and factor, not only threshold
  bool blockbatch_divergence;    // BlockBatch's refresh_mode 'divergence'
  bool blockbatch_filters;       // top_p / top_k in BlockBatch (which proposes the argmax)
};

// The row of `family` (every Family has one).
const FamilyRules& rules_for(Family family);

// Why `o` (table ranges already checked) cannot decode on a model whose rules are `rules` (nullptr:
// the family is not known yet, so only the rules every family shares): the first reason, as an
// error message naming the option, or "" when it can.
std::string refusal(const FamilyRules* rules, const DecodeOptions& o);

// refusal() as a c10::ValueError.
void check_supported(const FamilyRules* rules, const DecodeOptions& o);

}  // namespace blockbatch
