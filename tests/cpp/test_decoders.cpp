// Each policy's decoder run to the end on a fake Network (fake_network.h), whose logits give every
// canvas position a fixed token and confidence: the order of the commits and the NFE below are
// counted by hand from the policies' rules (docs/ALGORITHMS.md 2-4, 11 and 15). The bidirectional
// policies run on the LLaDA row (the device readout), the block and wavefront policies on the LLaDA2
// row (block-causal, blocks aligned at position 0).
//
// The canvas: prompt {3, 4} (positions 0-1), gen_length 8 (positions 2-9), block_length 4; the
// block policy's canvas runs to 12 (whole blocks). Position p proposes token p % 12 + 1 with the
// score below: every confidence (e^s / (e^s + 15), vocabulary 16) is under 0.5, so a threshold rule
// (0.9) commits the single most confident mask per forward and BlockBatch's merge gate (0.5) never
// opens.
//
//   position  2    3    4    5  |  6     7     8     9  | 10   11
//   score     0.5  1.5  1.0  2.0|  1.25  0.75  1.75  0.25| 1.0  1.5
//   order     4th  2nd  3rd  1st|  2nd   3rd   1st   4th | (block policy: 3rd, 2nd)
#include "unit.h"

#include <c10/util/Exception.h>

#include <string>
#include <vector>

#include "decode/refused.h"
#include "fake_network.h"
#include "printers.h"

using namespace blockbatch;
using namespace blockbatch::testing;

namespace {

const std::vector<int64_t> kPrompt{3, 4};

std::vector<int64_t> targets(int64_t n = 12) {
  std::vector<int64_t> t(n);
  for (int64_t p = 0; p < n; ++p) t[p] = p % 12 + 1;
  return t;
}
const std::vector<float> kLow{0, 0, 0.5f, 1.5f, 1.0f, 2.0f, 1.25f, 0.75f, 1.75f, 0.25f, 1.0f, 1.5f};
const std::vector<float> kHigh(12, 10.0f);  // every confidence above 0.999

DecodeOptions options(Policy policy) {
  DecodeOptions o;
  o.policy = policy;
  o.gen_length = 8;
  o.block_length = 4;
  o.threshold = 0.9;
  o.cuda_graphs = false;
  return o;
}

std::vector<int64_t> expected_tokens() {
  std::vector<int64_t> t = kPrompt;
  for (int64_t p = 2; p < 10; ++p) t.push_back(p % 12 + 1);
  return t;
}

// The query tokens of each forward the fake ran.
std::vector<int64_t> query_tokens(const FakeNetwork& net) {
  std::vector<int64_t> out;
  for (const ForwardCall& c : net.calls) out.push_back(c.tokens);
  return out;
}

std::vector<KvMode> modes(const FakeNetwork& net) {
  std::vector<KvMode> out;
  for (const ForwardCall& c : net.calls) out.push_back(c.mode);
  return out;
}

const std::vector<int64_t> kSingleBranchOrder{5, 3, 4, 2, 8, 6, 7, 9};

}  // namespace

TEST_CASE("vanilla: a full forward per commit, blocks left to right") {
  FakeNetwork net(fake_config("llada"), targets(), kLow);
  const Recorded r = run_decode(net, kPrompt, options(Policy::kVanilla));
  CHECK(r.result.tokens == expected_tokens());
  CHECK(r.order() == kSingleBranchOrder);
  CHECK(r.result.stats.nfe == 8);
  CHECK(r.result.stats.nfe_full == 8);
  CHECK(r.result.stats.nfe_block == 0);
  CHECK(query_tokens(net) == std::vector<int64_t>(8, 10));
  CHECK(modes(net) == std::vector<KvMode>(8, KvMode::kFull));
  REQUIRE(r.result.stats.steps.size() == 8);
  for (const auto& s : r.result.stats.steps) CHECK(s[0] == 1);
}

