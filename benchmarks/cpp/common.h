// Shared pieces of the bb_* binaries.
#pragma once

#include <c10/util/Exception.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <new>
#include <string>

#include "io/safetensors.h"
#include "model/model.h"

namespace blockbatch::bench {

// A model from a Hugging Face folder (LLaDA or Dream: the family is config.json's model_type) read
// by the strict C++ reader; dtype "float32" | "bfloat16".
inline Model load_model(const std::string& dir, const std::string& dtype) {
  TORCH_CHECK_VALUE(dtype == "float32" || dtype == "bfloat16", "--dtype must be float32 or bfloat16, got '", dtype,
                    "'");
  auto ckpt = io::load_checkpoint(dir);
  return Model(ckpt.config, ckpt.weights, dtype == "bfloat16" ? at::kBFloat16 : at::kFloat);
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

// One line saying what the reader made of config.json (the LLaDA field names, whichever family):
//   model family=dream attention_bias=1 d_model=... n_layers=... ... rms_norm_eps=...
inline void print_config(const ModelConfig& c) {
  std::printf("model family=%s attention_bias=%d d_model=%lld n_layers=%lld n_heads=%lld n_kv_heads=%lld "
              "mlp_hidden_size=%lld vocab_size=%lld embedding_size=%lld mask_token_id=%lld eos_token_id=%lld "
              "max_sequence_length=%lld weight_tying=%d rope_theta=%s rms_norm_eps=%s\n",
              family_name(c.family), c.attention_bias ? 1 : 0, static_cast<long long>(c.d_model),
              static_cast<long long>(c.n_layers), static_cast<long long>(c.n_heads),
              static_cast<long long>(c.n_kv_heads), static_cast<long long>(c.mlp_hidden_size),
              static_cast<long long>(c.vocab_size), static_cast<long long>(c.embedding_size),
              static_cast<long long>(c.mask_token_id), static_cast<long long>(c.eos_token_id),
              static_cast<long long>(c.max_sequence_length), c.weight_tying ? 1 : 0, shortest(c.rope_theta).c_str(),
              shortest(c.rms_norm_eps).c_str());
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
