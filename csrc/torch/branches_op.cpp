// BlockBatch bookkeeping ops (csrc/kernels/branches.h) and the KV row copy used by leader sync:
// schemas, the checks every backend shares, and the CPU / Meta implementations.
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>

#include "kernels/branches.h"
#include "torch/ops.h"

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
  TORCH_CHECK_VALUE(B >= 1 && B <= br::kMaxBranches, "canvas must hold 1 to ", br::kMaxBranches,
                    " branch rows, got ", B);
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

void check_kv_copy_rows(const at::Tensor& kv, const at::Tensor& src) {
  TORCH_CHECK_VALUE(kv.dim() >= 1 && kv.is_contiguous(), "kv must be a contiguous tensor with a row dimension, got ",
                    kv.sizes());
  check_tensor(src, "src", at::kLong, {kv.size(0)}, kv);
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
  TORCH_CHECK_VALUE(br::counts_ok(v, b), "state[", b, "]: the counts (decoded, since_refresh, committed, merged, "
                    "copied) must be in [0, ", br::kMaxCount, "], got ", st[br::kDecoded], ", ", st[br::kSinceRefresh],
                    ", ", st[br::kCommitted], ", ", st[br::kMerged], ", ", st[br::kCopied]);
  TORCH_CHECK_VALUE(br::window_ok(v, b), "state[", b, "]: window [", st[br::kStart], ", ", st[br::kEnd],
                    ") must lie inside the generation [prompt_len = ", v.lp, ", ", v.L, ") with start <= end");
}

branches::View branch_view(const at::Tensor& canvas, const at::Tensor& state, const at::Tensor& eos_prob,
                           const at::Tensor& map_ids, const at::Tensor& map_probs, int64_t prompt_len,
                           int64_t mask_id, int64_t eos_id) {
  return {canvas.data_ptr<int64_t>(), state.data_ptr<int64_t>(), eos_prob.data_ptr<double>(),
          map_ids.data_ptr<int64_t>(), map_probs.data_ptr<double>(),
          canvas.size(0), canvas.size(1), prompt_len, map_ids.size(2), mask_id, eos_id};
}

namespace {

void absorb_cpu(const at::Tensor& canvas, const at::Tensor& state, const at::Tensor& eos_prob,
                const at::Tensor& map_ids, const at::Tensor& map_probs, const at::Tensor& spans,
                const at::Tensor& token, const at::Tensor& conf, const at::Tensor& ids, const at::Tensor& probs,
                const at::Tensor& logits, int64_t prompt_len, int64_t mask_id, int64_t eos_id, double threshold,
                bool stop_on_eos) {
  const BranchTensors d = check_branches(canvas, state, eos_prob, map_ids, map_probs, prompt_len);
  check_absorb(d, canvas, spans, token, conf, ids, probs, logits);
  const br::View v = branch_view(canvas, state, eos_prob, map_ids, map_probs, prompt_len, mask_id, eos_id);
  if (stop_on_eos) check_eos_id(eos_id, logits.size(1));
  const int64_t* sp = spans.const_data_ptr<int64_t>();
  const int64_t rows = logits.size(0);
  for (int64_t i = 0; i < spans.size(0); ++i) {  // what the GPU kernel checks and skips (br::span_ok)
    const int64_t* s = sp + i * br::kSpanFields;
    const int64_t b = s[br::kSpanRow];
    TORCH_CHECK_VALUE(b >= 0 && b < d.B, "spans[", i, "]: branch ", b, " is not in [0, ", d.B, ")");
    check_window(v, b);
    const int64_t* st = v.st(b);
    TORCH_CHECK_VALUE(!st[br::kDone], "spans[", i, "]: branch ", b, " is done (state[", b, ", done] = 1)");
    TORCH_CHECK_VALUE(br::span_ok(v, s, rows), "spans[", i, "] = (row ", b, ", logits row ", s[br::kSpanLogitRow],
                      ", position ", s[br::kSpanFirstPos], ", rows ", s[br::kSpanRows], ") does not cover branch ", b,
                      "'s window [", st[br::kStart], ", ", st[br::kEnd], ") inside the canvas [", prompt_len, ", ",
                      d.L, ") and the ", rows, " logits rows");
  }
  const br::AbsorbParams p{threshold, stop_on_eos, logits.size(0)};
  BLOCKBATCH_DISPATCH_FLOATING(logits.scalar_type(), "bb_absorb_", [&] {
    const scalar_t* l = logits.const_data_ptr<scalar_t>();
    const int64_t vocab = logits.size(1);
    auto logit = [&](int64_t row, int64_t j) { return static_cast<double>(static_cast<float>(l[row * vocab + j])); };
    for (int64_t i = 0; i < spans.size(0); ++i) {
      br::absorb_span(br::SerialExec{}, v, sp + i * br::kSpanFields, token.const_data_ptr<int64_t>(),
                      conf.const_data_ptr<double>(), ids.const_data_ptr<int64_t>(), probs.const_data_ptr<double>(),
                      logit, vocab, p);
    }
  });
}

void coordinate_cpu(const at::Tensor& canvas, const at::Tensor& state, const at::Tensor& eos_prob,
                    const at::Tensor& flags, const at::Tensor& sync_src, const at::Tensor& map_ids,
                    const at::Tensor& map_probs, int64_t prompt_len, int64_t mask_id, double merge_gate, bool merge,
                    bool sync, int64_t sync_gap, int64_t refresh_tokens, bool periodic_refresh) {
  const BranchTensors d = check_branches(canvas, state, eos_prob, map_ids, map_probs, prompt_len);
  check_coordinate(d, canvas, flags, sync_src);
  const br::View v = branch_view(canvas, state, eos_prob, map_ids, map_probs, prompt_len, mask_id, -1);
  for (int64_t b = 0; b < d.B; ++b) check_window(v, b);  // what the GPU kernel checks (br::state_ok)
  br::coordinate(br::SerialExec{}, v, flags.data_ptr<int64_t>(), sync_src.data_ptr<int64_t>(),
                 br::CoordinateParams{merge_gate, merge, sync, sync_gap, refresh_tokens, periodic_refresh});
}

void kv_copy_rows_cpu(const at::Tensor& kv, const at::Tensor& src) {
  check_kv_copy_rows(kv, src);
  const int64_t rows = kv.size(0), bytes = kv.numel() / std::max<int64_t>(rows, 1) * kv.element_size();
  const int64_t* s = src.const_data_ptr<int64_t>();
  auto* base = static_cast<char*>(kv.data_ptr());
  for (int64_t r = 0; r < rows; ++r) {  // all before any copy: a bad table changes nothing
    TORCH_CHECK_VALUE(s[r] >= -1 && s[r] < rows, "src[", r, "] = ", s[r], " must be -1 (keep) or a row in [0, ",
                      rows, ")");
  }
  for (int64_t r = 0; r < rows; ++r) {
    if (s[r] >= 0 && s[r] != r) std::memcpy(base + r * bytes, base + s[r] * bytes, static_cast<size_t>(bytes));
  }
}

void absorb_meta(const at::Tensor& canvas, const at::Tensor& state, const at::Tensor& eos_prob,
                 const at::Tensor& map_ids, const at::Tensor& map_probs, const at::Tensor& spans,
                 const at::Tensor& token, const at::Tensor& conf, const at::Tensor& ids, const at::Tensor& probs,
                 const at::Tensor& logits, int64_t prompt_len, int64_t, int64_t, double, bool) {
  check_absorb(check_branches(canvas, state, eos_prob, map_ids, map_probs, prompt_len), canvas, spans, token, conf,
               ids, probs, logits);
}

void coordinate_meta(const at::Tensor& canvas, const at::Tensor& state, const at::Tensor& eos_prob,
                     const at::Tensor& flags, const at::Tensor& sync_src, const at::Tensor& map_ids,
                     const at::Tensor& map_probs, int64_t prompt_len, int64_t, double, bool, bool, int64_t, int64_t,
                     bool) {
  check_coordinate(check_branches(canvas, state, eos_prob, map_ids, map_probs, prompt_len), canvas, flags, sync_src);
}

void kv_copy_rows_meta(const at::Tensor& kv, const at::Tensor& src) { check_kv_copy_rows(kv, src); }

}  // namespace