TEST_CASE("dual: a full forward starts each block, then the block against the cached canvas") {
  FakeNetwork net(fake_config("llada"), targets(), kLow);
  const Recorded r = run_decode(net, kPrompt, options(Policy::kDual));
  CHECK(r.result.tokens == expected_tokens());
  CHECK(r.order() == kSingleBranchOrder);
  CHECK(r.result.stats.nfe == 8);
  CHECK(r.result.stats.nfe_full == 2);
  CHECK(r.result.stats.nfe_block == 6);
  CHECK(query_tokens(net) == (std::vector<int64_t>{10, 4, 4, 4, 10, 4, 4, 4}));
  const KvMode F = KvMode::kFull, D = KvMode::kDual;
  CHECK(modes(net) == (std::vector<KvMode>{F, D, D, D, F, D, D, D}));
}

TEST_CASE("prefix: a full forward starts each block, then block and suffix against the prefix") {
  FakeNetwork net(fake_config("llada"), targets(), kLow);
  const Recorded r = run_decode(net, kPrompt, options(Policy::kPrefix));
  CHECK(r.result.tokens == expected_tokens());
  CHECK(r.order() == kSingleBranchOrder);
  CHECK(r.result.stats.nfe == 8);
  CHECK(r.result.stats.nfe_full == 2);
  CHECK(r.result.stats.nfe_block == 6);
  CHECK(query_tokens(net) == (std::vector<int64_t>{10, 8, 8, 8, 10, 4, 4, 4}));
  const KvMode F = KvMode::kFull, P = KvMode::kPrefix;
  CHECK(modes(net) == (std::vector<KvMode>{F, P, P, P, F, P, P, P}));
}

TEST_CASE("threshold: every confident mask of a block in one forward") {
  for (Policy policy : {Policy::kVanilla, Policy::kPrefix, Policy::kDual}) {
    const std::string policy_text = policy_name(policy);
    CAPTURE(policy_text);
    FakeNetwork net(fake_config("llada"), targets(), kHigh);
    const Recorded r = run_decode(net, kPrompt, options(policy));
    CHECK(r.result.tokens == expected_tokens());
    CHECK(r.result.stats.nfe == 2);  // one per block
    CHECK(r.commits == (std::vector<std::vector<int64_t>>{{2, 3, 4, 5}, {6, 7, 8, 9}}));
  }
}

TEST_CASE("fixed schedule: steps / blocks commits per forward, the most confident first") {
  FakeNetwork net(fake_config("llada"), targets(), kLow);
  DecodeOptions o = options(Policy::kDual);
  o.threshold = std::nullopt;
  o.steps = 4;  // 2 blocks: 2 steps each, 2 commits a step
  const Recorded r = run_decode(net, kPrompt, o);
  CHECK(r.result.tokens == expected_tokens());
  CHECK(r.result.stats.nfe == 4);
  CHECK(r.commits == (std::vector<std::vector<int64_t>>{{3, 5}, {2, 4}, {6, 8}, {7, 9}}));
}

TEST_CASE("blockbatch, one branch: the init forward, then a block step per commit") {
  FakeNetwork net(fake_config("llada"), targets(), kLow);
  DecodeOptions o = options(Policy::kBlockBatch);
  o.block_sizes = std::vector<int64_t>{4};
  const Recorded r = run_decode(net, kPrompt, o);
  CHECK(r.result.tokens == expected_tokens());
  CHECK(r.order() == kSingleBranchOrder);
  CHECK(r.result.stats.nfe_init == 1);
  CHECK(r.result.stats.nfe_block == 7);
  CHECK(r.result.stats.nfe_refresh == 0);  // 8 tokens: under refresh_tokens = 32
  CHECK(r.result.stats.nfe == 8);
  CHECK(r.result.stats.nfe_paper == 8);
  CHECK(r.result.stats.winner_block_size == 4);
  CHECK(!r.result.stats.early_exit);
  CHECK(query_tokens(net) == (std::vector<int64_t>{10, 4, 4, 4, 4, 4, 4, 4}));
}

