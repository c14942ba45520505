// The BLOCKBATCH_* settings of the CUDA ops (ops/cuda/settings.h): every environment read of the
// CUDA backend is in this file, each with its default in the block below.
#include "ops/cuda/settings.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <initializer_list>
#include <string>

namespace blockbatch::cuda_ops {

namespace {

// The value of environment variable `name`, one of `choices` (unset or empty: `fallback`); any
// other value is an error naming the variable and its choices. Called per op: the list of choices
// is spelled out only for the error.
std::string env_choice(const char* name, std::initializer_list<const char*> choices, const char* fallback) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return fallback;
  const std::string v(env);
  for (const char* c : choices) {
    if (v == c) return v;
  }
  std::string allowed;
  size_t i = 0;
  for (const char* c : choices) {
    allowed += std::string(i == 0 ? "" : (i + 1 == choices.size() ? " or " : ", ")) + "'" + c + "'";
    ++i;
  }
  TORCH_CHECK_VALUE(false, name, " must be ", allowed, ", got '", v, "'");
}

// The integer value of environment variable `name` in [lo, hi] (unset or empty: `fallback`).
int env_int(const char* name, int lo, int hi, int fallback) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return fallback;
  char* end = nullptr;
  const long v = std::strtol(env, &end, 10);
  TORCH_CHECK_VALUE(*end == '\0' && v >= lo && v <= hi, name, " must be an integer in [", lo, ", ", hi, "], got '", env,
                    "'");
  return static_cast<int>(v);
}

// The CUDA kernel choices when their environment variables are unset. Every BLOCKBATCH_* variable,
// its values, default and status (promoted / opt-in candidate) is one row of the settings table,
// python/blockbatch/settings.py; tests/tools/test_settings.py checks that this block and the env_choice /
// env_int calls below agree with it. Promoting a candidate: its row there and its line here.
constexpr const char* kDefaultAttnKernel = "pipelined3";  // BLOCKBATCH_ATTN_KERNEL; step 0.96-0.99x "pipelined"
constexpr const char* kDefaultRopeKernel = "vec";         // BLOCKBATCH_ROPE_KERNEL; step 0.97-1.00x "scalar"
constexpr const char* kDefaultCudaBatching = "graphs";    // BLOCKBATCH_CUDA_BATCHING; toy batch 1 1.95x eager,
                                                          // 8B batch 16 0.98-1.01x
constexpr const char* kDefaultBatchInvariant = "0";       // BLOCKBATCH_BATCH_INVARIANT
constexpr const char* kDefaultMoeKernel = "grouped";      // BLOCKBATCH_MOE_KERNEL

}  // namespace

// Key splits of a tensor-core attention launch: the heuristic's choice, or BLOCKBATCH_ATTN_SPLITS
// (1..16) when set — a tuning and debugging override, read per call so a benchmark can sweep it.
int attention_splits(int heuristic) { return env_int("BLOCKBATCH_ATTN_SPLITS", 1, 16, heuristic); }

// Which tensor-core attention kernel (flash_attention's variant): BLOCKBATCH_ATTN_KERNEL =
// "pipelined3" (the default: three cp.async stages, two tiles in flight; idle warps skip the
// arithmetic), "pipelined" (cp.async double buffering + ldmatrix) or "sync" (K/V tiles staged
// through registers, the first version, the bit-for-bit reference of the pipelined ones).
// Read per call, like the split override, so one process can time all of them.
int attention_variant() {
  const std::string v = env_choice("BLOCKBATCH_ATTN_KERNEL", {"sync", "pipelined", "pipelined3"}, kDefaultAttnKernel);
  return v == "sync" ? 1 : v == "pipelined" ? 2 : 3;
}

// rope_kv_write_'s kernel: BLOCKBATCH_ROPE_KERNEL = "vec" (the default: 16 bytes per access) or
// "scalar" (element pairs, the reference it is tested against; same bits). Read per call.
bool rope_vectorized() { return env_choice("BLOCKBATCH_ROPE_KERNEL", {"scalar", "vec"}, kDefaultRopeKernel) == "vec"; }

// The batching scheduler (decode/batch/scheduler.cpp) on a CUDA model: BLOCKBATCH_CUDA_BATCHING = "1"
// lets requests of a CUDA model share packed forwards (eager steps), "graphs" (the default) also
// pads each packed step to bucketed sizes and replays it from a CUDA graph; "0" refuses (decode them
// one by one). Read when a scheduler starts.
int cuda_batching() {
  const std::string v = env_choice("BLOCKBATCH_CUDA_BATCHING", {"0", "1", "graphs"}, kDefaultCudaBatching);
  return v == "0" ? 0 : v == "1" ? 1 : 2;
}

// BLOCKBATCH_BATCH_INVARIANT = "1": the forward's reductions do not depend on the pack (GEMMs in
// fixed-size row chunks, attention unsplit), so a request's bits on the GPU are those of its batch-1
// run; "0" or unset: the fastest algorithms for each shape. Read per op.
bool batch_invariant() { return env_choice("BLOCKBATCH_BATCH_INVARIANT", {"0", "1"}, kDefaultBatchInvariant) == "1"; }

// moe_experts' CUDA path: BLOCKBATCH_MOE_KERNEL = "grouped" (the default: the router's choices read
// on the host, one cuBLAS GEMM per active expert; no CUDA graph for the model) or "fused"
// (kernels/cuda/moe.cu: per-expert blocks over the device's choices, capturable). Read per call.
bool moe_fused() { return env_choice("BLOCKBATCH_MOE_KERNEL", {"grouped", "fused"}, kDefaultMoeKernel) == "fused"; }

}  // namespace blockbatch::cuda_ops
