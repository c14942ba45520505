// CUDA implementations of the kernel ops: validate shapes (value ranges are checked where the
// decode loop builds its index tensors, to avoid host syncs), then launch csrc/kernels/cuda.
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <torch/library.h>

#include <atomic>
#include <cstdlib>
#include <initializer_list>
#include <string>
#include <type_traits>

#include "decode/options.h"
#include "kernels/cuda/kernels.cuh"
#include "torch/ops.h"

namespace blockbatch {

namespace {

// Calls fn with a null pointer of the CUDA storage type matching `type` (float, bf16, half).
template <typename Fn>
void dispatch_cuda_type(c10::ScalarType type, const char* op, Fn&& fn) {
  switch (type) {
    case at::kFloat: fn(static_cast<float*>(nullptr)); break;
    case at::kBFloat16: fn(static_cast<__nv_bfloat16*>(nullptr)); break;
    case at::kHalf: fn(static_cast<__half*>(nullptr)); break;
    default: TORCH_CHECK(false, op, ": unsupported dtype ", type);
  }
}

template <typename T>
T* ptr(const at::Tensor& t) {
  return reinterpret_cast<T*>(t.data_ptr());
}

void check_launch(cudaError_t e, const char* op) {
  TORCH_CHECK(e == cudaSuccess, op, ": CUDA launch failed: ", cudaGetErrorString(e));
}

// A device attribute the attention launch needs (compute capability, SM count): a host-side query,
// no stream sync, cached per device after the first call (an eager warm-up, never a capture).
// Not ATen's CUDAContext.h: it pulls cuBLAS / cuSPARSE headers the toolkit may not ship.
template <cudaDeviceAttr kAttr>
int device_attribute(int device) {
  static std::atomic<int> cache[64] = {};
  std::atomic<int>& slot = cache[device & 63];
  int n = slot.load();
  if (n == 0) {
    check_launch(cudaDeviceGetAttribute(&n, kAttr, device), "cudaDeviceGetAttribute");
    slot.store(n);
  }
  return n;
}

// The value of environment variable `name`, one of `choices` (unset or empty: `fallback`); any
// other value is an error naming the variable and its choices. Called per op (per launch for
// BLOCKBATCH_PDL): the list of choices is spelled out only for the error.
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
  TORCH_CHECK_VALUE(*end == '\0' && v >= lo && v <= hi, name, " must be an integer in [", lo, ", ", hi, "], got '",
                    env, "'");
  return static_cast<int>(v);
}

// The CUDA kernel choices when their environment variables are unset. Every BLOCKBATCH_* variable,
// its values, default and status (promoted / opt-in candidate) is one row of the settings table,
// python/blockbatch/settings.py; tests/tools/test_settings.py checks that this block and the env_choice /
// env_int calls below agree with it. Promoting a candidate: its row there and its line here.
constexpr const char* kDefaultAttnKernel = "pipelined";  // BLOCKBATCH_ATTN_KERNEL; 2.4x "sync" at 6 rows x L 2048
constexpr const char* kDefaultGemm = "cublas";           // BLOCKBATCH_GEMM
constexpr int kDefaultGemmPad = 0;                       // BLOCKBATCH_GEMM_PAD
constexpr const char* kDefaultRopeKernel = "scalar";     // BLOCKBATCH_ROPE_KERNEL
constexpr const char* kDefaultPdl = "0";                 // BLOCKBATCH_PDL

// Key splits of a tensor-core attention launch: the heuristic's choice, or BLOCKBATCH_ATTN_SPLITS
// (1..16) when set — a tuning and debugging override, read per call so a benchmark can sweep it.
int attention_splits(int heuristic) { return env_int("BLOCKBATCH_ATTN_SPLITS", 1, 16, heuristic); }

// Which tensor-core attention kernel (flash_attention's variant): BLOCKBATCH_ATTN_KERNEL =
// "pipelined" (the default: cp.async double buffering + ldmatrix), "pipelined3" (three cp.async
// stages: two tiles in flight; idle warps skip the arithmetic), "splitwarps" (pipelined3, and the
// keys of q-tiles of at most 32 queries split over the warps that would idle) or "sync" (K/V tiles
// staged through registers, the first version, the bit-for-bit reference of the pipelined ones).
// Read per call, like the split override, so one process can time all of them.
int attention_variant() {
  const std::string v =
      env_choice("BLOCKBATCH_ATTN_KERNEL", {"sync", "pipelined", "pipelined3", "splitwarps"}, kDefaultAttnKernel);
  return v == "sync" ? 1 : v == "pipelined" ? 2 : v == "pipelined3" ? 3 : 4;
}

// Which GEMM runs x @ weight.T for at most 64 rows: BLOCKBATCH_GEMM = "cublas" (the default: ATen's
// at::mm), "stream" or "staged" (linear.cu's weight-streaming kernels: loads into registers, or
// through a cp.async shared-memory ring; where they apply). BLOCKBATCH_GEMM_SPLITS (1..8)
// overrides their cluster split count. Both read per call, so a benchmark can time every choice
// in one process.
enum class Gemm { kCublas, kStream, kStaged };
Gemm gemm_kind() {
  const std::string v = env_choice("BLOCKBATCH_GEMM", {"cublas", "stream", "staged"}, kDefaultGemm);
  return v == "cublas" ? Gemm::kCublas : v == "stream" ? Gemm::kStream : Gemm::kStaged;
}

int gemm_splits(int heuristic) { return env_int("BLOCKBATCH_GEMM_SPLITS", 1, 8, heuristic); }

// BLOCKBATCH_GEMM_PAD = P (2..256; unset, 0 or 1: off): a 16-bit cuBLAS GEMM of more than 64 rows
// runs on its rows padded with zero rows to a multiple of P, and returns the first M rows. The
// 6-branch step has 252 rows; if cuBLAS tiles 256 rows better than 252 (it ran 192-row tiles at
// 252, about 66% of them useful), the copy of x (2 MB) costs far less than it saves
// (bench_gpu_step.py's "pad" candidate and its GEMM sweep time it).
int gemm_row_multiple() { return env_int("BLOCKBATCH_GEMM_PAD", 0, 256, kDefaultGemmPad); }

at::Tensor padded_mm(const at::Tensor& x, const at::Tensor& weight, int64_t multiple) {
  const int64_t M = x.size(0), padded = (M + multiple - 1) / multiple * multiple;
  at::Tensor xp = at::empty({padded, x.size(1)}, x.options());
  xp.narrow(0, 0, M).copy_(x);
  xp.narrow(0, M, padded - M).zero_();
  return at::mm(xp, weight.t()).narrow(0, 0, M);  // a row prefix of a contiguous matrix: contiguous
}

// rope_kv_write_'s kernel: BLOCKBATCH_ROPE_KERNEL = "scalar" (the default: element pairs) or "vec"
// (16 bytes per access, same bits). Read per call.
bool rope_vectorized() { return env_choice("BLOCKBATCH_ROPE_KERNEL", {"scalar", "vec"}, kDefaultRopeKernel) == "vec"; }

}  // namespace

