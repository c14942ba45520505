// The blockbatch op library: the TorchBind Model class and every op schema (vLLM style), each
// schema with its implementations beside it: CPU (csrc/ops/cpu/), Meta (csrc/ops/meta.cpp: shapes
// only, for FakeTensor / torch.compile) and, in a CUDA build, CUDA (csrc/ops/cuda/). The model and
// the decode loop call the ops through csrc/ops/ops.h (the dispatcher). The decode op's schema is
// in decode_op.cpp.
#include <ATen/ops/empty.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include "model/network.h"
#include "ops/impl.h"
#include "torch/model_handle.h"
#include "torch/options_handle.h"

// m.impl(name, CUDA, fn) in a CUDA build (BLOCKBATCH_WITH_CUDA); nothing otherwise.
#ifdef BLOCKBATCH_WITH_CUDA
#define BLOCKBATCH_IMPL_CUDA(m, name, fn) m.impl(name, c10::DispatchKey::CUDA, fn)
#else
#define BLOCKBATCH_IMPL_CUDA(m, name, fn)
#endif

namespace blockbatch {

namespace {
ForwardBatch make_batch(const at::Tensor& tokens, const at::Tensor& positions, const at::Tensor& cu_seqlens,
                        const std::optional<at::Tensor>& kv, const std::optional<at::Tensor>& kv_rows,
                        const std::optional<at::Tensor>& prefix_lens, const std::string& mode,
                        const std::optional<at::Tensor>& logit_index, const std::optional<at::Tensor>& kv_lens,
                        const std::optional<at::Tensor>& kv_pages, const std::optional<at::Tensor>& key_index,
                        const std::optional<at::Tensor>& key_offsets) {
  ForwardBatch b;
  b.tokens = tokens;
  b.positions = positions;
  b.cu_seqlens = cu_seqlens;
  b.kv = kv.value_or(at::Tensor());
  b.kv_rows = kv_rows.value_or(at::Tensor());
  b.prefix_lens = prefix_lens.value_or(at::Tensor());
  b.logit_index = logit_index.value_or(at::Tensor());
  b.kv_lens = kv_lens.value_or(at::Tensor());
  b.kv_pages = kv_pages.value_or(at::Tensor());
  b.key_index = key_index.value_or(at::Tensor());
  b.key_offsets = key_offsets.value_or(at::Tensor());
  b.mode = parse_kv_mode(mode);
  return b;
}

at::Tensor model_forward(const c10::intrusive_ptr<ModelHandle>& model, const at::Tensor& tokens,
                         const at::Tensor& positions, const at::Tensor& cu_seqlens, const std::optional<at::Tensor>& kv,
                         const std::optional<at::Tensor>& kv_rows, const std::optional<at::Tensor>& prefix_lens,
                         const std::string& mode, const std::optional<at::Tensor>& logit_index,
                         const std::optional<at::Tensor>& kv_lens, const std::optional<at::Tensor>& kv_pages,
                         const std::optional<at::Tensor>& key_index, const std::optional<at::Tensor>& key_offsets,
                         int64_t row_keep_layer, const std::optional<at::Tensor>& row_keep) {
  ForwardBatch b = make_batch(tokens, positions, cu_seqlens, kv, kv_rows, prefix_lens, mode, logit_index, kv_lens,
                              kv_pages, key_index, key_offsets);
  if (row_keep.has_value()) {  // a fixed pruning: these tokens go on after layer row_keep_layer
    const at::Tensor keep = *row_keep;
    b.row_keep_layer = row_keep_layer;
    b.row_keep = [keep](const at::Tensor&) { return keep; };
  }
  return model->network().forward(b);
}

// Shape-only forward for FakeTensor / torch.compile (the model object stays real).
at::Tensor model_forward_meta(const c10::intrusive_ptr<ModelHandle>& model, const at::Tensor& tokens,
                              const at::Tensor& positions, const at::Tensor& cu_seqlens,
                              const std::optional<at::Tensor>& kv, const std::optional<at::Tensor>& kv_rows,
                              const std::optional<at::Tensor>& prefix_lens, const std::string& mode,
                              const std::optional<at::Tensor>& logit_index, const std::optional<at::Tensor>& kv_lens,
                              const std::optional<at::Tensor>& kv_pages, const std::optional<at::Tensor>& key_index,
                              const std::optional<at::Tensor>& key_offsets, int64_t row_keep_layer,
                              const std::optional<at::Tensor>& row_keep) {
  (void)row_keep_layer;
  (void)row_keep;
  (void)kv_lens;
  (void)kv_pages;
  (void)key_index;
  (void)key_offsets;
  parse_kv_mode(mode);
  TORCH_CHECK(tokens.dim() == 1 && positions.sizes() == tokens.sizes(),
              "tokens and positions must be 1-D of equal length");
  const int64_t n = logit_index.has_value() ? logit_index->size(0) : tokens.size(0);
  return at::empty({n, model->network().config().vocab_size}, tokens.options().dtype(model->network().dtype()));
}

}  // namespace

TORCH_LIBRARY(blockbatch, m) {
  // torch.classes.blockbatch.Options (torch/options_handle.h): made by torch.ops.blockbatch.options.
  m.class_<OptionsHandle>("Options").def(
      "__len__", [](const OptionsPtr&) -> int64_t { TORCH_CHECK_TYPE(false, "object of type Options has no len()"); });
  // torch.classes.blockbatch.Model: a model built from its config and HF-named weights
  // (python/blockbatch/native.py), passed to forward and decode.
  using Handle = c10::intrusive_ptr<ModelHandle>;
  m.class_<ModelHandle>("Model")
      .def(torch::init<c10::Dict<std::string, int64_t>, c10::Dict<std::string, double>,
                       c10::Dict<std::string, at::Tensor>, std::string>())
      .def("vocab_size", [](const Handle& self) { return self->network().config().vocab_size; })
      .def("n_layers", [](const Handle& self) { return self->network().config().n_layers; })
      // len(model) raises TypeError as for any Python object without a length. torch's schema
      // checker (opcheck) probes len() on every argument and tolerates only TypeError, while a
      // TorchBind object without __len__ raises NotImplementedError.
      .def("__len__", [](const Handle&) -> int64_t { TORCH_CHECK_TYPE(false, "object of type Model has no len()"); })
      .def("n_kv_heads", [](const Handle& self) { return self->network().config().n_kv_heads; })
      .def("head_dim", [](const Handle& self) { return self->network().config().head_dim(); })
      .def("dtype", [](const Handle& self) { return std::string(c10::toString(self->network().dtype())); })
      .def("device", [](const Handle& self) { return self->network().device().str(); })
      .def("new_kv",
           [](const Handle& self, int64_t rows, int64_t length) { return self->network().new_kv(rows, length); })
      // Identity equality (torch.compile compares script-object arguments while tracing).
      .def("__eq__", [](const Handle& self, const Handle& other) { return self.get() == other.get(); })
      // Fake-tensor tracing keeps the real model object: the meta kernels only read its config.
      .def("tracing_mode", [](const Handle&) { return std::string("real"); });

  // Native LLaDA forward over packed variable-length query rows (cu_seqlens) with per-row KV
  // buffers; kv_mode full | dual | prefix (ALGORITHMS.md 3); kv_lens (dual): the keys each row
  // attends (default: the whole buffer; block-causal families give a row per block); kv_pages: kv is
  // a page store read through this [KV rows, L / page_len] table; key_index / key_offsets (dual,
  // prefix): gathered key sets, row r attending positions key_index[key_offsets[r] .. key_offsets[r+1])
  // of its KV row (model/attention.h); row_keep (int64 token indices, ascending): only those tokens run
  // the layers after row_keep_layer (ForwardBatch::row_keep; a dropped token's logits are zeros). Returns
  // logits [n, vocab].
  // (Not named `mode`: torch.compile's dispatch-mode redirection reserves that keyword.)
  m.def("forward(__torch__.torch.classes.blockbatch.Model model, Tensor tokens, Tensor positions, "
        "Tensor cu_seqlens, Tensor(a!)? kv=None, Tensor? kv_rows=None, Tensor? prefix_lens=None, "
        "str kv_mode=\"full\", Tensor? logit_index=None, Tensor? kv_lens=None, Tensor? kv_pages=None, "
        "Tensor? key_index=None, Tensor? key_offsets=None, int row_keep_layer=-1, Tensor? row_keep=None) -> Tensor");
  m.impl("forward", c10::DispatchKey::CPU, &model_forward);
  m.impl("forward", c10::DispatchKey::Meta, &model_forward_meta);
  BLOCKBATCH_IMPL_CUDA(m, "forward", &model_forward);  // device-agnostic: calls the CUDA kernel ops

  // RMSNorm in float32: x * rsqrt(mean(x^2) + eps), rounded to x's dtype, times weight.
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.impl("rms_norm", c10::DispatchKey::CPU, &rms_norm_cpu);
  m.impl("rms_norm", c10::DispatchKey::Meta, &rms_norm_meta);
  BLOCKBATCH_IMPL_CUDA(m, "rms_norm", &rms_norm_cuda);

  // The residual add and the next RMSNorm: x += delta in place (rounded to x's dtype), then
  // rms_norm(x, weight). One CUDA kernel (a layer's two adds stop being launches of their own);
  // on CPU add_ then rms_norm.
  m.def("add_rms_norm_(Tensor(a!) x, Tensor delta, Tensor weight, float eps) -> Tensor");
  m.impl("add_rms_norm_", c10::DispatchKey::CPU, &add_rms_norm_cpu);
  m.impl("add_rms_norm_", c10::DispatchKey::Meta, &add_rms_norm_meta);
  BLOCKBATCH_IMPL_CUDA(m, "add_rms_norm_", &add_rms_norm_cuda);

  // SwiGLU activation: silu(gate) * up over a fused [rows, 2m] gate|up GEMM output.
  m.def("silu_mul(Tensor gate_up) -> Tensor");
  m.impl("silu_mul", c10::DispatchKey::CPU, &silu_mul_cpu);
  m.impl("silu_mul", c10::DispatchKey::Meta, &silu_mul_meta);
  BLOCKBATCH_IMPL_CUDA(m, "silu_mul", &silu_mul_cuda);

  // x @ weight.T (x [rows, in], weight [out, in], one dtype): ATen's GEMM (on CUDA: cuBLAS).
  m.def("linear(Tensor x, Tensor weight) -> Tensor");
  m.impl("linear", c10::DispatchKey::CPU, &linear_cpu);
  m.impl("linear", c10::DispatchKey::Meta, &linear_meta);
  BLOCKBATCH_IMPL_CUDA(m, "linear", &linear_cuda);

  // The routed experts of a mixture-of-experts layer (LLaDA2): x [T, d], the router's choices
  // chosen [T, K] (int64 expert ids) with their weights [T, K] (float32), stacked SwiGLU experts
  // gate_up [E, 2m, d] (gate rows, then up) and down [E, d, m]. Returns [T, d]: per token the
  // weight-summed outputs of its K experts (float32 sum, rounded once). Grouped per expert (one GEMM
  // each, the choices read on the host); on CUDA with BLOCKBATCH_MOE_KERNEL=fused, kernels that keep
  // them on the device (a CUDA graph can record it).
  m.def("moe_experts(Tensor x, Tensor chosen, Tensor weights, Tensor gate_up, Tensor down) -> Tensor");
  m.impl("moe_experts", c10::DispatchKey::CPU, &moe_experts_cpu);
  m.impl("moe_experts", c10::DispatchKey::Meta, &moe_experts_meta);
  BLOCKBATCH_IMPL_CUDA(m, "moe_experts", &moe_experts_cuda);

  // In-place rotate-half RoPE of x [T, heads, head_dim] at absolute positions (float32 math).
  m.def("rope_(Tensor(a!) x, Tensor positions, Tensor cos_sin) -> ()");
  m.impl("rope_", c10::DispatchKey::CPU, &rope_cpu);
  m.impl("rope_", c10::DispatchKey::Meta, &rope_meta);
  BLOCKBATCH_IMPL_CUDA(m, "rope_", &rope_cuda);

  // Write fresh K/V [T, kv_heads, head_dim] into their position slots of per-row KV buffers.
  // kv_pages (here and below): kv is a page store [pages, layers, 2, kv_heads, page_len, head_dim]
  // and row r's position p is slot p % page_len of page kv_pages[r, p / page_len] (-1: none).
  m.def("kv_write_(Tensor(a!) kv, Tensor k, Tensor v, Tensor positions, Tensor cu_seqlens, Tensor kv_rows, "
        "int layer, Tensor? kv_pages=None) -> ()");
  m.impl("kv_write_", c10::DispatchKey::CPU, &kv_write_cpu);
  m.impl("kv_write_", c10::DispatchKey::Meta, &kv_write_meta);
  BLOCKBATCH_IMPL_CUDA(m, "kv_write_", &kv_write_cuda);

  // rope_ on q and k, then kv_write_ of the rotated k and v: one CUDA kernel (a layer's three
  // small launches and a second read of k become one pass); on CPU the two ops in sequence.
  m.def("rope_kv_write_(Tensor(a!) q, Tensor(b!) k, Tensor v, Tensor positions, Tensor cos_sin, Tensor(c!) kv, "
        "Tensor cu_seqlens, Tensor kv_rows, int layer, Tensor? kv_pages=None) -> ()");
  m.impl("rope_kv_write_", c10::DispatchKey::CPU, &rope_kv_write_cpu);
  m.impl("rope_kv_write_", c10::DispatchKey::Meta, &rope_kv_write_meta);
  BLOCKBATCH_IMPL_CUDA(m, "rope_kv_write_", &rope_kv_write_cuda);

  // Packed varlen bidirectional attention: each row's queries attend to the first cache_lens[r]
  // slots of its KV row (or, gathered key sets, to the ascending positions key_index[key_offsets[r]
  // .. key_offsets[r+1]) inside them), then (attend_fresh) to its own fresh K/V. GQA by head grouping.
  m.def("packed_attention(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens, Tensor? kv, Tensor? kv_rows, "
        "Tensor? cache_lens, int layer, bool attend_fresh, Tensor? kv_pages=None, Tensor? key_index=None, "
        "Tensor? key_offsets=None) -> Tensor");
  m.impl("packed_attention", c10::DispatchKey::CPU, &packed_attention_cpu);
  m.impl("packed_attention", c10::DispatchKey::Meta, &packed_attention_meta);
  BLOCKBATCH_IMPL_CUDA(m, "packed_attention", &packed_attention_cuda);

  // Proposal + confidence per row: argmax over ids != exclude (the mask id; lowest id on ties)
  // and its softmax probability (float64), without materialising probabilities (ALGORITHMS.md 1).
  m.def("confidence(Tensor logits, int exclude=-1) -> (Tensor argmax, Tensor conf)");
  m.impl("confidence", c10::DispatchKey::CPU, &confidence_cpu);
  m.impl("confidence", c10::DispatchKey::Meta, &confidence_meta);
  BLOCKBATCH_IMPL_CUDA(m, "confidence", &confidence_cuda);

  // BlockBatch's sparse probability map: per row, the (at most max_k) tokens whose softmax
  // probability exceeds floor (ALGORITHMS.md 4); ids padded with -1.
  m.def("sparse_probs(Tensor logits, float floor, int max_k) -> (Tensor ids, Tensor probs)");
  m.impl("sparse_probs", c10::DispatchKey::CPU, &sparse_probs_cpu);
  m.impl("sparse_probs", c10::DispatchKey::Meta, &sparse_probs_meta);
  BLOCKBATCH_IMPL_CUDA(m, "sparse_probs", &sparse_probs_cuda);

  // One commit-rule step (ALGORITHMS.md 2) over the canvas positions `window`: candidates are the
  // positions still holding mask_id; rule threshold | fixed (k[0] tokens) | factor picks among
  // them by conf; chosen positions get their proposal `token`. Returns int64 [3]: tokens
  // committed, masks left in the window, and 1 if eos_id is in the window afterwards.
  m.def("commit_(Tensor(a!) canvas, Tensor window, Tensor token, Tensor conf, Tensor k, int mask_id, int eos_id, "
        "str rule, float threshold, float factor) -> Tensor");
  m.impl("commit_", c10::DispatchKey::CPU, &commit_cpu);
  m.impl("commit_", c10::DispatchKey::Meta, &commit_meta);
  BLOCKBATCH_IMPL_CUDA(m, "commit_", &commit_cuda);

  // BlockBatch bookkeeping on the canvas' device (ALGORITHMS.md 4; csrc/kernels/branches.h).
  // canvas int64 [B, L]; state int64 [B, 13] (block, start, end, decoded, done, since_refresh,
  // needs_refresh, eos_ready, masks, committed, merged, copied, frontier); eos_prob float64 [B];
  // map_ids int64 / map_probs float64 [B, L - prompt_len, K]: the sparse probability maps.
  // bb_absorb_: for each span (row, logits_row, first_pos, rows, full) of a forward, record the
  // rows' sparse probabilities (ids / probs [N, K]) into the branch's map, commit by threshold
  // inside its window from token / conf [N], count, and on a block step with stop_on_eos mark it
  // EOS-ready when its window is complete and holds EOS (float64 softmax of that logits row).
  m.def("bb_absorb_(Tensor(a!) canvas, Tensor(b!) state, Tensor(c!) eos_prob, Tensor(d!) map_ids, "
        "Tensor(e!) map_probs, Tensor spans, Tensor token, Tensor conf, Tensor ids, Tensor probs, Tensor logits, "
        "int prompt_len, int mask_id, int eos_id, float threshold, bool stop_on_eos) -> ()");
  m.impl("bb_absorb_", c10::DispatchKey::CPU, &bb_absorb_cpu);
  m.impl("bb_absorb_", c10::DispatchKey::Meta, &bb_absorb_meta);
  BLOCKBATCH_IMPL_CUDA(m, "bb_absorb_", &bb_absorb_cuda);

  // bb_coordinate_: advance, confidence-gated merge, leader sync (canvas rows; sync_src[b] = the
  // row whose KV row b must copy, -1 none) and the periodic refresh decision; flags int64 [2] =
  // (refresh wanted, early exit pending: nothing was changed).
  m.def("bb_coordinate_(Tensor(a!) canvas, Tensor(b!) state, Tensor eos_prob, Tensor(c!) flags, Tensor(d!) sync_src, "
        "Tensor map_ids, Tensor map_probs, int prompt_len, int mask_id, float merge_gate, bool merge, bool sync, "
        "int sync_gap, int refresh_tokens, bool periodic_refresh) -> ()");
  m.impl("bb_coordinate_", c10::DispatchKey::CPU, &bb_coordinate_cpu);
  m.impl("bb_coordinate_", c10::DispatchKey::Meta, &bb_coordinate_meta);
  BLOCKBATCH_IMPL_CUDA(m, "bb_coordinate_", &bb_coordinate_cuda);

  // kv_copy_rows_: kv[r] = kv[src[r]] for every r with src[r] >= 0 (src int64 [KV rows]); paged,
  // the contents of row src[r]'s pages into row r's (a page both share is left as it is).
  m.def("kv_copy_rows_(Tensor(a!) kv, Tensor src, Tensor? kv_pages=None) -> ()");
  m.impl("kv_copy_rows_", c10::DispatchKey::CPU, &kv_copy_rows_cpu);
  m.impl("kv_copy_rows_", c10::DispatchKey::Meta, &kv_copy_rows_meta);
  BLOCKBATCH_IMPL_CUDA(m, "kv_copy_rows_", &kv_copy_rows_cuda);
}

}  // namespace blockbatch
