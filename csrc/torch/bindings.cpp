// The blockbatch op library: every schema in one place (vLLM style), the TorchBind Model
// class, and the model-level ops. Kernel implementations live in ops_cpu.cpp / ops_meta.cpp
// (and csrc/kernels/cuda when built with CUDA).
#include <ATen/ops/empty.h>
#include <torch/custom_class.h>
#include <torch/library.h>

#include "model/model.h"
#include "torch/ops.h"

namespace blockbatch {

namespace {
ForwardBatch make_batch(const at::Tensor& tokens, const at::Tensor& positions, const at::Tensor& cu_seqlens,
                        const std::optional<at::Tensor>& kv, const std::optional<at::Tensor>& kv_rows,
                        const std::optional<at::Tensor>& prefix_lens, const std::string& mode,
                        const std::optional<at::Tensor>& logit_index) {
  ForwardBatch b;
  b.tokens = tokens;
  b.positions = positions;
  b.cu_seqlens = cu_seqlens;
  b.kv = kv.value_or(at::Tensor());
  b.kv_rows = kv_rows.value_or(at::Tensor());
  b.prefix_lens = prefix_lens.value_or(at::Tensor());
  b.logit_index = logit_index.value_or(at::Tensor());
  b.mode = parse_kv_mode(mode);
  return b;
}

at::Tensor model_forward(const c10::intrusive_ptr<Model>& model, const at::Tensor& tokens,
                         const at::Tensor& positions, const at::Tensor& cu_seqlens,
                         const std::optional<at::Tensor>& kv, const std::optional<at::Tensor>& kv_rows,
                         const std::optional<at::Tensor>& prefix_lens, const std::string& mode,
                         const std::optional<at::Tensor>& logit_index) {
  return model->forward(make_batch(tokens, positions, cu_seqlens, kv, kv_rows, prefix_lens, mode, logit_index));
}
}  // namespace

// Shape-only forward for FakeTensor / torch.compile (the model object stays real).
at::Tensor model_forward_meta(const c10::intrusive_ptr<Model>& model, const at::Tensor& tokens,
                              const at::Tensor& positions, const at::Tensor& cu_seqlens,
                              const std::optional<at::Tensor>& kv, const std::optional<at::Tensor>& kv_rows,
                              const std::optional<at::Tensor>& prefix_lens, const std::string& mode,
                              const std::optional<at::Tensor>& logit_index) {
  parse_kv_mode(mode);
  TORCH_CHECK(tokens.dim() == 1 && positions.sizes() == tokens.sizes(),
              "tokens and positions must be 1-D of equal length");
  const int64_t n = logit_index.has_value() ? logit_index->size(0) : tokens.size(0);
  return at::empty({n, model->config().vocab_size}, tokens.options().dtype(model->dtype()));
}

TORCH_LIBRARY(blockbatch, m) {
  m.class_<Model>("Model")
      .def(torch::init<c10::Dict<std::string, int64_t>, c10::Dict<std::string, double>,
                       c10::Dict<std::string, at::Tensor>, std::string>())
      .def("vocab_size", [](const c10::intrusive_ptr<Model>& self) { return self->config().vocab_size; })
      .def("n_layers", [](const c10::intrusive_ptr<Model>& self) { return self->config().n_layers; })
      // len(model) raises TypeError as for any Python object without a length. torch's schema
      // checker (opcheck) probes len() on every argument and tolerates only TypeError, while a
      // TorchBind object without __len__ raises NotImplementedError.
      .def("__len__", [](const c10::intrusive_ptr<Model>&) -> int64_t {
        TORCH_CHECK_TYPE(false, "object of type Model has no len()");
      })
      .def("n_kv_heads", [](const c10::intrusive_ptr<Model>& self) { return self->config().n_kv_heads; })
      .def("head_dim", [](const c10::intrusive_ptr<Model>& self) { return self->config().head_dim(); })
      .def("dtype", [](const c10::intrusive_ptr<Model>& self) { return std::string(c10::toString(self->dtype())); })
      .def("device", [](const c10::intrusive_ptr<Model>& self) { return self->device().str(); })
      .def("new_kv", [](const c10::intrusive_ptr<Model>& self, int64_t rows,
                        int64_t length) { return self->new_kv(rows, length); })
      // Identity equality (torch.compile compares script-object arguments while tracing).
      .def("__eq__", [](const c10::intrusive_ptr<Model>& self,
                        const c10::intrusive_ptr<Model>& other) { return self.get() == other.get(); })
      // Fake-tensor tracing keeps the real model object: the meta kernels only read its config.
      .def("tracing_mode", [](const c10::intrusive_ptr<Model>&) { return std::string("real"); });

  // Native LLaDA forward over packed variable-length query rows (cu_seqlens) with per-row KV
  // buffers; kv_mode full | dual | prefix (ALGORITHMS.md 3). Returns logits [n, vocab].
  // (Not named `mode`: torch.compile's dispatch-mode redirection reserves that keyword.)
  m.def("forward(__torch__.torch.classes.blockbatch.Model model, Tensor tokens, Tensor positions, "
        "Tensor cu_seqlens, Tensor(a!)? kv=None, Tensor? kv_rows=None, Tensor? prefix_lens=None, "
        "str kv_mode=\"full\", Tensor? logit_index=None) -> Tensor");
  // RMSNorm in float32: x * rsqrt(mean(x^2) + eps), rounded to x's dtype, times weight.
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  // The residual add and the next RMSNorm: x += delta in place (rounded to x's dtype), then
  // rms_norm(x, weight). One CUDA kernel (a layer's two adds stop being launches of their own);
  // on CPU add_ then rms_norm.
  m.def("add_rms_norm_(Tensor(a!) x, Tensor delta, Tensor weight, float eps) -> Tensor");
  // SwiGLU activation: silu(gate) * up over a fused [rows, 2m] gate|up GEMM output.
  m.def("silu_mul(Tensor gate_up) -> Tensor");
  // x @ weight.T (x [rows, in], weight [out, in], one dtype): ATen's GEMM, or on CUDA for at most 64
  // rows the weight-streaming kernel when BLOCKBATCH_GEMM=stream (csrc/kernels/cuda/linear.cu).
  m.def("linear(Tensor x, Tensor weight) -> Tensor");
  // In-place rotate-half RoPE of x [T, heads, head_dim] at absolute positions (float32 math).
  m.def("rope_(Tensor(a!) x, Tensor positions, Tensor cos_sin) -> ()");
  // Write fresh K/V [T, kv_heads, head_dim] into their position slots of per-row KV buffers.
  m.def("kv_write_(Tensor(a!) kv, Tensor k, Tensor v, Tensor positions, Tensor cu_seqlens, Tensor kv_rows, "
        "int layer) -> ()");
  // rope_ on q and k, then kv_write_ of the rotated k and v: one CUDA kernel (a layer's three
  // small launches and a second read of k become one pass); on CPU the two ops in sequence.
  m.def("rope_kv_write_(Tensor(a!) q, Tensor(b!) k, Tensor v, Tensor positions, Tensor cos_sin, Tensor(c!) kv, "
        "Tensor cu_seqlens, Tensor kv_rows, int layer) -> ()");
  // Packed varlen bidirectional attention: each row's queries attend to the first cache_lens[r]
  // slots of its KV row, then (attend_fresh) to its own fresh K/V. GQA by head grouping.
  m.def("packed_attention(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens, Tensor? kv, Tensor? kv_rows, "
        "Tensor? cache_lens, int layer, bool attend_fresh) -> Tensor");
  // Proposal + confidence per row: argmax over ids != exclude (the mask id; lowest id on ties)
  // and its softmax probability (float64), without materialising probabilities (ALGORITHMS.md 1).
  m.def("confidence(Tensor logits, int exclude=-1) -> (Tensor argmax, Tensor conf)");
  // BlockBatch's sparse probability map: per row, the (at most max_k) tokens whose softmax
  // probability exceeds floor (ALGORITHMS.md 4); ids padded with -1.
  m.def("sparse_probs(Tensor logits, float floor, int max_k) -> (Tensor ids, Tensor probs)");
}

TORCH_LIBRARY_IMPL(blockbatch, CPU, m) {
  m.impl("forward", &model_forward);
  m.impl("rms_norm", &rms_norm_cpu);
  m.impl("add_rms_norm_", &add_rms_norm_cpu);
  m.impl("silu_mul", &silu_mul_cpu);
  m.impl("linear", &linear_cpu);
  m.impl("rope_", &rope_cpu);
  m.impl("kv_write_", &kv_write_cpu);
  m.impl("rope_kv_write_", &rope_kv_write_cpu);
  m.impl("packed_attention", &packed_attention_cpu);
  m.impl("confidence", &confidence_cpu);
  m.impl("sparse_probs", &sparse_probs_cpu);
}

TORCH_LIBRARY_IMPL(blockbatch, Meta, m) {
  m.impl("forward", &model_forward_meta);
}

TORCH_LIBRARY_IMPL(blockbatch, CUDA, m) {
  m.impl("forward", &model_forward);  // device-agnostic: calls the CUDA kernel ops
}

}  // namespace blockbatch