// Programmatic dependent launch for the forward's kernels (csrc/kernels/cuda/launch.cuh):
// BLOCKBATCH_PDL = "1" on, "0" or unset off.
bool cuda::programmatic_launch() { return env_choice("BLOCKBATCH_PDL", {"0", "1"}, kDefaultPdl) == "1"; }

namespace {

void check_cuda(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor, got ", t.device());
}

at::Tensor rms_norm_cuda(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rms_norm(x, weight);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty({x.size(0), x.size(1)}, x.options());
  dispatch_cuda_type(x.scalar_type(), "rms_norm", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    check_launch(cuda::rms_norm<T>(ptr<T>(x), x.stride(0), ptr<T>(weight), ptr<T>(out), x.size(0), x.size(1),
                                   static_cast<float>(eps), c10::cuda::getCurrentCUDAStream()),
                 "rms_norm");
  });
  return out;
}

at::Tensor silu_mul_cuda(const at::Tensor& gate_up) {
  check_silu_mul(gate_up);
  const c10::cuda::CUDAGuard guard(gate_up.device());
  const int64_t m = gate_up.size(1) / 2;
  at::Tensor out = at::empty({gate_up.size(0), m}, gate_up.options());
  dispatch_cuda_type(gate_up.scalar_type(), "silu_mul", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    check_launch(cuda::silu_mul<T>(ptr<T>(gate_up), ptr<T>(out), gate_up.size(0), m,
                                   c10::cuda::getCurrentCUDAStream()),
                 "silu_mul");
  });
  return out;
}

