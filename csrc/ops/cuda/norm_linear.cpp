// CUDA implementations of the dense ops of a layer: rms_norm, add_rms_norm_, silu_mul and linear
// (ATen's GEMM, cuBLAS).
#include <ATen/ops/empty.h>
#include <ATen/ops/mm.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <type_traits>

#include "kernels/cuda/kernels.cuh"
#include "ops/checks.h"
#include "ops/cuda/common.h"
#include "ops/cuda/settings.h"
#include "ops/impl.h"

namespace blockbatch {

using namespace cuda_ops;

namespace {

// x @ weight.T on x padded with zero rows to a multiple of `multiple` rows.
at::Tensor padded_mm(const at::Tensor& x, const at::Tensor& weight, int64_t multiple) {
  const int64_t M = x.size(0), padded = (M + multiple - 1) / multiple * multiple;
  at::Tensor xp = at::empty({padded, x.size(1)}, x.options());
  xp.narrow(0, 0, M).copy_(x);
  xp.narrow(0, M, padded - M).zero_();
  return at::mm(xp, weight.t()).narrow(0, 0, M);  // a row prefix of a contiguous matrix: contiguous
}

// BLOCKBATCH_BATCH_INVARIANT=1: x @ weight.T as GEMMs of exactly kInvariantRows rows (the last
// padded with zero rows), so cuBLAS picks one algorithm whatever M is and a row's result does not
// depend on how many rows share the product or where it sits among them (a GEMM computes each
// output element by the same k-order whatever its row). Every chunk is copied into a fresh buffer,
// so the operands' alignment is the same too. Costs: padding up to kInvariantRows - 1 rows, a copy
// of x, and one weight read per chunk.
constexpr int64_t kInvariantRows = 256;
at::Tensor invariant_mm(const at::Tensor& x, const at::Tensor& weight) {
  const int64_t M = x.size(0);
  if (M <= kInvariantRows) return padded_mm(x, weight, kInvariantRows);
  at::Tensor out = at::empty({M, weight.size(0)}, x.options());
  for (int64_t first = 0; first < M; first += kInvariantRows) {
    const int64_t rows = std::min(kInvariantRows, M - first);
    out.narrow(0, first, rows).copy_(padded_mm(x.narrow(0, first, rows), weight, kInvariantRows));
  }
  return out;
}

}  // namespace

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

at::Tensor silu_mul_cuda(const at::Tensor& gate_up) {
  check_silu_mul(gate_up);
  const c10::cuda::CUDAGuard guard(gate_up.device());
  const int64_t m = gate_up.size(1) / 2;
  at::Tensor out = at::empty({gate_up.size(0), m}, gate_up.options());
  dispatch_cuda_type(gate_up.scalar_type(), "silu_mul", [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    check_launch(cuda::silu_mul<T>(ptr<T>(gate_up), ptr<T>(out), gate_up.size(0), m, c10::cuda::getCurrentCUDAStream()),
                 "silu_mul");
  });
  return out;
}

at::Tensor linear_cuda(const at::Tensor& x, const at::Tensor& weight) {
  check_linear(x, weight);
  const c10::cuda::CUDAGuard guard(x.device());
  if (batch_invariant()) return invariant_mm(x, weight);
  return at::mm(x, weight.t());
}

}  // namespace blockbatch
