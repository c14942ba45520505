// blockbatch::commit_: one commit-rule step over a block window of a canvas that lives on the
// model's device (ALGORITHMS.md 2), so a decode step needs no host round trip to commit.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <limits>

#include "decode/commit.h"
#include "decode/options.h"
#include "torch/ops.h"

namespace blockbatch {

void check_commit(const at::Tensor& canvas, const at::Tensor& window, const at::Tensor& token, const at::Tensor& conf,
                  const at::Tensor& k, const std::string& rule) {
  auto vec = [](const at::Tensor& t, const char* name, c10::ScalarType type) {
    TORCH_CHECK_TYPE(t.scalar_type() == type, name, " must be ", type, ", got ", t.scalar_type());
    TORCH_CHECK_VALUE(t.dim() == 1 && t.is_contiguous(), name, " must be a contiguous 1-D tensor, got shape ",
                      t.sizes());
    return t.size(0);
  };
  vec(canvas, "canvas", at::kLong);
  const int64_t n = vec(window, "window", at::kLong);
  TORCH_CHECK_VALUE(vec(token, "token", at::kLong) == n && vec(conf, "conf", at::kDouble) == n,
                    "window, token and conf must have one entry per window position (", n, "), got ",
                    token.size(0), " and ", conf.size(0));
  TORCH_CHECK_VALUE(vec(k, "k", at::kLong) == 1, "k must hold one count, got ", k.size(0));
  TORCH_CHECK_VALUE(n <= kMaxCommitWindow, "commit_: windows of at most ", kMaxCommitWindow, " positions, got ", n);
  for (const at::Tensor* t : {&window, &token, &conf, &k}) {
    TORCH_CHECK_VALUE(t->device() == canvas.device(), "commit_: every tensor must be on the canvas' device ",
                      canvas.device(), ", got ", t->device());
  }
  TORCH_CHECK_VALUE(rule == "threshold" || rule == "fixed" || rule == "factor",
                    "rule must be one of 'threshold', 'fixed', 'factor', got '", rule, "'");
}

namespace {

at::Tensor commit_cpu(const at::Tensor& canvas, const at::Tensor& window, const at::Tensor& token,
                      const at::Tensor& conf, const at::Tensor& k, int64_t mask_id, int64_t eos_id,
                      const std::string& rule, double threshold, double factor) {
  check_commit(canvas, window, token, conf, k, rule);
  const int64_t n = window.size(0), L = canvas.size(0);
  int64_t* x = canvas.data_ptr<int64_t>();
  const int64_t* w = window.const_data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    TORCH_CHECK_VALUE(w[i] >= 0 && w[i] < L, "window[", i, "] = ", w[i], " is outside the canvas [0, ", L, ")");
  }
  std::vector<double> c(n);
  int64_t candidates = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool cand = x[w[i]] == mask_id;
    c[i] = cand ? conf.const_data_ptr<double>()[i] : -std::numeric_limits<double>::infinity();
    candidates += cand;
  }
  std::vector<char> chosen;
  switch (parse_commit_rule(rule)) {
    case CommitRule::kThreshold: chosen = select_threshold(c.data(), n, threshold); break;
    case CommitRule::kFactor: chosen = select_factor(c.data(), n, factor); break;
    case CommitRule::kFixed: chosen = select_fixed(c.data(), n, k.const_data_ptr<int64_t>()[0]); break;
  }
  int64_t committed = 0, eos = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (chosen[i]) {
      x[w[i]] = token.const_data_ptr<int64_t>()[i];
      ++committed;
    }
    eos |= x[w[i]] == eos_id;
  }
  at::Tensor counts = at::empty({3}, canvas.options());
  counts.data_ptr<int64_t>()[0] = committed;
  counts.data_ptr<int64_t>()[1] = candidates - committed;
  counts.data_ptr<int64_t>()[2] = eos;
  return counts;
}

at::Tensor commit_meta(const at::Tensor& canvas, const at::Tensor& window, const at::Tensor& token,
                       const at::Tensor& conf, const at::Tensor& k, int64_t, int64_t, const std::string& rule, double,
                       double) {
  check_commit(canvas, window, token, conf, k, rule);
  return at::empty({3}, canvas.options());
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(blockbatch, m) {
  // One commit-rule step (ALGORITHMS.md 2) over the canvas positions `window`: candidates are the
  // positions still holding mask_id; rule threshold | fixed (k[0] tokens) | factor picks among
  // them by conf; chosen positions get their proposal `token`. Returns int64 [3]: tokens
  // committed, masks left in the window, and 1 if eos_id is in the window afterwards.
  m.def("commit_(Tensor(a!) canvas, Tensor window, Tensor token, Tensor conf, Tensor k, int mask_id, int eos_id, "
        "str rule, float threshold, float factor) -> Tensor");
}

TORCH_LIBRARY_IMPL(blockbatch, CPU, m) { m.impl("commit_", &commit_cpu); }
TORCH_LIBRARY_IMPL(blockbatch, Meta, m) { m.impl("commit_", &commit_meta); }

}  // namespace blockbatch