void rope_cuda(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos_sin) {
  check_rope(x, positions, cos_sin);
  const c10::cuda::CUDAGuard guard(x.device());
  dispatch_cuda_type(x.scalar_type(), "rope_", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    check_launch(cuda::rope_inplace<T>(ptr<T>(x), x.size(0), x.stride(0), x.size(1), x.size(2),
                                       positions.const_data_ptr<int64_t>(), cos_sin.const_data_ptr<float>(),
                                       cos_sin.size(0), c10::cuda::getCurrentCUDAStream()),
                 "rope_");
  });
}

// The KV buffer's geometry for a slot write, once its row indices are known to be on the device.
cpu::KvGeometry kv_slots(const at::Tensor& kv, const at::Tensor& cu_seqlens, const at::Tensor& kv_rows) {
  check_cuda(cu_seqlens, "cu_seqlens");
  check_cuda(kv_rows, "kv_rows");
  return {kv.size(1), kv.size(3), kv.size(4), kv.size(5), kv.size(0)};
}

void kv_write_cuda(const at::Tensor& kv, const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                   const at::Tensor& cu_seqlens, const at::Tensor& kv_rows, int64_t layer) {
  check_kv_write(kv, k, v, positions, cu_seqlens, kv_rows, layer);
  const c10::cuda::CUDAGuard guard(kv.device());
  const cpu::KvGeometry g = kv_slots(kv, cu_seqlens, kv_rows);
  dispatch_cuda_type(kv.scalar_type(), "kv_write_", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    check_launch(cuda::kv_write<T>(ptr<T>(kv), g, layer, ptr<T>(k), ptr<T>(v), k.stride(0),
                                   positions.const_data_ptr<int64_t>(), cu_seqlens.const_data_ptr<int64_t>(),
                                   kv_rows.const_data_ptr<int64_t>(), cu_seqlens.size(0) - 1, k.size(0),
                                   c10::cuda::getCurrentCUDAStream()),
                 "kv_write_");
  });
}

void rope_kv_write_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                        const at::Tensor& cos_sin, const at::Tensor& kv, const at::Tensor& cu_seqlens,
                        const at::Tensor& kv_rows, int64_t layer) {
  check_rope_kv_write(q, k, v, positions, cos_sin, kv, cu_seqlens, kv_rows, layer);
  const c10::cuda::CUDAGuard guard(kv.device());
  const cpu::KvGeometry g = kv_slots(kv, cu_seqlens, kv_rows);
  dispatch_cuda_type(kv.scalar_type(), "rope_kv_write_", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    check_launch(cuda::rope_kv_write<T>(ptr<T>(q), q.stride(0), q.size(1), ptr<T>(k), ptr<T>(v), k.stride(0),
                                        positions.const_data_ptr<int64_t>(), cos_sin.const_data_ptr<float>(),
                                        cos_sin.size(0), ptr<T>(kv), g, layer, cu_seqlens.const_data_ptr<int64_t>(),
                                        kv_rows.const_data_ptr<int64_t>(), cu_seqlens.size(0) - 1, k.size(0),
                                        rope_vectorized(), c10::cuda::getCurrentCUDAStream()),
                 "rope_kv_write_");
  });
}

