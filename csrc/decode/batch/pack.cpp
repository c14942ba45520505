#include "decode/batch/pack.h"

#include "decode/step.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/full.h>
#include <ATen/ops/tensor.h>
#include <c10/core/StreamGuard.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <map>
#include <utility>
#include <vector>

#include <unistd.h>

#ifdef BLOCKBATCH_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <cuda_runtime_api.h>
#include <c10/cuda/CUDAGuard.h>

#include "decode/cuda_streams.h"
#endif

namespace blockbatch {

std::optional<c10::Stream> default_stream_of(c10::Device device) {
  if (device.is_cpu()) return std::nullopt;
  return c10::Stream(c10::Stream::DEFAULT, device);
}

int64_t pack_bucket(int64_t n) {
  if (n <= 8) return 8;
  int64_t p = 8;
  while (2 * p < n) p *= 2;                      // p < n <= 2p
  const int64_t step = p >= 64 ? p / 4 : p / 2;  // at most a quarter of padding past 64, half below
  return p + (n - p + step - 1) / step * step;
}

#ifdef BLOCKBATCH_WITH_CUDA
// The packed step's graphs, one per (mode, KV or none, token / row / logit-row buckets). They share
// one memory pool and replay one after another, in any order; each keeps its static inputs and its
// logits, which are copied out after each replay (below).
struct PackedForward::Graphs {
  static constexpr int64_t kMaxGraphs = 24;  // beyond: eager (each graph keeps its logits alive)
  struct Entry {
    int64_t seen = 0;
    std::unique_ptr<at::cuda::CUDAGraph> graph;
    ForwardBatch in;    // the static inputs the graph reads, filled before each replay
    at::Tensor logits;  // its output
  };
  c10::cuda::CUDAStream side;  // captures cannot run on the default stream
  decltype(at::cuda::graph_pool_handle()) pool;
  std::map<std::array<int64_t, 5>, Entry> entries;

