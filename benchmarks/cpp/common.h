// Shared pieces of the bb_* binaries.
#pragma once

#include <c10/util/Exception.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <memory>
#include <new>
#include <string>

#include "io/safetensors.h"
#include "model/families.h"
#include "model/network.h"

namespace blockbatch::bench {

// The native model of a Hugging Face folder (LLaDA, Dream or LLaDA2: the family is config.json's
// model_type) read by the strict C++ reader; dtype "float32" | "bfloat16".
inline std::unique_ptr<Network> load_model(const std::string& dir, const std::string& dtype) {
  TORCH_CHECK_VALUE(dtype == "float32" || dtype == "bfloat16", "--dtype must be float32 or bfloat16, got '", dtype,
                    "'");
  return io::build_model(io::load_checkpoint(dir), dtype == "bfloat16" ? at::kBFloat16 : at::kFloat);
}

// The shortest of %.15g .. %.17g that reads back as x (1e-06, not 9.9999999999999995e-07).
inline std::string shortest(double x) {
  char buf[32];
  for (int digits = 15; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, x);
    if (std::strtod(buf, nullptr) == x) break;
  }
  return buf;
}

// One line saying what the reader made of config.json (the LLaDA field names, whichever family;
// LLaDA2's own fields after them on a LLaDA2 checkpoint):
//   model family=dream attention_bias=1 d_model=... n_layers=... ... rms_norm_eps=...
inline void print_config(const ModelConfig& c) {
  std::printf("model family=%s attention_bias=%d d_model=%lld n_layers=%lld n_heads=%lld n_kv_heads=%lld "
              "mlp_hidden_size=%lld vocab_size=%lld embedding_size=%lld mask_token_id=%lld eos_token_id=%lld "
              "max_sequence_length=%lld weight_tying=%d rope_theta=%s rms_norm_eps=%s",
              family_name(c.family), c.attention_bias ? 1 : 0, static_cast<long long>(c.d_model),
              static_cast<long long>(c.n_layers), static_cast<long long>(c.n_heads),
              static_cast<long long>(c.n_kv_heads), static_cast<long long>(c.mlp_hidden_size),
              static_cast<long long>(c.vocab_size), static_cast<long long>(c.embedding_size),
              static_cast<long long>(c.mask_token_id), static_cast<long long>(c.eos_token_id),
              static_cast<long long>(c.max_sequence_length), c.weight_tying ? 1 : 0, shortest(c.rope_theta).c_str(),
              shortest(c.rms_norm_eps).c_str());
  const BodyOptions& parts = family_spec(c.family).body;
  if (parts.explicit_head_size || parts.partial_rotary || parts.moe) {  // the fields of the optional parts
    std::printf(" head_size=%lld rope_dims=%lld qk_norm=%d attn_out_bias=%d num_experts=%lld experts_per_token=%lld "
                "expert_groups=%lld expert_groups_kept=%lld moe_hidden_size=%lld shared_experts=%lld "
                "first_dense_layers=%lld routed_scaling=%s",
                static_cast<long long>(c.head_size), static_cast<long long>(c.rope_dims), c.qk_norm ? 1 : 0,
                c.attn_out_bias ? 1 : 0, static_cast<long long>(c.num_experts),
                static_cast<long long>(c.experts_per_token), static_cast<long long>(c.expert_groups),
                static_cast<long long>(c.expert_groups_kept), static_cast<long long>(c.moe_hidden_size),
                static_cast<long long>(c.shared_experts), static_cast<long long>(c.first_dense_layers),
                shortest(c.routed_scaling).c_str());
  }
  std::printf("\n");
  std::fflush(stdout);
}

// A binary's body: any error ends in one "error: ..." line on stderr and status 1.
template <typename Body>
int run_main(Body&& body) {
  try {
    return body();
  } catch (const c10::Error& e) {
    std::cerr << "error: " << e.msg() << "\n";
  } catch (const std::bad_alloc&) {
    std::cerr << "error: out of memory (the model or the requested shapes do not fit)\n";
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
  }
  return 1;
}

}  // namespace blockbatch::bench