at::Tensor packed_attention_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& cu_seqlens, const std::optional<at::Tensor>& kv,
                                 const std::optional<at::Tensor>& kv_rows,
                                 const std::optional<at::Tensor>& cache_lens, int64_t layer, bool attend_fresh) {
  check_packed_attention(q, k, v, cu_seqlens, kv, kv_rows, cache_lens, layer);
  check_cuda(cu_seqlens, "cu_seqlens");
  const c10::cuda::CUDAGuard guard(q.device());
  at::Tensor out = at::empty({q.size(0), q.size(1) * q.size(2)}, q.options());
  const cpu::AttentionArgs a = attention_args(q, k, v, cu_seqlens, kv, kv_rows, cache_lens, layer, attend_fresh, out);
  const int64_t max_keys = (attend_fresh ? q.size(0) : 0) + (kv.has_value() ? kv->size(4) : 0);  // no host sync
  const int sm_major = device_attribute<cudaDevAttrComputeCapabilityMajor>(q.get_device());
  dispatch_cuda_type(q.scalar_type(), "packed_attention", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
    if constexpr (!std::is_same_v<T, float>) {
      if (cuda::flash_attention_supported(a, 1, sm_major)) {
        const int splits = attention_splits(
            cuda::flash_attention_splits(a, q.size(0), max_keys,
                                         device_attribute<cudaDevAttrMultiProcessorCount>(q.get_device())));
        at::Tensor part;  // split-key partial results (fp32), merged by the launch's second kernel
        if (splits > 1) part = at::empty({splits, q.size(0), q.size(1), q.size(2) + 2}, q.options().dtype(at::kFloat));
        check_launch(cuda::flash_attention<T>(a, q.size(0), splits, splits > 1 ? part.data_ptr<float>() : nullptr,
                                              attention_variant(), stream),
                     "packed_attention (tensor cores)");
        return;
      }
    }
    check_launch(cuda::packed_attention<T>(a, q.size(0), max_keys, stream), "packed_attention");
  });
  return out;
}

at::Tensor linear_cuda(const at::Tensor& x, const at::Tensor& weight) {
  check_linear(x, weight);
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t M = x.size(0), N = weight.size(0), K = x.size(1);
  const Gemm kind = gemm_kind();
  if (const int multiple = gemm_row_multiple();
      multiple > 1 && x.scalar_type() != at::kFloat && M > cuda::kLinearSmallMaxRows && M % multiple != 0) {
    return padded_mm(x, weight, multiple);
  }
  if (x.scalar_type() == at::kFloat || M > cuda::kLinearSmallMaxRows || kind == Gemm::kCublas || x.stride(1) != 1 ||
      weight.stride(1) != 1) {
    return at::mm(x, weight.t());
  }
  at::Tensor out = at::empty({M, N}, x.options());
  const int device = x.get_device();
  if (!cuda::linear_small_supported(x.const_data_ptr(), x.stride(0), weight.const_data_ptr(), weight.stride(0),
                                    out.const_data_ptr(), M, N, K, 1,
                                    device_attribute<cudaDevAttrComputeCapabilityMajor>(device))) {
    return at::mm(x, weight.t());
  }
  const bool staged = kind == Gemm::kStaged;
  const int splits = gemm_splits(
      cuda::linear_small_splits(M, N, K, device_attribute<cudaDevAttrMultiProcessorCount>(device), staged));
  dispatch_cuda_type(x.scalar_type(), "linear", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    check_launch(cuda::linear_small<T>(ptr<T>(x), x.stride(0), ptr<T>(weight), weight.stride(0), ptr<T>(out), N, M,
                                       N, K, splits, staged, c10::cuda::getCurrentCUDAStream()),
                 "linear (weight streaming)");
  });
  return out;
}