  explicit Graphs(c10::Device device)
      : side(c10::cuda::getStreamFromPool(false, device.index())), pool(at::cuda::graph_pool_handle()) {}
  ~Graphs() {
    side.synchronize();  // no replay may still run when the graphs and their pool are released
    entries.clear();
  }
};
#else
struct PackedForward::Graphs {};
#endif

int64_t device_memory_bytes(c10::Device device) {
#ifdef BLOCKBATCH_WITH_CUDA
  if (device.is_cuda()) {
    // The runtime's own query: ATen/cuda/CUDAContext.h would pull in the cuBLAS / cuSPARSE headers.
    cudaDeviceProp prop{};
    const int index = device.index() < 0 ? c10::cuda::current_device() : device.index();
    return cudaGetDeviceProperties(&prop, index) == cudaSuccess ? static_cast<int64_t>(prop.totalGlobalMem) : 0;
  }
#endif
  if (!device.is_cpu()) return 0;
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : 0;
}

PackedForward::PackedForward(const Network& model, KvPool& pool, bool pad, bool graphs)
    : model_(model), pool_(pool), pad_(pad || graphs) {
#ifdef BLOCKBATCH_WITH_CUDA
  if (graphs && model.device().is_cuda()) graphs_ = std::make_unique<Graphs>(model.device());
#else
  (void)graphs;
#endif
}

PackedForward::~PackedForward() = default;

void PackedForward::run(std::vector<Entry>& entries) {
  // Groups: one packed forward per (mode, KV buffer or none, gathered key sets or ranges), in the
  // order of the entries.
  std::vector<std::vector<Entry*>> groups;
  for (Entry& e : entries) {
    auto same = [&](const std::vector<Entry*>& g) {
      const ForwardBatch& f = *g.front()->batch;
      // A forward with per-layer key lists, a query capture or a row pruning (DUET) runs alone: its layouts
      // do not concatenate (and a pruning decides on its own rows).
      auto alone = [](const ForwardBatch& x) {
        return x.key_layers > 1 || x.query_capture.defined() || static_cast<bool>(x.row_keep);
      };
      if (alone(f) || alone(*e.batch)) return false;
      return f.mode == e.batch->mode && f.kv.defined() == e.batch->kv.defined() &&
             f.key_index.defined() == e.batch->key_index.defined();
    };
    auto it = std::find_if(groups.begin(), groups.end(), same);
    if (it == groups.end()) groups.push_back({&e});
    else it->push_back(&e);
  }
  for (const auto& group : groups) {
    try {
      ForwardBatch packed;
      const ForwardBatch& first = *group.front()->batch;
      packed.mode = first.mode;
      packed.key_layers = first.key_layers;  // > 1 or a capture: a group of one (above)
      packed.query_capture = first.query_capture;
      packed.row_keep_layer = first.row_keep_layer;
      packed.row_keep = first.row_keep;
      const bool with_kv = first.kv.defined(), with_lists = first.key_index.defined();
      std::vector<at::Tensor> tokens, positions, cu{first.cu_seqlens.narrow(0, 0, 1)}, rows, lens, prefix, logit;
      std::vector<at::Tensor> key_offsets, key_index;
      if (with_lists) key_offsets.push_back(first.key_offsets.narrow(0, 0, 1));
      std::vector<int64_t> counts;
      int64_t tok_off = 0, key_off = 0;
      bool bounded = true;
      for (const Entry* e : group) {
        const ForwardBatch& b = *e->batch;
        const int64_t T = b.tokens.size(0), R = b.cu_seqlens.size(0) - 1;
        const auto idx = b.tokens.options();
        tokens.push_back(b.tokens);
        positions.push_back(b.positions);
        cu.push_back(b.cu_seqlens.narrow(0, 1, R) + tok_off);
        int64_t bound = b.max_positions;
        if (with_kv) {
          rows.push_back((b.kv_rows.defined() ? b.kv_rows : at::arange(R, idx)) + e->kv_first);
          lens.push_back(b.kv_lens.defined() ? b.kv_lens : at::full({R}, e->length, idx));
          if (bound <= 0) bound = e->length;
        }
        if (b.mode == KvMode::kPrefix) prefix.push_back(b.prefix_lens);
        if (with_lists) {  // positions stay the request's own (KV rows are offset above)
          key_offsets.push_back(b.key_offsets.narrow(0, 1, R) + key_off);
          key_index.push_back(b.key_index);
          key_off += b.key_index.size(0);
        }
        const at::Tensor li = b.logit_index.defined() ? b.logit_index : at::arange(T, idx);
        logit.push_back(li + tok_off);
        counts.push_back(li.size(0));
        bounded = bounded && bound > 0;
        packed.max_positions = std::max(packed.max_positions, bound);
        tok_off += T;
      }
      if (!bounded) packed.max_positions = 0;  // some request gave no bound: the model finds it
      packed.tokens = at::cat(tokens);
      packed.positions = at::cat(positions);
      packed.cu_seqlens = at::cat(cu);
      packed.logit_index = at::cat(logit);
      if (with_kv) {
        packed.kv = pool_.tensor();
        packed.kv_pages = pool_.table();  // undefined for a dense pool
        packed.kv_write_pages = pool_.write_table();
        packed.kv_rows = at::cat(rows);
        packed.kv_lens = at::cat(lens);
      }
      if (packed.mode == KvMode::kPrefix) packed.prefix_lens = at::cat(prefix);
      if (with_lists) {
        packed.key_offsets = at::cat(key_offsets);
        packed.key_index = at::cat(key_index);
      }
      int64_t n_logits = 0;
      for (int64_t c : counts) n_logits += c;
      const at::Tensor logits = run_packed(packed, n_logits);
      int64_t off = 0;
      for (size_t i = 0; i < group.size(); ++i) {
        group[i]->logits = logits.narrow(0, off, counts[i]);
        off += counts[i];
      }
    } catch (...) {
      for (Entry* e : group) e->error = std::current_exception();
    }
  }
}

at::Tensor PackedForward::run_packed(ForwardBatch& b, int64_t n) {
  if (!pad_ || b.key_layers > 1 || b.query_capture.defined() || b.row_keep) return model_.forward(b);
  // Buckets: the tokens' first, then rows enough for the pad tokens in dummy rows of at most
  // kDummyTokens, each with at least one token (else a larger token bucket). A pack that already
  // fills its buckets runs as it is (16 requests of 32 queries: 512 tokens, not 768).
  const int64_t T = b.tokens.size(0), R = b.cu_seqlens.size(0) - 1;
  int64_t Tb = pack_bucket(T), Rb = 0;
  for (;;) {
    Rb = pack_bucket(R + (Tb - T + kDummyTokens - 1) / kDummyTokens);
    if (Rb - R <= Tb - T) break;
    Tb = pack_bucket(Tb + 1);
  }
  const int64_t P = Tb - T, D = Rb - R, Nb = pack_bucket(n);
  const bool with_kv = b.kv.defined(), prefix = b.mode == KvMode::kPrefix, with_lists = b.key_index.defined();
  // The dummy rows as packed queries (step.h's one layout, one host-to-device copy), appended to
  // the pack: their gather entries are the pad token itself (0), their cu_seqlens continue the
  // pack's, their keys are their own (dual: kv_lens / key lists of their own slots; prefix: none).
  PackedQueries pad;
  if (with_lists) pad.key_offsets.push_back(0);  // D + 1 offsets, even for no dummy row
  for (int64_t j = 0; j < D; ++j) {
    const int64_t len = P / D + (j < P % D ? 1 : 0);  // in [1, kDummyTokens]
    pad.add_positions(0, len, pool_.scratch_row());
    if (with_kv) pad.kv_lens.push_back(len);
    if (prefix) pad.prefix_lens.push_back(0);
    if (with_lists) {
      std::vector<int64_t> own;
      for (int64_t i = 0; !prefix && i < len; ++i) own.push_back(i);
      pad.add_keys(own);
    }
  }
  std::fill(pad.gather.begin(), pad.gather.end(), 0);  // the pad token
  for (int64_t& c : pad.cu_seqlens) c += T;
  const int64_t n_keys = with_lists ? b.key_index.size(0) : 0;
  for (int64_t& o : pad.key_offsets) o += n_keys;
  pad.logit_index.assign(static_cast<size_t>(Nb - n), 0);  // any real token: these rows are dropped
  const ForwardBatch d = pad.views(at::tensor(pad.host_buffer(b.mode), b.tokens.options()), b.mode);
  b.tokens = at::cat({b.tokens, d.tokens});
  b.positions = at::cat({b.positions, d.positions});
  b.cu_seqlens = at::cat({b.cu_seqlens, d.cu_seqlens.narrow(0, 1, D)});
  if (with_kv) {
    b.kv_rows = at::cat({b.kv_rows, d.kv_rows});
    b.kv_lens = at::cat({b.kv_lens, d.kv_lens});
  }
  if (prefix) b.prefix_lens = at::cat({b.prefix_lens, d.prefix_lens});
  if (with_lists) {
    b.key_offsets = at::cat({b.key_offsets, d.key_offsets.narrow(0, 1, D)});
    b.key_index = at::cat({b.key_index, d.key_index});
  }
  b.logit_index = at::cat({b.logit_index, d.logit_index});
  b.max_positions = pool_.max_length();  // every canvas fits the pool's rows
  ++padded_;
#ifdef BLOCKBATCH_WITH_CUDA
  if (graphs_ && !with_lists) {  // key lists vary in size from step to step: eager
    Graphs& g = *graphs_;
    const std::array<int64_t, 5> key{static_cast<int64_t>(b.mode), with_kv ? 1 : 0, Tb, Rb, Nb};
    auto found = g.entries.find(key);
    if (found == g.entries.end() && captures_ < Graphs::kMaxGraphs)
      found = g.entries.emplace(key, Graphs::Entry{}).first;
    if (found != g.entries.end()) {
      Graphs::Entry& e = found->second;
      e.seen += 1;
      const c10::cuda::CUDAStream main = c10::cuda::getCurrentCUDAStream(model_.device().index());
      // e.seen >= 2: its first use ran eagerly (below): cuBLAS and the kernels are warm
      if (!e.graph && e.seen >= 2 && captures_ < Graphs::kMaxGraphs) {
        e.in = b;
        for (at::Tensor* t : {&e.in.tokens, &e.in.positions, &e.in.cu_seqlens, &e.in.kv_rows, &e.in.kv_lens,
                              &e.in.prefix_lens, &e.in.logit_index}) {
          if (t->defined()) *t = t->clone();
        }
        stream_wait(g.side, main);
        const c10::cuda::CUDAStreamGuard on_side(g.side);
        e.graph = std::make_unique<at::cuda::CUDAGraph>();
        // Thread-local capture: the requests' threads may queue work on the default stream meanwhile.
        e.graph->capture_begin(g.pool, cudaStreamCaptureModeThreadLocal);
        e.logits = model_.forward(e.in);
        e.graph->capture_end();
        ++captures_;
      }
      if (e.graph) {
        const std::pair<at::Tensor*, const at::Tensor*> inputs[] = {
            {&e.in.tokens, &b.tokens},          {&e.in.positions, &b.positions}, {&e.in.cu_seqlens, &b.cu_seqlens},
            {&e.in.kv_rows, &b.kv_rows},        {&e.in.kv_lens, &b.kv_lens},     {&e.in.prefix_lens, &b.prefix_lens},
            {&e.in.logit_index, &b.logit_index}};
        for (const auto& [dst, src] : inputs) {
          if (dst->defined()) dst->copy_(*src);
        }
        stream_wait(g.side, main);
        {
          const c10::cuda::CUDAStreamGuard on_side(g.side);
          e.graph->replay();
        }
        stream_wait(main, g.side);
        ++replays_;
        // A copy, made on the default stream before the next replay can start: the graphs share one
        // memory pool and replay in any order, so a graph captured before this one may have been
        // given this graph's logits' memory for its own intermediates, and a later replay in the
        // same step (another KV mode's group) would overwrite them before the requests read them.
        return e.logits.narrow(0, 0, n).clone();
      }
    }
  }
#endif
  return model_.forward(b).narrow(0, 0, n);
}

}  // namespace blockbatch