TEST_CASE("blockbatch: a completed block of refresh_tokens tokens refreshes the branch's KV row") {
  FakeNetwork net(fake_config("llada"), targets(), kLow);
  DecodeOptions o = options(Policy::kBlockBatch);
  o.block_sizes = std::vector<int64_t>{4};
  o.refresh_tokens = 4;  // LLaDA's clock: completed blocks; the first block's end, not the last (done)
  const Recorded r = run_decode(net, kPrompt, o);
  CHECK(r.result.tokens == expected_tokens());
  // The refresh is a full forward: it commits by the rule like the init (position 8, the second
  // block's most confident), so the second block takes three block steps.
  CHECK(r.order() == kSingleBranchOrder);
  CHECK(r.result.stats.nfe_init == 1);
  CHECK(r.result.stats.nfe_block == 6);
  CHECK(r.result.stats.nfe_refresh == 1);
  CHECK(r.result.stats.nfe == 8);
  CHECK(query_tokens(net) == (std::vector<int64_t>{10, 4, 4, 4, 10, 4, 4, 4}));
  CHECK(modes(net)[4] == KvMode::kFull);
}

TEST_CASE("blockbatch: an early exit once the branch's completed block holds EOS") {
  std::vector<int64_t> t = targets();
  t[4] = kEos;  // committed third, in the first block
  FakeNetwork net(fake_config("llada"), t, kLow);
  DecodeOptions o = options(Policy::kBlockBatch);
  o.block_sizes = std::vector<int64_t>{4};
  const Recorded r = run_decode(net, kPrompt, o);  // stop_on_eos: BlockBatch's default
  CHECK(r.result.stats.early_exit);
  CHECK(r.result.stats.nfe == 4);  // the init and the first block's three steps
  CHECK(r.order() == (std::vector<int64_t>{5, 3, 4, 2}));
  CHECK(r.result.tokens[4] == kEos);
  // LLaDA's executor returns the winner's row as it stands: the blocks after the exit stay masks
  // (the text is cut at the first EOS).
  for (int64_t p = 6; p < 10; ++p) CHECK(r.result.tokens[p] == kMask);
}

TEST_CASE("blockbatch, two branches: one packed forward feeds both windows") {
  FakeNetwork net(fake_config("llada"), targets(), kLow);
  DecodeOptions o = options(Policy::kBlockBatch);
  o.block_sizes = std::vector<int64_t>{2, 4};
  const Recorded r = run_decode(net, kPrompt, o);
  CHECK(r.result.tokens == expected_tokens());
  // Branch 0 (block size 2) commits its window's most confident mask per forward.
  CHECK(r.order() == (std::vector<int64_t>{3, 2, 5, 4, 6, 7, 8, 9}));
  CHECK(r.result.stats.nfe_init == 1);
  CHECK(r.result.stats.nfe_block == 7);
  CHECK(r.result.stats.nfe == 8);
  REQUIRE(r.result.stats.branches.size() == 2);
  for (const BranchStats& b : r.result.stats.branches) {
    CHECK(b.committed == 8);  // no merge (every probability under the gate), no sync (never 8 apart)
    CHECK(b.merged == 0);
    CHECK(b.copied == 0);
  }
  std::vector<int64_t> packed(7, 6);  // both windows: 2 + 4 query tokens, two rows
  packed.insert(packed.begin(), 10);
  CHECK(query_tokens(net) == packed);
  for (size_t i = 1; i < net.calls.size(); ++i) CHECK(net.calls[i].rows == 2);
}