at::Tensor add_rms_norm_cuda(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, double eps) {
  check_add_rms_norm(x, delta, weight);
  const c10::cuda::CUDAGuard guard(x.device());
  at::Tensor out = at::empty({x.size(0), x.size(1)}, x.options());
  dispatch_cuda_type(x.scalar_type(), "add_rms_norm_", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    check_launch(cuda::add_rms_norm<T>(ptr<T>(x), ptr<T>(delta), ptr<T>(weight), ptr<T>(out), x.size(0), x.size(1),
                                       static_cast<float>(eps), c10::cuda::getCurrentCUDAStream()),
                 "add_rms_norm_");
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> confidence_cuda(const at::Tensor& logits, int64_t exclude) {
  TORCH_CHECK(logits.dim() == 2 && logits.size(1) > 0 && logits.is_contiguous(),
              "logits must be a contiguous [rows, vocab] tensor, got shape ", logits.sizes());
  const c10::cuda::CUDAGuard guard(logits.device());
  at::Tensor argmax = at::empty({logits.size(0)}, logits.options().dtype(at::kLong));
  at::Tensor conf = at::empty({logits.size(0)}, logits.options().dtype(at::kDouble));
  dispatch_cuda_type(logits.scalar_type(), "confidence", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    check_launch(cuda::confidence<T>(ptr<T>(logits), logits.size(0), logits.size(1), exclude, argmax.data_ptr<int64_t>(),
                                     conf.data_ptr<double>(), c10::cuda::getCurrentCUDAStream()),
                 "confidence");
  });
  return {argmax, conf};
}

std::tuple<at::Tensor, at::Tensor> sparse_probs_cuda(const at::Tensor& logits, double floor, int64_t max_k) {
  check_logits(logits);
  check_sparse_probs(logits, floor, max_k);
  const c10::cuda::CUDAGuard guard(logits.device());
  at::Tensor ids = at::empty({logits.size(0), max_k}, logits.options().dtype(at::kLong));
  at::Tensor probs = at::empty({logits.size(0), max_k}, logits.options().dtype(at::kDouble));
  dispatch_cuda_type(logits.scalar_type(), "sparse_probs", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    check_launch(cuda::sparse_probs<T>(ptr<T>(logits), logits.size(0), logits.size(1), floor, max_k,
                                       ids.data_ptr<int64_t>(), probs.data_ptr<double>(),
                                       c10::cuda::getCurrentCUDAStream()),
                 "sparse_probs");
  });
  return {ids, probs};
}

}  // namespace

at::Tensor commit_cuda(const at::Tensor& canvas, const at::Tensor& window, const at::Tensor& token,
                       const at::Tensor& conf, const at::Tensor& k, int64_t mask_id, int64_t eos_id,
                       const std::string& rule, double threshold, double factor) {
  check_commit(canvas, window, token, conf, k, rule);  // window values: the kernel skips those outside the canvas
  const c10::cuda::CUDAGuard guard(canvas.device());
  at::Tensor counts = at::empty({3}, canvas.options());
  const CommitRule r = parse_commit_rule(rule);
  const int code = r == CommitRule::kThreshold ? 0 : r == CommitRule::kFixed ? 1 : 2;
  check_launch(cuda::commit(canvas.data_ptr<int64_t>(), canvas.size(0), window.const_data_ptr<int64_t>(), token.const_data_ptr<int64_t>(),
                            conf.const_data_ptr<double>(), k.const_data_ptr<int64_t>(), window.size(0), mask_id, eos_id,
                            code, threshold, factor, counts.data_ptr<int64_t>(), c10::cuda::getCurrentCUDAStream()),
               "commit_");
  return counts;
}

