// Checks of the decode loop's bookkeeping ops, shared by every backend: commit_ (one commit-rule
// step), bb_absorb_ / bb_coordinate_ (BlockBatch's branches, csrc/kernels/branches.h) and
// kv_copy_rows_ (the KV row copy of leader sync).
#include <c10/util/Exception.h>

#include "kernels/branches.h"
#include "ops/checks.h"

namespace blockbatch {

namespace br = branches;

namespace {

int64_t check_tensor(const at::Tensor& t, const char* name, c10::ScalarType type, std::initializer_list<int64_t> shape,
                     const at::Tensor& like) {
  TORCH_CHECK_TYPE(t.scalar_type() == type, name, " must be ", type, ", got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK_VALUE(t.dim() == static_cast<int64_t>(shape.size()), name, " must have ", shape.size(),
                    " dimensions, got shape ", t.sizes());
  int64_t d = 0;
  for (int64_t s : shape) {
    TORCH_CHECK_VALUE(s < 0 || t.size(d) == s, name, " must have size ", s, " in dimension ", d, ", got shape ",
                      t.sizes());
    ++d;
  }
  TORCH_CHECK_VALUE(t.device() == like.device(), name, " must be on the canvas' device ", like.device(), ", got ",
                    t.device());
  return t.numel();
}

}  // namespace

BranchTensors check_branches(const at::Tensor& canvas, const at::Tensor& state, const at::Tensor& eos_prob,
                             const at::Tensor& map_ids, const at::Tensor& map_probs, int64_t prompt_len) {
  check_tensor(canvas, "canvas", at::kLong, {-1, -1}, canvas);
  const int64_t B = canvas.size(0), L = canvas.size(1);
  TORCH_CHECK_VALUE(B >= 1 && B <= br::kMaxBranches, "canvas must hold 1 to ", br::kMaxBranches, " branch rows, got ",
                    B);
  TORCH_CHECK_VALUE(prompt_len >= 0 && prompt_len < L, "prompt_len must be in [0, ", L, "), got ", prompt_len);
  check_tensor(state, "state", at::kLong, {B, br::kFields}, canvas);
  check_tensor(eos_prob, "eos_prob", at::kDouble, {B}, canvas);
  check_tensor(map_ids, "map_ids", at::kLong, {B, L - prompt_len, -1}, canvas);
  check_tensor(map_probs, "map_probs", at::kDouble, {B, L - prompt_len, map_ids.size(2)}, canvas);
  return {B, L, map_ids.size(2)};
}

void check_absorb(const BranchTensors& d, const at::Tensor& canvas, const at::Tensor& spans, const at::Tensor& token,
                  const at::Tensor& conf, const at::Tensor& ids, const at::Tensor& probs, const at::Tensor& logits) {
  check_tensor(spans, "spans", at::kLong, {-1, br::kSpanFields}, canvas);
  TORCH_CHECK_VALUE(spans.size(0) <= d.B, "spans: at most one per branch (", d.B, "), got ", spans.size(0));
  check_logits(logits);
  TORCH_CHECK_VALUE(logits.device() == canvas.device(), "logits must be on the canvas' device ", canvas.device(),
                    ", got ", logits.device());
  const int64_t n = logits.size(0);
  check_tensor(token, "token", at::kLong, {n}, canvas);
  check_tensor(conf, "conf", at::kDouble, {n}, canvas);
  check_tensor(ids, "ids", at::kLong, {n, d.K}, canvas);
  check_tensor(probs, "probs", at::kDouble, {n, d.K}, canvas);
}

void check_coordinate(const BranchTensors& d, const at::Tensor& canvas, const at::Tensor& flags,
                      const at::Tensor& sync_src) {
  check_tensor(flags, "flags", at::kLong, {br::kFlags}, canvas);
  check_tensor(sync_src, "sync_src", at::kLong, {d.B}, canvas);
}

void check_kv_copy_rows(const at::Tensor& kv, const at::Tensor& src, const std::optional<at::Tensor>& kv_pages) {
  TORCH_CHECK_VALUE(kv.dim() >= 1 && kv.is_contiguous(), "kv must be a contiguous tensor with a row dimension, got ",
                    kv.sizes());
  if (!kv_pages.has_value()) {
    check_tensor(src, "src", at::kLong, {kv.size(0)}, kv);
    return;
  }
  TORCH_CHECK_VALUE(kv_pages->scalar_type() == at::kLong && kv_pages->dim() == 2 && kv_pages->is_contiguous(),
                    "kv_pages must be a contiguous int64 [rows, pages per row] table, got ", kv_pages->scalar_type(),
                    " ", kv_pages->sizes());
  TORCH_CHECK_VALUE(kv_pages->device() == kv.device(), "kv_pages is on ", kv_pages->device(), " but kv is on ",
                    kv.device());
  check_tensor(src, "src", at::kLong, {kv_pages->size(0)}, kv);
}

cpu::KvPages kv_copy_pages(const at::Tensor& kv, const std::optional<at::Tensor>& kv_pages) {
  if (!kv_pages.has_value()) return {nullptr, 1, kv.size(0)};
  return {kv_pages->const_data_ptr<int64_t>(), kv_pages->size(1), kv.size(0)};
}

void check_eos_id(int64_t eos_id, int64_t vocab) {
  TORCH_CHECK_VALUE(eos_id >= 0 && eos_id < vocab, "eos_id = ", eos_id, " is outside the logits' vocabulary [0, ",
                    vocab, ")");
}

void check_window(const branches::View& v, int64_t b) {
  const int64_t* st = v.st(b);
  TORCH_CHECK_VALUE(st[br::kBlock] > 0 && (v.L - v.lp) % st[br::kBlock] == 0, "state[", b,
                    "]: block size must be > 0 and divide the generation length ", v.L - v.lp, ", got ",
                    st[br::kBlock]);
  TORCH_CHECK_VALUE(br::counts_ok(v, b), "state[", b,
                    "]: the counts (decoded, since_refresh, committed, merged, "
                    "copied) must be in [0, ",
                    br::kMaxCount, "], got ", st[br::kDecoded], ", ", st[br::kSinceRefresh], ", ", st[br::kCommitted],
                    ", ", st[br::kMerged], ", ", st[br::kCopied]);
  TORCH_CHECK_VALUE(br::window_ok(v, b), "state[", b, "]: window [", st[br::kStart], ", ", st[br::kEnd],
                    ") must lie inside the generation [prompt_len = ", v.lp, ", ", v.L, ") with start <= end");
}

branches::View branch_view(const at::Tensor& canvas, const at::Tensor& state, const at::Tensor& eos_prob,
                           const at::Tensor& map_ids, const at::Tensor& map_probs, int64_t prompt_len, int64_t mask_id,
                           int64_t eos_id) {
  return {canvas.data_ptr<int64_t>(),
          state.data_ptr<int64_t>(),
          eos_prob.data_ptr<double>(),
          map_ids.data_ptr<int64_t>(),
          map_probs.data_ptr<double>(),
          canvas.size(0),
          canvas.size(1),
          prompt_len,
          map_ids.size(2),
          mask_id,
          eos_id};
}

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
                    "window, token and conf must have one entry per window position (", n, "), got ", token.size(0),
                    " and ", conf.size(0));
  TORCH_CHECK_VALUE(vec(k, "k", at::kLong) == 1, "k must hold one count, got ", k.size(0));
  TORCH_CHECK_VALUE(n <= kMaxCommitWindow, "commit_: windows of at most ", kMaxCommitWindow, " positions, got ", n);
  for (const at::Tensor* t : {&window, &token, &conf, &k}) {
    TORCH_CHECK_VALUE(t->device() == canvas.device(), "commit_: every tensor must be on the canvas' device ",
                      canvas.device(), ", got ", t->device());
  }
  TORCH_CHECK_VALUE(rule == "threshold" || rule == "fixed" || rule == "factor",
                    "rule must be one of 'threshold', 'fixed', 'factor', got '", rule, "'");
}

}  // namespace blockbatch
