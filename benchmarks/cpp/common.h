// Shared pieces of the bb_* binaries.
#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <iostream>
#include <new>
#include <string>

#include "io/safetensors.h"
#include "model/model.h"

namespace blockbatch::bench {

// A model from a Hugging Face folder read by the strict C++ reader; dtype "float32" | "bfloat16".
inline Model load_model(const std::string& dir, const std::string& dtype) {
  TORCH_CHECK_VALUE(dtype == "float32" || dtype == "bfloat16", "--dtype must be float32 or bfloat16, got '", dtype,
                    "'");
  auto ckpt = io::load_checkpoint(dir);
  return Model(ckpt.config, ckpt.weights, dtype == "bfloat16" ? at::kBFloat16 : at::kFloat);
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