// Values (span rows, windows, sync sources) live on the device: checking them here would cost a
// host sync per step, so the kernels check them (branches.h span_ok / state_ok, kv_copy_rows'
// source row) and skip what is out of bounds. Host scalars (eos_id) are checked here.
void bb_absorb_cuda(const at::Tensor& canvas, const at::Tensor& state, const at::Tensor& eos_prob,
                    const at::Tensor& map_ids, const at::Tensor& map_probs, const at::Tensor& spans,
                    const at::Tensor& token, const at::Tensor& conf, const at::Tensor& ids, const at::Tensor& probs,
                    const at::Tensor& logits, int64_t prompt_len, int64_t mask_id, int64_t eos_id, double threshold,
                    bool stop_on_eos) {
  const BranchTensors d = check_branches(canvas, state, eos_prob, map_ids, map_probs, prompt_len);
  check_absorb(d, canvas, spans, token, conf, ids, probs, logits);
  if (stop_on_eos) check_eos_id(eos_id, logits.size(1));
  const c10::cuda::CUDAGuard guard(canvas.device());
  const branches::View v = branch_view(canvas, state, eos_prob, map_ids, map_probs, prompt_len, mask_id, eos_id);
  dispatch_cuda_type(logits.scalar_type(), "bb_absorb_", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    check_launch(cuda::bb_absorb<T>(v, spans.const_data_ptr<int64_t>(), spans.size(0), token.const_data_ptr<int64_t>(),
                                    conf.const_data_ptr<double>(), ids.const_data_ptr<int64_t>(),
                                    probs.const_data_ptr<double>(), ptr<T>(logits), logits.size(1),
                                    branches::AbsorbParams{threshold, stop_on_eos, logits.size(0)},
                                    c10::cuda::getCurrentCUDAStream()),
                 "bb_absorb_");
  });
}

void bb_coordinate_cuda(const at::Tensor& canvas, const at::Tensor& state, const at::Tensor& eos_prob,
                        const at::Tensor& flags, const at::Tensor& sync_src, const at::Tensor& map_ids,
                        const at::Tensor& map_probs, int64_t prompt_len, int64_t mask_id, double merge_gate,
                        bool merge, bool sync, int64_t sync_gap, int64_t refresh_tokens, bool periodic_refresh) {
  const BranchTensors d = check_branches(canvas, state, eos_prob, map_ids, map_probs, prompt_len);
  check_coordinate(d, canvas, flags, sync_src);
  const c10::cuda::CUDAGuard guard(canvas.device());
  check_launch(cuda::bb_coordinate(branch_view(canvas, state, eos_prob, map_ids, map_probs, prompt_len, mask_id, -1),
                                   flags.data_ptr<int64_t>(), sync_src.data_ptr<int64_t>(),
                                   branches::CoordinateParams{merge_gate, merge, sync, sync_gap, refresh_tokens,
                                                              periodic_refresh},
                                   c10::cuda::getCurrentCUDAStream()),
               "bb_coordinate_");
}

void kv_copy_rows_cuda(const at::Tensor& kv, const at::Tensor& src) {
  check_kv_copy_rows(kv, src);
  const c10::cuda::CUDAGuard guard(kv.device());
  const int64_t rows = kv.size(0), row_bytes = rows ? kv.numel() / rows * kv.element_size() : 0;
  check_launch(cuda::kv_copy_rows(kv.data_ptr(), src.const_data_ptr<int64_t>(), rows, row_bytes,
                                  c10::cuda::getCurrentCUDAStream()),
               "kv_copy_rows_");
}

TORCH_LIBRARY_IMPL(blockbatch, CUDA, m) {
  m.impl("bb_absorb_", &bb_absorb_cuda);
  m.impl("bb_coordinate_", &bb_coordinate_cuda);
  m.impl("kv_copy_rows_", &kv_copy_rows_cuda);
  m.impl("commit_", &commit_cuda);
  m.impl("rms_norm", &rms_norm_cuda);
  m.impl("add_rms_norm_", &add_rms_norm_cuda);
  m.impl("silu_mul", &silu_mul_cuda);
  m.impl("linear", &linear_cuda);
  m.impl("rope_", &rope_cuda);
  m.impl("rope_kv_write_", &rope_kv_write_cuda);
  m.impl("kv_write_", &kv_write_cuda);
  m.impl("packed_attention", &packed_attention_cuda);
  m.impl("confidence", &confidence_cuda);
  m.impl("sparse_probs", &sparse_probs_cuda);
}

}  // namespace blockbatch
