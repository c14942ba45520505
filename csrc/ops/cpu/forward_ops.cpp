// CPU implementations of the forward's kernel ops: validate, then call csrc/kernels/cpu.
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/mm.h>
#include <c10/util/Exception.h>

#include "kernels/cpu/kernels.h"
#include "ops/checks.h"
#include "ops/impl.h"

namespace blockbatch {

namespace {
// Row boundaries must start at 0, never decrease and end at `total`.
void check_cu_seqlens_values(const at::Tensor& cu, int64_t total) {
  const int64_t* p = cu.data_ptr<int64_t>();
  TORCH_CHECK(p[0] == 0, "cu_seqlens[0] must be 0, got ", p[0]);
  for (int64_t i = 1; i < cu.size(0); ++i) {
    TORCH_CHECK(p[i] >= p[i - 1], "cu_seqlens must be non-decreasing: cu_seqlens[", i, "] = ", p[i], " < ", p[i - 1]);
  }
  TORCH_CHECK(p[cu.size(0) - 1] == total, "cu_seqlens[-1] = ", p[cu.size(0) - 1], " must equal the token count ",
              total);
}
void check_range(const at::Tensor& t, const char* name, int64_t lo, int64_t hi) {
  const int64_t* p = t.data_ptr<int64_t>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    TORCH_CHECK(p[i] >= lo && p[i] < hi, name, "[", i, "] = ", p[i], " is outside [", lo, ", ", hi, ")");
  }
}
}  // namespace

at::Tensor rms_norm_cpu(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rms_norm(x, weight);
  at::Tensor out = at::empty({x.size(0), x.size(1)}, x.options());
  BLOCKBATCH_DISPATCH_FLOATING(x.scalar_type(), "rms_norm", [&] {
    cpu::rms_norm<scalar_t>(x.const_data_ptr<scalar_t>(), x.stride(0), weight.const_data_ptr<scalar_t>(),
                            out.data_ptr<scalar_t>(), x.size(0), x.size(1), static_cast<float>(eps));
  });
  return out;
}

at::Tensor add_rms_norm_cpu(const at::Tensor& x, const at::Tensor& delta, const at::Tensor& weight, double eps) {
  check_add_rms_norm(x, delta, weight);
  const_cast<at::Tensor&>(x).add_(delta);  // x is the op's mutable argument (Tensor(a!))
  return rms_norm_cpu(x, weight, eps);
}

at::Tensor silu_mul_cpu(const at::Tensor& gate_up) {
  check_silu_mul(gate_up);
  const int64_t m = gate_up.size(1) / 2;
  at::Tensor out = at::empty({gate_up.size(0), m}, gate_up.options());
  BLOCKBATCH_DISPATCH_FLOATING(gate_up.scalar_type(), "silu_mul", [&] {
    cpu::silu_mul<scalar_t>(gate_up.const_data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), gate_up.size(0), m);
  });
  return out;
}

// Batch invariance: a row's result must not depend on the rows it is packed with (a request's
// logits are the same alone or batched with others). MKL / oneDNN sgemm computes each row of a
// product with 16 or more rows the same way whatever the row count and the row's place in it,
// but products of fewer rows take other kernels (other summation orders); so fewer rows are
// padded to 16 with zeros (tests/ops/test_batch_invariance.py checks the property).
constexpr int64_t kInvariantRows = 16;

at::Tensor linear_cpu(const at::Tensor& x, const at::Tensor& weight) {
  check_linear(x, weight);
  const int64_t m = x.size(0);
  if (m == 0 || m >= kInvariantRows) return at::mm(x, weight.t());
  at::Tensor padded = at::zeros({kInvariantRows, x.size(1)}, x.options());
  padded.narrow(0, 0, m).copy_(x);
  return at::mm(padded, weight.t()).narrow(0, 0, m).contiguous();
}

void rope_cpu(const at::Tensor& x, const at::Tensor& positions, const at::Tensor& cos_sin) {
  check_rope(x, positions, cos_sin);
  check_range(positions, "positions", 0, cos_sin.size(0));
  BLOCKBATCH_DISPATCH_FLOATING(x.scalar_type(), "rope_", [&] {
    cpu::rope_inplace<scalar_t>(x.data_ptr<scalar_t>(), x.size(0), x.stride(0), x.size(1), x.size(2),
                                positions.const_data_ptr<int64_t>(), cos_sin.const_data_ptr<float>());
  });
}

void rope_kv_write_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                       const at::Tensor& cos_sin, const at::Tensor& kv, const at::Tensor& cu_seqlens,
                       const at::Tensor& kv_rows, int64_t layer, const std::optional<at::Tensor>& kv_pages) {
  check_rope_kv_write(q, k, v, positions, cos_sin, kv, cu_seqlens, kv_rows, layer, kv_pages);
  rope_cpu(q, positions, cos_sin);
  rope_cpu(k, positions, cos_sin);
  kv_write_cpu(kv, k, v, positions, cu_seqlens, kv_rows, layer, kv_pages);
}