TORCH_LIBRARY_FRAGMENT(blockbatch, m) {
  // BlockBatch bookkeeping on the canvas' device (ALGORITHMS.md 4; csrc/kernels/branches.h).
  // canvas int64 [B, L]; state int64 [B, 12] (block, start, end, decoded, done, since_refresh,
  // needs_refresh, eos_ready, masks, committed, merged, copied); eos_prob float64 [B];
  // map_ids int64 / map_probs float64 [B, L - prompt_len, K]: the sparse probability maps.
  // bb_absorb_: for each span (row, logits_row, first_pos, rows, full) of a forward, record the
  // rows' sparse probabilities (ids / probs [N, K]) into the branch's map, commit by threshold
  // inside its window from token / conf [N], count, and on a block step with stop_on_eos mark it
  // EOS-ready when its window is complete and holds EOS (float64 softmax of that logits row).
  m.def("bb_absorb_(Tensor(a!) canvas, Tensor(b!) state, Tensor(c!) eos_prob, Tensor(d!) map_ids, "
        "Tensor(e!) map_probs, Tensor spans, Tensor token, Tensor conf, Tensor ids, Tensor probs, Tensor logits, "
        "int prompt_len, int mask_id, int eos_id, float threshold, bool stop_on_eos) -> ()");
  // bb_coordinate_: advance, confidence-gated merge, leader sync (canvas rows; sync_src[b] = the
  // row whose KV row b must copy, -1 none) and the periodic refresh decision; flags int64 [2] =
  // (refresh wanted, early exit pending: nothing was changed).
  m.def("bb_coordinate_(Tensor(a!) canvas, Tensor(b!) state, Tensor eos_prob, Tensor(c!) flags, Tensor(d!) sync_src, "
        "Tensor map_ids, Tensor map_probs, int prompt_len, int mask_id, float merge_gate, bool merge, bool sync, "
        "int sync_gap, int refresh_tokens, bool periodic_refresh) -> ()");
  // kv_copy_rows_: kv[r] = kv[src[r]] for every r with src[r] >= 0 (src int64 [kv.size(0)]).
  m.def("kv_copy_rows_(Tensor(a!) kv, Tensor src) -> ()");
}

TORCH_LIBRARY_IMPL(blockbatch, CPU, m) {
  m.impl("bb_absorb_", &absorb_cpu);
  m.impl("bb_coordinate_", &coordinate_cpu);
  m.impl("kv_copy_rows_", &kv_copy_rows_cpu);
}
TORCH_LIBRARY_IMPL(blockbatch, Meta, m) {
  m.impl("bb_absorb_", &absorb_meta);
  m.impl("bb_coordinate_", &coordinate_meta);
  m.impl("kv_copy_rows_", &kv_copy_rows_meta);
}

}  // namespace blockbatch