TEST_CASE("block: block-causal blocks aligned at position 0, the last one whole") {
  FakeNetwork net(fake_config("llada2"), targets(), kLow);
  DecodeOptions o = options(Policy::kBlock);
  o.steps = std::nullopt;  // block_length steps per block: one commit each
  const Recorded r = run_decode(net, kPrompt, o);
  CHECK(r.result.tokens == expected_tokens());
  // Block [0, 4) holds the prompt's tail: 2 masks; then [4, 8) and [8, 12) (10, 11: past the text).
  CHECK(r.commits == (std::vector<std::vector<int64_t>>{{3}, {2}, {5}, {6}, {4}, {7}, {8}, {}, {}, {9}}));
  CHECK(r.result.stats.nfe == 10);
  CHECK(r.result.stats.nfe_block == 10);
  // A block's first forward also writes the previous block's final K/V: two query rows.
  CHECK(query_tokens(net) == (std::vector<int64_t>{4, 4, 8, 4, 4, 4, 8, 4, 4, 4}));
  CHECK(modes(net) == std::vector<KvMode>(10, KvMode::kDual));
  CHECK(net.calls[2].rows == 2);
  CHECK(net.calls[6].rows == 2);
}

// Block 0 holds positions 2-3 (commits 3 then 2), block 1 4-7 (5, 6, 4, 7), block 2 8-11 (8, 11, 10, 9); with
// editing (no edit fires: the proposals are the committed tokens) a block ends on a step that starts
// without masks, one more forward each: 3 + 5 + 5 = 13 forwards one block at a time.
TEST_CASE("wavefront: one block in flight is the block policy with editing") {
  DecodeOptions o = options(Policy::kBlock);
  o.steps = std::nullopt;
  o.edit_threshold = 0.5;
  FakeNetwork block_net(fake_config("llada2"), targets(), kLow);
  const Recorded block = run_decode(block_net, kPrompt, o);
  o.policy = Policy::kWavefront;
  o.max_active_blocks = 1;
  FakeNetwork net(fake_config("llada2"), targets(), kLow);
  const Recorded r = run_decode(net, kPrompt, o);
  CHECK(r.result.tokens == expected_tokens());
  CHECK(r.result.tokens == block.result.tokens);
  CHECK(r.result.stats.nfe == 13);
  CHECK(block.result.stats.nfe == 13);
  CHECK(query_tokens(net) == (std::vector<int64_t>{4, 4, 4, 8, 4, 4, 4, 4, 8, 4, 4, 4, 4}));
  CHECK(query_tokens(net) == query_tokens(block_net));
  CHECK(r.commits == block.commits);
  CHECK(r.result.stats.max_blocks_in_flight == 1);
}

// Two blocks in flight, a block entering once the youngest is half decoded. Forward by forward (window;
// commits; query rows): F1 [0] 3; F2 [0,1] 2, 5 (block 0 half decoded after F1); F3 [0,1] block 0 settles
// (mask-free, no edit) and commits, 6, then block 2 enters (block 1 half decoded); F4 [1,2] 4, 8, rows
// [0,4) (block 0's final K/V), [4,8), [8,12); F5 [1,2] 7, 11; F6 [1,2] block 1 settles, 10; F7 [2] 9, rows
// [4,8), [8,12); F8 [2] block 2 settles. 8 forwards instead of 13. A block's tokens show (the stable
// canvas the progress callback gets) once it commits, the prompt's tail with its block.
TEST_CASE("wavefront: two blocks in flight, one forward over both") {
  DecodeOptions o = options(Policy::kWavefront);
  o.steps = std::nullopt;
  o.edit_threshold = 0.5;
  o.max_active_blocks = 2;
  o.spawn_threshold = 0.5;
  FakeNetwork net(fake_config("llada2"), targets(), kLow);
  const Recorded r = run_decode(net, kPrompt, o);
  CHECK(r.result.tokens == expected_tokens());
  CHECK(r.result.stats.nfe == 8);
  CHECK(query_tokens(net) == (std::vector<int64_t>{4, 8, 8, 12, 8, 8, 8, 4}));
  CHECK(net.calls[3].rows == 3);
  CHECK(modes(net) == std::vector<KvMode>(8, KvMode::kDual));
  CHECK(r.commits == (std::vector<std::vector<int64_t>>{{}, {}, {0, 1, 2, 3}, {}, {}, {4, 5, 6, 7}, {}, {8, 9}}));
  CHECK(r.result.stats.blocks_in_flight == 1 + 2 + 2 + 2 + 2 + 2 + 1 + 1);
  CHECK(r.result.stats.max_blocks_in_flight == 2);
  CHECK(r.result.stats.edits == 0);
}

