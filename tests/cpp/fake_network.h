// A Network without a model, for the decoders' unit tests (tests/cpp/): the logits of canvas position p
// are chosen by the test: logit `score[p]` on token `target[p]`, 0 on every other token, whatever the
// context. A position's confidence is then fixed, so the order in which a decoder commits is known and
// its NFE can be counted by hand. The fake reads the family's logit shift (output q predicts position
// q + shift, as the real body's outputs are read) and records every forward it runs (mode, query
// tokens, query rows); its KV buffers are real tensors of the config's shape that nothing reads.
#pragma once

#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "decode/decode.h"
#include "model/families.h"
#include "model/network.h"

namespace blockbatch::testing {

constexpr int64_t kVocab = 16;
constexpr int64_t kMask = 15;
constexpr int64_t kEos = 14;

// The family table's row named `name` (a test fails when there is none).
inline const FamilySpec& family_named(const char* name) {
  for (const FamilySpec& f : families()) {
    if (std::strcmp(f.name, name) == 0) return f;
  }
  TORCH_CHECK(false, "no family named ", name);
}

// A small config of family `name` (vocabulary kVocab, mask kMask, EOS kEos).
inline ModelConfig fake_config(const char* name, int64_t max_sequence_length = 64) {
  ModelConfig c;
  c.family = family_named(name).id;
  c.d_model = 4;
  c.n_layers = 1;
  c.n_heads = 1;
  c.n_kv_heads = 1;
  c.mlp_hidden_size = 4;
  c.vocab_size = kVocab;
  c.embedding_size = kVocab;
  c.mask_token_id = kMask;
  c.eos_token_id = kEos;
  c.max_sequence_length = max_sequence_length;
  c.rope_theta = 10000;
  c.rms_norm_eps = 1e-5;
  return c;
}

struct ForwardCall {
  KvMode mode;
  int64_t tokens;  // query tokens (T)
  int64_t rows;    // query rows (R)
};

class FakeNetwork final : public Network {
 public:
  // target / score: per canvas position (positions past the vectors: token 1, score 0).
  FakeNetwork(ModelConfig config, std::vector<int64_t> target, std::vector<float> score)
      : config_(config), target_(std::move(target)), score_(std::move(score)),
        shift_(family_spec(config.family).logit_shift) {}

  const ModelConfig& config() const override { return config_; }
  c10::ScalarType dtype() const override { return at::kFloat; }
  c10::Device device() const override { return c10::Device(c10::kCPU); }
  void check(const ForwardBatch& batch) const override { check_forward_batch(*this, batch); }
  at::Tensor new_kv(int64_t rows, int64_t length) const override {
    return zero_kv(*this, at::TensorOptions().dtype(dtype()), rows, length);
  }

  at::Tensor forward(const ForwardBatch& batch) const override {
    check(batch);
    const ForwardBatch b = contiguous_indices(batch);
    const at::Tensor pos = b.positions.cpu();
    const int64_t T = pos.size(0);
    std::vector<int64_t> rows;
    if (b.logit_index.defined()) {
      const at::Tensor li = b.logit_index.cpu();
      rows.assign(li.const_data_ptr<int64_t>(), li.const_data_ptr<int64_t>() + li.numel());
    } else {
      for (int64_t i = 0; i < T; ++i) rows.push_back(i);
    }
    at::Tensor out = at::zeros({static_cast<int64_t>(rows.size()), config_.vocab_size}, at::kFloat);
    float* o = out.mutable_data_ptr<float>();
    for (size_t i = 0; i < rows.size(); ++i) {
      const int64_t p = pos.const_data_ptr<int64_t>()[rows[i]] + shift_;  // the position this output predicts
      o[i * config_.vocab_size + target_of(p)] = score_of(p);
    }
    calls.push_back({b.mode, T, b.cu_seqlens.size(0) - 1});
    return out;
  }

  int64_t target_of(int64_t p) const { return p >= 0 && p < static_cast<int64_t>(target_.size()) ? target_[p] : 1; }
  float score_of(int64_t p) const { return p >= 0 && p < static_cast<int64_t>(score_.size()) ? score_[p] : 0.f; }

  mutable std::vector<ForwardCall> calls;

 private:
  ModelConfig config_;
  std::vector<int64_t> target_;
  std::vector<float> score_;
  int64_t shift_;
};

// A decode that records the canvases before every forward (decode/stop.h Progress) and the order in
// which canvas positions stopped being masks.
struct Recorded {
  DecodeResult result;
  std::vector<std::vector<int64_t>> canvases;  // before each forward, then the result
  std::vector<std::vector<int64_t>> commits;   // per forward: the positions it unmasked, ascending
  std::vector<int64_t> order() const {         // every commit in order (within a forward: ascending)
    std::vector<int64_t> out;
    for (const auto& c : commits) out.insert(out.end(), c.begin(), c.end());
    return out;
  }
};

// Runs decode() on `net`, recording the first canvas row before each forward (a single-branch
// policy's canvas; BlockBatch's canvases are its branches' rows, sorted block sizes, concatenated).
inline Recorded run_decode(const Network& net, const std::vector<int64_t>& prompt, const DecodeOptions& o) {
  Recorded r;
  const Progress progress = [&](const int64_t* canvases, int64_t numel) {
    (void)numel;
    const int64_t L = static_cast<int64_t>(prompt.size()) + o.gen_length;
    r.canvases.emplace_back(canvases, canvases + L);
  };
  r.result = decode(net, prompt, o, nullptr, &progress);
  r.canvases.push_back(r.result.tokens);
  for (size_t i = 1; i < r.canvases.size(); ++i) {
    std::vector<int64_t> now;
    for (size_t p = 0; p < r.canvases[i].size(); ++p) {
      if (r.canvases[i - 1][p] == kMask && r.canvases[i][p] != kMask) now.push_back(static_cast<int64_t>(p));
    }
    r.commits.push_back(now);
  }
  return r;
}

}  // namespace blockbatch::testing