void kv_write_cpu(const at::Tensor& kv, const at::Tensor& k, const at::Tensor& v, const at::Tensor& positions,
                  const at::Tensor& cu_seqlens, const at::Tensor& kv_rows, int64_t layer,
                  const std::optional<at::Tensor>& kv_pages) {
  check_kv_write(kv, k, v, positions, cu_seqlens, kv_rows, layer, kv_pages);
  check_cu_seqlens_values(cu_seqlens, k.size(0));
  const cpu::KvGeometry g = kv_geometry(kv, kv_pages);
  check_range(positions, "positions", 0, g.length);
  check_range(kv_rows, "kv_rows", 0, g.rows);
  check_kv_pages_values(g);  // a write to no page (-1) is dropped
  BLOCKBATCH_DISPATCH_FLOATING(kv.scalar_type(), "kv_write_", [&] {
    cpu::kv_write<scalar_t>(kv.data_ptr<scalar_t>(), g, layer, k.const_data_ptr<scalar_t>(),
                            v.const_data_ptr<scalar_t>(), k.stride(0), positions.const_data_ptr<int64_t>(),
                            cu_seqlens.const_data_ptr<int64_t>(), kv_rows.const_data_ptr<int64_t>(),
                            cu_seqlens.size(0) - 1);
  });
}

at::Tensor packed_attention_cpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& cu_seqlens, const std::optional<at::Tensor>& kv,
                                const std::optional<at::Tensor>& kv_rows, const std::optional<at::Tensor>& cache_lens,
                                int64_t layer, bool attend_fresh, const std::optional<at::Tensor>& kv_pages,
                                const std::optional<at::Tensor>& key_index,
                                const std::optional<at::Tensor>& key_offsets) {
  check_packed_attention(q, k, v, cu_seqlens, kv, kv_rows, cache_lens, layer, kv_pages, key_index, key_offsets);
  check_cu_seqlens_values(cu_seqlens, q.size(0));
  const int64_t rows = cu_seqlens.size(0) - 1;
  at::Tensor out = at::empty({q.size(0), q.size(1) * q.size(2)}, q.options());
  const cpu::AttentionArgs a = attention_args(q, k, v, cu_seqlens, kv, kv_rows, cache_lens, layer, attend_fresh, out,
                                              kv_pages, key_index, key_offsets);
  if (kv.has_value()) {
    check_range(*kv_rows, "kv_rows", 0, a.geometry.rows);
    check_range(*cache_lens, "cache_lens", 0, a.geometry.length + 1);
    check_kv_pages_values(a.geometry);
    if (key_index.has_value()) {
      check_key_lists_values(a, key_index->size(0));  // a list reads only its own positions
    } else {
      check_kv_pages_cover(a.geometry, a.kv_rows, a.cache_lens, rows);
    }
  }
  const int64_t* cu = a.cu_seqlens;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t keys = (kv.has_value() ? a.row_cache_len(r) : 0) + (attend_fresh ? cu[r + 1] - cu[r] : 0);
    TORCH_CHECK(keys > 0 || cu[r + 1] == cu[r], "row ", r, " has queries but no keys to attend to");
  }
  BLOCKBATCH_DISPATCH_FLOATING(q.scalar_type(), "packed_attention", [&] { cpu::packed_attention<scalar_t>(a); });
  return out;
}

std::tuple<at::Tensor, at::Tensor> confidence_cpu(const at::Tensor& logits, int64_t exclude) {
  check_logits(logits);
  TORCH_CHECK(logits.size(1) > 1 || exclude != 0, "logits must hold a proposable id besides exclude");
  at::Tensor argmax = at::empty({logits.size(0)}, logits.options().dtype(at::kLong));
  at::Tensor conf = at::empty({logits.size(0)}, logits.options().dtype(at::kDouble));
  BLOCKBATCH_DISPATCH_FLOATING(logits.scalar_type(), "confidence", [&] {
    cpu::confidence<scalar_t>(logits.const_data_ptr<scalar_t>(), logits.size(0), logits.size(1), exclude,
                              argmax.data_ptr<int64_t>(), conf.data_ptr<double>());
  });
  return {argmax, conf};
}

std::tuple<at::Tensor, at::Tensor> sparse_probs_cpu(const at::Tensor& logits, double floor, int64_t max_k) {
  check_logits(logits);
  check_sparse_probs(logits, floor, max_k);
  at::Tensor ids = at::empty({logits.size(0), max_k}, logits.options().dtype(at::kLong));
  at::Tensor probs = at::empty({logits.size(0), max_k}, logits.options().dtype(at::kDouble));
  BLOCKBATCH_DISPATCH_FLOATING(logits.scalar_type(), "sparse_probs", [&] {
    cpu::sparse_probs<scalar_t>(logits.const_data_ptr<scalar_t>(), logits.size(0), logits.size(1), floor, max_k,
                                ids.data_ptr<int64_t>(), probs.data_ptr<double>());
  });
  return {ids, probs};
}

}  // namespace blockbatch