TEST_CASE("stop rule: stop_on_eos ends the decode after the block holding EOS") {
  std::vector<int64_t> t = targets();
  t[4] = kEos;  // committed third, in the first block
  for (bool stop : {true, false}) {
    CAPTURE(stop);
    FakeNetwork net(fake_config("llada"), t, kLow);
    DecodeOptions o = options(Policy::kDual);
    o.stop_on_eos = stop;
    const Recorded r = run_decode(net, kPrompt, o);
    CHECK(r.result.stats.nfe == (stop ? 4 : 8));
    for (int64_t p = 6; p < 10; ++p) CHECK(r.result.tokens[p] == (stop ? kEos : t[p]));
  }
}

TEST_CASE("stop rule: the block policy (LLaDA2.0) ends at a block holding EOS") {
  std::vector<int64_t> t = targets();
  t[7] = kEos;  // the second block's last commit
  FakeNetwork net(fake_config("llada2"), t, kLow);
  DecodeOptions o = options(Policy::kBlock);
  o.steps = std::nullopt;
  const Recorded r = run_decode(net, kPrompt, o);
  CHECK(r.result.stats.nfe == 6);  // 2 + 4: the third block never starts
  CHECK(r.result.tokens[7] == kEos);
}

TEST_CASE("admission: refusals before any forward, by kind and argument") {
  const auto refused = [](const ModelConfig& c, const std::vector<int64_t>& prompt, const DecodeOptions& o,
                          ErrorKind kind, const std::string& param, const std::string& words) {
    FakeNetwork net(c, targets(64), kLow);
    CAPTURE(words);
    CHECK_THROWS_WITH_AS(decode(net, prompt, o), doctest::Contains(words.c_str()), Refused);
    try {
      decode(net, prompt, o);
    } catch (const Refused& e) {
      CHECK(error_kind_name(e.kind()) == std::string(error_kind_name(kind)));
      CHECK(e.param() == param);
    }
    CHECK(net.calls.empty());
  };
  const ErrorKind unsupported = ErrorKind::kUnsupported, prompt = ErrorKind::kInvalidPrompt;
  DecodeOptions o;
  refused(fake_config("llada"), kPrompt, options(Policy::kBlock), unsupported, "policy", "block-causal");
  refused(fake_config("llada2"), kPrompt, options(Policy::kDual), unsupported, "policy", "'block'");
  refused(fake_config("llada2"), kPrompt, options(Policy::kWavefront), unsupported, "edit_threshold",
          "needs edit_threshold");
  o = options(Policy::kWavefront);
  o.edit_threshold = 0.5;
  refused(fake_config("sdar"), kPrompt, o, unsupported, "policy", "has no rules for sdar checkpoints");
  refused(fake_config("llada"), kPrompt, o, unsupported, "policy", "block-causal");
  refused(fake_config("llada"), {3, kMask}, options(Policy::kDual), prompt, "prompt_ids", "mask id");
  refused(fake_config("llada"), {3, kVocab}, options(Policy::kDual), prompt, "prompt_ids", "outside the vocabulary");
  o = options(Policy::kDual);
  o.gen_length = 6;
  refused(fake_config("llada"), kPrompt, o, unsupported, "block_length", "must divide gen_length");
  o = options(Policy::kDual);
  o.gen_length = 64;
  o.block_length = 8;
  refused(fake_config("llada"), kPrompt, o, ErrorKind::kContextLength, "gen_length", "max_sequence_length");
  // The block policy's canvas is whole blocks: 2 + 59 positions fit 62, their 16 blocks of 4 do not.
  o = options(Policy::kBlock);
  o.gen_length = 59;
  refused(fake_config("llada2", 62), kPrompt, o, ErrorKind::kContextLength, "gen_length", "max_sequence_length");
}
